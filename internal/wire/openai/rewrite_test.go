package openai

import (
	"errors"
	"testing"
)

func TestWithModel(t *testing.T) {
	tests := []struct {
		name, body, model, want string
	}{
		{"replaced, other bytes as sent",
			`{ "model" : "smol-latest",  "messages":[{"role":"user","content":"x","model":"inner"}], "temperature":0.50}`,
			"smol-v3",
			`{ "model" : "smol-v3",  "messages":[{"role":"user","content":"x","model":"inner"}], "temperature":0.50}`},
		{"model after nested model",
			`{"metadata":{"model":"keep"},"model":"a","prompt":"p"}`, "b",
			`{"metadata":{"model":"keep"},"model":"b","prompt":"p"}`},
		{"escaped in JSON", `{"model":"a"}`, "q\"\n\u00e9",
			`{"model":"q\"\n` + "\u00e9" + `"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := []byte(tt.body)
			got, err := WithModel(in, tt.model)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tt.want {
				t.Fatalf("WithModel =\n%s\nwant\n%s", got, tt.want)
			}
			if string(in) != tt.body {
				t.Fatalf("input modified: %s", in)
			}
			req, err := ParseRequest(got, false)
			if err == nil && req.Model != tt.model {
				t.Fatalf("parsed model %q, want %q", req.Model, tt.model)
			}
		})
	}
	if _, err := WithModel([]byte(` [1]`), "m"); !errors.Is(err, ErrNotObject) {
		t.Fatalf("array body: err = %v, want ErrNotObject", err)
	}
}

func TestWithSeed(t *testing.T) {
	tests := []struct{ name, body, want string }{
		{"added", `{"model":"m","prompt":"p"}`, `{"model":"m","prompt":"p","seed":18446744073709551615}`},
		{"replaced", `{"seed": 7 ,"model":"m"}`, `{"seed": 18446744073709551615 ,"model":"m"}`},
		{"null replaced", `{"seed":null}`, `{"seed":18446744073709551615}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := WithSeed([]byte(tt.body), 1<<64-1)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tt.want {
				t.Fatalf("WithSeed = %s, want %s", got, tt.want)
			}
		})
	}
}

func TestWithCacheSalt(t *testing.T) {
	tests := []struct{ name, body, want string }{
		{"added", `{"model":"m","prompt":"p"}`, `{"model":"m","prompt":"p","cache_salt":"tl1-x"}`},
		{"replaced", `{"cache_salt": "mine" ,"model":"m"}`, `{"cache_salt": "tl1-x" ,"model":"m"}`},
		{"null replaced", `{"cache_salt":null}`, `{"cache_salt":"tl1-x"}`},
		{"nested left alone", `{"metadata":{"cache_salt":"keep"},"model":"m"}`, `{"metadata":{"cache_salt":"keep"},"model":"m","cache_salt":"tl1-x"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := WithCacheSalt([]byte(tt.body), "tl1-x")
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tt.want {
				t.Fatalf("WithCacheSalt = %s, want %s", got, tt.want)
			}
		})
	}
	if _, err := WithCacheSalt([]byte(`[1]`), "s"); !errors.Is(err, ErrNotObject) {
		t.Fatalf("an array: %v", err)
	}
}

func TestForceLogprobs(t *testing.T) {
	tests := []struct {
		name, body string
		chat       bool
		want       string
	}{
		{"chat absent", `{"model":"m"}`, true, `{"model":"m","logprobs":true}`},
		{"chat false", `{"logprobs":false,"model":"m"}`, true, `{"logprobs":true,"model":"m"}`},
		{"chat true kept", `{"logprobs":true}`, true, `{"logprobs":true}`},
		{"completions absent", `{"model":"m"}`, false, `{"model":"m","logprobs":0}`},
		{"completions null", `{"logprobs":null}`, false, `{"logprobs":0}`},
		{"completions false", `{"logprobs":false}`, false, `{"logprobs":0}`},
		{"completions 3 kept", `{"logprobs":3}`, false, `{"logprobs":3}`},
		{"completions 0 kept", `{"logprobs": 0}`, false, `{"logprobs": 0}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ForceLogprobs([]byte(tt.body), tt.chat, 0)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tt.want {
				t.Fatalf("ForceLogprobs = %s, want %s", got, tt.want)
			}
		})
	}
	if _, err := ForceLogprobs([]byte(`nope`), false, 0); !errors.Is(err, ErrNotObject) {
		t.Fatalf("err = %v, want ErrNotObject", err)
	}
}

