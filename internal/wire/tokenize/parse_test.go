package tokenize

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/tlgate/tlgate/internal/wire/openai"
)

// TestParseTokens: a /tokenize answer's tokens array is read whole;
// anything that is not an array of token ids is an error that says so.
func TestParseTokens(t *testing.T) {
	for _, tc := range []struct {
		name, data string
		want       []uint32
		err        string
	}{
		{"vLLM's answer", `{"count":3,"max_model_len":8192,"tokens":[1, 22,333],"token_strs":null}`, []uint32{1, 22, 333}, ""},
		{"spaces and newlines", "{\"tokens\": [ 0 ,\n\t4294967295\r\n ] }", []uint32{0, 4294967295}, ""},
		{"empty", `{"tokens":[]}`, []uint32{}, ""},
		{"empty with a space", `{"tokens":[ ]}`, []uint32{}, ""},
		{"not JSON", `{"tokens":[1,2`, nil, "not valid JSON"},
		{"not an object", `[1,2]`, nil, "not a JSON object"},
		{"no tokens", `{"count":0}`, nil, "no tokens array"},
		{"null tokens", `{"tokens":null}`, nil, "no tokens array"},
		{"tokens a string", `{"tokens":"1,2"}`, nil, "no tokens array"},
		{"negative", `{"tokens":[1,-2]}`, nil, "not all token ids"},
		{"a fraction", `{"tokens":[1.5]}`, nil, "not all token ids"},
		{"an exponent", `{"tokens":[1e3]}`, nil, "not all token ids"},
		{"too large", `{"tokens":[4294967296]}`, nil, "not all token ids"},
		{"far too large", `{"tokens":[123456789012345678901234]}`, nil, "not all token ids"},
		{"a null", `{"tokens":[1,null]}`, nil, "not all token ids"},
		{"a nested array", `{"tokens":[[1]]}`, nil, "not all token ids"},
		{"a leading zero", `{"tokens":[1,02]}`, nil, "not valid JSON"},
		{"a trailing comma after the tokens", `{"tokens":[1],}`, nil, "not valid JSON"},
		{"a missing comma after the tokens", `{"tokens":[1,2] "count":2}`, nil, "not valid JSON"},
		{"a bad value before the tokens", `{"count":02,"tokens":[1]}`, nil, "not valid JSON"},
		{"tokens only inside a string", `{"a":"\"tokens\":[1]"}`, nil, "no tokens array"},
		{"tokens inside another key's object", `{"a":{"tokens":[1]}}`, nil, "no tokens array"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseTokens([]byte(tc.data))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("parseTokens(%s) = %v, %v; want an error saying %q", tc.data, got, err, tc.err)
				}
				return
			}
			if err != nil || got == nil || !slices.Equal(got, tc.want) {
				t.Fatalf("parseTokens(%s) = %v, %v; want %v", tc.data, got, err, tc.want)
			}
			// A valid answer is read on the fast path, validated once.
			if fast, ok := tokensOfValid([]byte(tc.data)); !ok || !slices.Equal(fast, tc.want) {
				t.Fatalf("tokensOfValid(%s) = %v, %v; want %v", tc.data, fast, ok, tc.want)
			}
		})
	}
}

// FuzzParseTokens: whatever the answer, parseTokens does not panic, and
// tokens it reads are those encoding/json reads.
func FuzzParseTokens(f *testing.F) {
	for _, s := range []string{`{"tokens":[1,2,3]}`, `{"tokens":[]}`, `{"tokens":[4294967295, 0]}`, `{"tokens":[1.0]}`,
		`{"tokens":[-1]}`, `{"tokens":null}`, `{"a":{"tokens":[1]},"tokens":[2]}`, `[]`, `{`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := parseTokens(data)
		if err != nil {
			return
		}
		var tr struct {
			Tokens []uint32 `json:"tokens"`
		}
		if jerr := json.Unmarshal(data, &tr); jerr != nil {
			t.Fatalf("parseTokens read %v from %q, which encoding/json refuses: %v", got, data, jerr)
		}
		if !slices.Equal(got, tr.Tokens) && !twoTokenKeys(data) {
			t.Fatalf("parseTokens read %v from %q, encoding/json %v", got, data, tr.Tokens)
		}
	})
}

// twoTokenKeys reports whether data's object has more than one key that
// encoding/json takes for "tokens" (it folds case, and keeps the last);
// the parser reads the first "tokens".
func twoTokenKeys(data []byte) bool {
	n, other := 0, false
	gjson.ParseBytes(data).ForEach(func(k, _ gjson.Result) bool {
		if strings.EqualFold(k.String(), "tokens") {
			n++
			other = other || k.String() != "tokens"
		}
		return true
	})
	return n > 1 || other
}

// BenchmarkParseTokens reads the answer for a 3,000-token prompt.
//
//	go test -run '^$' -bench ParseTokens ./internal/wire/tokenize/
func BenchmarkParseTokens(b *testing.B) {
	var sb strings.Builder
	sb.WriteString(`{"tokens":[`)
	for i := range 3000 {
		if i > 0 {
			sb.WriteByte(',')
		}
		fmt.Fprint(&sb, (i*7919)%128000)
	}
	sb.WriteString(`],"count":3000,"max_model_len":8192,"token_strs":null}`)
	data := []byte(sb.String())
	b.Run("parseTokens", func(b *testing.B) {
		for b.Loop() {
			if _, err := parseTokens(data); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding/json", func(b *testing.B) {
		for b.Loop() {
			var tr struct {
				Tokens []uint32 `json:"tokens"`
			}
			if err := json.Unmarshal(data, &tr); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkTokenizeBody builds the /tokenize request of a chat request
// with a 12 KB document.
//
//	go test -run '^$' -bench TokenizeBody ./internal/wire/tokenize/
func BenchmarkTokenizeBody(b *testing.B) {
	doc := strings.Repeat("the quick brown fox 12345 jumps over ", 330)
	body := []byte(`{"model":"m","messages":[{"role":"system","content":"You answer from the document."},{"role":"user","content":"Document:\n` +
		doc + `\n\nQuestion: what jumps?"}],"stream":true,"max_tokens":64,"temperature":0.2}`)
	for _, valid := range []bool{false, true} {
		name := "validated here"
		if valid {
			name = "validated at the edge"
		}
		b.Run(name, func(b *testing.B) {
			req := Request{URL: "http://e", Model: "m", Chat: true, Body: body, Valid: valid}
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				s, err := shapeOf(req)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := tokenizeBody(req, &s.fields); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestTokenizeBody: the /tokenize request carries the model and the
// fields that shape the prompt, as the client wrote them (the last of a
// key written twice, as the engine reads it), and nothing else; a chat
// request asks for the generation prompt unless it says otherwise.
func TestTokenizeBody(t *testing.T) {
	for _, tc := range []struct {
		name string
		chat bool
		body string
		want map[string]any
	}{
		{"chat", true, `{"model":"x","messages":[{"role":"user","content":"hi \"there\""}],"stream":true,"tools":[{"type":"function"}],"max_tokens":3}`,
			map[string]any{"model": "m\"1", "messages": []any{map[string]any{"role": "user", "content": "hi \"there\""}}, "tools": []any{map[string]any{"type": "function"}}, "add_generation_prompt": true}},
		{"chat, no generation prompt", true, `{"messages":[],"add_generation_prompt":false,"continue_final_message":true}`,
			map[string]any{"model": "m\"1", "messages": []any{}, "add_generation_prompt": false, "continue_final_message": true}},
		{"a key twice", true, `{"messages":[{"role":"user","content":"a"}],"chat_template":"s","add_generation_prompt":false,"chat_template":"t","add_generation_prompt":true}`,
			map[string]any{"model": "m\"1", "messages": []any{map[string]any{"role": "user", "content": "a"}}, "chat_template": "t", "add_generation_prompt": true}},
		{"completions", false, `{"prompt":"once upon","add_special_tokens":false,"echo":true}`,
			map[string]any{"model": "m\"1", "prompt": "once upon", "add_special_tokens": false}},
		{"completions, one prompt in an array", false, `{"prompt":["once upon"]}`,
			map[string]any{"model": "m\"1", "prompt": "once upon"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := readFields([]byte(tc.body), false)
			if err != nil {
				t.Fatal(err)
			}
			b, err := tokenizeBody(Request{Model: "m\"1", Chat: tc.chat, Body: []byte(tc.body)}, &f)
			if err != nil {
				t.Fatal(err)
			}
			var got map[string]any
			if err := json.Unmarshal(b, &got); err != nil {
				t.Fatalf("%s: %v", b, err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("body %s\nwant %v", b, tc.want)
			}
		})
	}
	if _, err := readFields([]byte(`{"messages":[}`), false); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("a body that is not JSON: %v", err)
	}
	// A body the edge validated is not validated again: readFields
	// trusts the mark (what it then reads of a broken body is undefined).
	if _, err := readFields([]byte(`{"messages":[}`), true); err != nil {
		t.Fatalf("a body marked valid was validated again: %v", err)
	}
}

// FuzzTokenizeBody checks the /tokenize request against encoding/json:
// for any body the edge accepts that can be tokenized for routing, the
// request is valid JSON holding the model, and the fields that shape the
// prompt as a JSON decoder reads them in the client's body (a chat asks
// for the generation prompt unless the client said otherwise; a
// completions prompt given as an array of one string is that string),
// and nothing else: what the engine tokenizes is what it will serve.
func FuzzTokenizeBody(f *testing.F) {
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[],"chat_template":"a","chat_template":"b"}`), true)
	f.Add([]byte(`{"model":"m","prompt":["once"],"add_special_tokens":false,"echo":true}`), false)
	f.Add([]byte(`{"model":"m","prompt":"x","add_special_tokens":1,"add_special_tokens":null}`), false)
	f.Fuzz(func(t *testing.T, body []byte, chat bool) {
		parsed, err := openai.ParseRequest(body, chat)
		if err != nil {
			return
		}
		req := Read(Request{Model: parsed.Model, Chat: chat, Body: body, Valid: true})
		s, err := req.shape()
		if err != nil || s.whole {
			return // not tokenized: routed on the prefix index, or its prompt is token ids
		}
		out, err := tokenizeBody(req, &s.fields)
		if err != nil {
			return
		}
		var got, client map[string]any
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("body %q: /tokenize request %q: %v", body, out, err)
		}
		if err := json.Unmarshal(body, &client); err != nil {
			t.Fatalf("body %q: %v", body, err)
		}
		want := map[string]any{"model": parsed.Model}
		names := []string{"add_special_tokens"}
		if chat {
			names = append([]string{"messages"}, chatFields...)
			want["add_generation_prompt"] = true
		} else if p, ok := client["prompt"].([]any); ok {
			want["prompt"] = p[0]
		} else {
			want["prompt"] = client["prompt"]
		}
		for _, name := range names {
			if v, ok := client[name]; ok {
				want[name] = v
			}
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("body %q: /tokenize request %s, want %v", body, out, want)
		}
	})
}