func TestStripLogprobs(t *testing.T) {
	tests := []struct{ name, resp, want string }{
		{"chat",
			`{"id":"x","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"logprobs":{"content":[{"token":"hi","logprob":-0.1}]}},{"index":1,"logprobs":{"content":[]}}],"usage":{}}`,
			`{"id":"x","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"logprobs":null},{"index":1,"logprobs":null}],"usage":{}}`},
		{"completions", `{"choices":[{"text":"a","logprobs":{"tokens":["a"],"token_logprobs":[-1]}}]}`,
			`{"choices":[{"text":"a","logprobs":null}]}`},
		{"absent and null left alone", `{"choices":[{"text":"a"},{"text":"b","logprobs":null}]}`,
			`{"choices":[{"text":"a"},{"text":"b","logprobs":null}]}`},
		{"no choices", `{"error":{"message":"x"}}`, `{"error":{"message":"x"}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := StripLogprobs([]byte(tt.resp))
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tt.want {
				t.Fatalf("StripLogprobs =\n%s\nwant\n%s", got, tt.want)
			}
		})
	}
	if _, err := StripLogprobs([]byte(`{"choices":[`)); !errors.Is(err, ErrInvalidJSON) {
		t.Fatalf("err = %v, want ErrInvalidJSON", err)
	}
}

func TestWithMaxTokens(t *testing.T) {
	for in, want := range map[string]string{
		`{"model":"m"}`:                               `{"model":"m","max_tokens":7}`,
		`{"model":"m","max_tokens":4000}`:             `{"model":"m","max_tokens":7}`,
		`{"max_completion_tokens":90}`:                `{"max_completion_tokens":7}`,
		`{"max_tokens":1,"max_completion_tokens":90}`: `{"max_tokens":7,"max_completion_tokens":7}`,
		`{"max_tokens":null}`:                         `{"max_tokens":7}`,
	} {
		got, err := WithMaxTokens([]byte(in), 7)
		if err != nil || string(got) != want {
			t.Errorf("WithMaxTokens(%s) = %s, %v; want %s", in, got, err, want)
		}
	}
	if _, err := WithMaxTokens([]byte(`[1]`), 7); err == nil {
		t.Error("an array was rewritten")
	}
}

// TestTrimTopLogprobs: each choice's logprobs.content[j].top_logprobs is
// cut to n alternatives, every other byte as sent; answers of another
// shape are left as they are.
func TestTrimTopLogprobs(t *testing.T) {
	tests := []struct {
		name, resp string
		n          int
		want       string
	}{
		{"cut", `{"choices":[{"logprobs":{"content":[{"token":"a","top_logprobs":[{"t":1}, {"t":2}]},{"top_logprobs":[3]}]}}]}`, 1,
			`{"choices":[{"logprobs":{"content":[{"token":"a","top_logprobs":[{"t":1}]},{"top_logprobs":[3]}]}}]}`},
		{"cut to none", `{"choices":[{"logprobs":{"content":[{"top_logprobs":[1,2]}]}}]}`, 0,
			`{"choices":[{"logprobs":{"content":[{"top_logprobs":[]}]}}]}`},
		{"short enough", `{"choices":[{"logprobs":{"content":[{"top_logprobs":[1, 2]}]}}]}`, 2,
			`{"choices":[{"logprobs":{"content":[{"top_logprobs":[1, 2]}]}}]}`},
		{"choices not an array", `{"choices":{"x":{"logprobs":{"content":[{"top_logprobs":[1,2]}]}}}}`, 1,
			`{"choices":{"x":{"logprobs":{"content":[{"top_logprobs":[1,2]}]}}}}`},
		{"content not an array", `{"choices":[{"logprobs":{"content":{"x":{"top_logprobs":[1,2]}}}}]}`, 1,
			`{"choices":[{"logprobs":{"content":{"x":{"top_logprobs":[1,2]}}}}]}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := TrimTopLogprobs([]byte(tt.resp), tt.n)
			if err != nil || string(got) != tt.want {
				t.Fatalf("TrimTopLogprobs = %s, %v; want %s", got, err, tt.want)
			}
		})
	}
	if _, err := TrimTopLogprobs([]byte(`{"choices":`), 1); !errors.Is(err, ErrInvalidJSON) {
		t.Fatalf("invalid JSON: %v", err)
	}
}
