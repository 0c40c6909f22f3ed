package openai

import (
	"encoding/json"
	"errors"
	"math/big"
	"reflect"
	"slices"
	"strings"
	"testing"
)

func ptr[T any](v T) *T { return &v }

func TestParseRequest(t *testing.T) {
	tests := []struct {
		name string
		body string
		chat bool
		want Request
	}{
		{
			name: "chat minimal",
			body: `{"model":"smol","messages":[{"role":"user","content":"hi"}]}`,
			chat: true,
			want: Request{Model: "smol", Chat: true, Prompt: "user\nhi\n", PrefixKey: []byte("user\nhi\n")},
		},
		{
			name: "chat every field",
			body: `{"model":"m","stream":true,"logprobs":true,"top_logprobs":2,"seed":18446744073709551615,
				"temperature":0.5,"top_p":0.9,"top_k":-1,"max_tokens":7,"stop":["a","b"],
				"presence_penalty":0.1,"frequency_penalty":-0.2,
				"messages":[{"role":"system","content":"s"},{"role":"assistant","content":null},
				{"role":"user","content":[{"type":"text","text":"x"},{"type":"image_url","image_url":{"url":"u"}},{"type":"text","text":"y"}]}]}`,
			chat: true,
			want: Request{Model: "m", Stream: true, Chat: true, Logprobs: true, TopLogprobs: ptr(2),
				Seed: ptr(uint64(18446744073709551615)), Temperature: ptr(0.5), TopP: ptr(0.9), TopK: ptr(-1),
				MaxTokens: ptr(7), Stop: []string{"a", "b"}, PresencePenalty: ptr(0.1), FrequencyPenalty: ptr(-0.2),
				Prompt: "system\ns\nassistant\n\nuser\nxy\n", PrefixKey: []byte("system\ns\nassistant\n\nuser\nxy\n")},
		},
		{
			name: "chat max_completion_tokens wins",
			body: `{"model":"m","max_tokens":3,"max_completion_tokens":9,"messages":[{"role":"user","content":""}]}`,
			chat: true,
			want: Request{Model: "m", Chat: true, MaxTokens: ptr(9), Prompt: "user\n\n", PrefixKey: []byte("user\n\n")},
		},
		{
			name: "nulls are absent",
			body: `{"model":"m","prompt":"p","stream":null,"seed":null,"stop":null,"temperature":null,"logprobs":null,"stream_options":null}`,
			want: Request{Model: "m", Prompt: "p", PrefixKey: []byte("p")},
		},
		{
			name: "completions string prompt, stop string, logprobs 0",
			body: `{"model":"m","prompt":"hello","stop":"\n","logprobs":0,"seed":3.0,"max_tokens":16}`,
			want: Request{Model: "m", Prompt: "hello", PrefixKey: []byte("hello"), Stop: []string{"\n"},
				Logprobs: true, LogprobsTop: ptr(0), Seed: ptr(uint64(3)), MaxTokens: ptr(16)},
		},
		{
			name: "completions logprobs false",
			body: `{"model":"m","prompt":"p","logprobs":false,"stream_options":{"include_usage":true,"other":1}}`,
			want: Request{Model: "m", Prompt: "p", PrefixKey: []byte("p"), AsksUsage: true},
		},
		{
			name: "completions prompt array of strings",
			body: `{"model":"m","prompt":["ab","cd"]}`,
			want: Request{Model: "m", Prompt: "abcd", PrefixKey: []byte("abcd")},
		},
		{
			name: "completions token prompt",
			body: `{"model":"m","prompt":[1,2,3]}`,
			want: Request{Model: "m"},
		},
		{
			name: "completions batch of token prompts",
			body: `{"model":"m","prompt":[[1,2],[3]]}`,
			want: Request{Model: "m"},
		},
		{
			name: "unknown fields ignored, chat body's prompt ignored",
			body: `{"model":"m","prompt":5,"user":"u","messages":[{"role":"user","content":"q"}]}`,
			chat: true,
			want: Request{Model: "m", Chat: true, Prompt: "user\nq\n", PrefixKey: []byte("user\nq\n")},
		},
		{
			name: "long prompt gives a 64-byte key",
			body: `{"model":"m","prompt":"` + long + `"}`,
			want: Request{Model: "m", Prompt: long, PrefixKey: []byte(long[:64])},
		},
		{
			name: "cache_salt",
			body: `{"model":"m","prompt":"p","cache_salt":"tenant-1"}`,
			want: Request{Model: "m", Prompt: "p", PrefixKey: []byte("p"), CacheSalt: "tenant-1"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.want.Endpoint = EndpointCompletions
			if tt.chat {
				tt.want.Endpoint = EndpointChat
			}
			got, err := ParseRequest([]byte(tt.body), tt.chat)
			if err != nil {
				t.Fatalf("ParseRequest: %v", err)
			}
			// The body's layout is TestRequestObject's.
			tt.want.Object, tt.want.parses = got.Object, 1
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("ParseRequest =\n%+v\nwant\n%+v", got, tt.want)
			}
			if key := PrefixKey([]byte(tt.body)); string(key) != string(tt.want.PrefixKey) {
				t.Fatalf("PrefixKey = %q, want Request.PrefixKey %q", key, tt.want.PrefixKey)
			}
		})
	}
}

const long = "You are a helpful assistant. Answer briefly and precisely, and cite your sources when you can."

func TestParseRequestErrors(t *testing.T) {
	tests := []struct {
		name, body string
		chat       bool
		param      string
	}{
		{"not json", `{"model":`, true, ""},
		{"not an object", `["model"]`, true, ""},
		{"not UTF-8", "{\"model\":\"m\xff\",\"prompt\":\"p\"}", false, ""},
		{"empty body", ``, false, ""},
		{"model missing", `{"prompt":"p"}`, false, "model"},
		{"model not a string", `{"model":3,"prompt":"p"}`, false, "model"},
		{"model null", `{"model":null,"prompt":"p"}`, false, "model"},
		{"model empty", `{"model":"","prompt":"p"}`, false, "model"},
		{"model twice", `{"model":"a","model":"b","prompt":"p"}`, false, "model"},
		{"model longer than any id", `{"model":"` + strings.Repeat("m", 257) + `","prompt":"p"}`, false, "model"},
		{"stream not a bool", `{"model":"m","prompt":"p","stream":"yes"}`, false, "stream"},
		{"messages missing", `{"model":"m"}`, true, "messages"},
		{"messages not an array", `{"model":"m","messages":{}}`, true, "messages"},
		{"messages empty", `{"model":"m","messages":[]}`, true, "messages"},
		{"message not an object", `{"model":"m","messages":[{"role":"user","content":"a"},"x"]}`, true, "messages[1]"},
		{"role missing", `{"model":"m","messages":[{"content":"a"}]}`, true, "messages[0].role"},
		{"role empty", `{"model":"m","messages":[{"role":"","content":"a"}]}`, true, "messages[0].role"},
		{"content a number", `{"model":"m","messages":[{"role":"u","content":"a"},{"role":"u","content":"b"},{"role":"u","content":1}]}`, true, "messages[2].content"},
		{"part not an object", `{"model":"m","messages":[{"role":"u","content":["x"]}]}`, true, "messages[0].content[0]"},
		{"part type missing", `{"model":"m","messages":[{"role":"u","content":[{"text":"x"}]}]}`, true, "messages[0].content[0].type"},
		{"text part without text", `{"model":"m","messages":[{"role":"u","content":[{"type":"text","text":1}]}]}`, true, "messages[0].content[0].text"},
		{"prompt missing", `{"model":"m"}`, false, "prompt"},
		{"prompt null", `{"model":"m","prompt":null}`, false, "prompt"},
		{"prompt a number", `{"model":"m","prompt":1}`, false, "prompt"},
		{"prompt empty array", `{"model":"m","prompt":[]}`, false, "prompt"},
		{"prompt mixed array", `{"model":"m","prompt":["a",1]}`, false, "prompt[1]"},
		{"prompt negative token", `{"model":"m","prompt":[1,-2]}`, false, "prompt[1]"},
		{"prompt bad token batch", `{"model":"m","prompt":[[1],[2.5]]}`, false, "prompt[1]"},
		{"temperature a string", `{"model":"m","prompt":"p","temperature":"hot"}`, false, "temperature"},
		{"top_p a bool", `{"model":"m","prompt":"p","top_p":true}`, false, "top_p"},
		{"top_k a float", `{"model":"m","prompt":"p","top_k":1.5}`, false, "top_k"},
		{"max_tokens negative", `{"model":"m","prompt":"p","max_tokens":-1}`, false, "max_tokens"},
		{"max_completion_tokens a string", `{"model":"m","messages":[{"role":"u"}],"max_completion_tokens":"9"}`, true, "max_completion_tokens"},
		{"stop a number", `{"model":"m","prompt":"p","stop":1}`, false, "stop"},
		{"stop array with a number", `{"model":"m","prompt":"p","stop":["a",2]}`, false, "stop[1]"},
		{"seed negative", `{"model":"m","prompt":"p","seed":-1}`, false, "seed"},
		{"seed too big", `{"model":"m","prompt":"p","seed":18446744073709551616}`, false, "seed"},
		{"seed a string", `{"model":"m","prompt":"p","seed":"1"}`, false, "seed"},
		{"chat logprobs a number", `{"model":"m","messages":[{"role":"u"}],"logprobs":1}`, true, "logprobs"},
		{"completions logprobs negative", `{"model":"m","prompt":"p","logprobs":-1}`, false, "logprobs"},
		{"completions logprobs a string", `{"model":"m","prompt":"p","logprobs":"1"}`, false, "logprobs"},
		{"top_logprobs negative", `{"model":"m","messages":[{"role":"u"}],"top_logprobs":-3}`, true, "top_logprobs"},
		{"presence_penalty an object", `{"model":"m","prompt":"p","presence_penalty":{}}`, false, "presence_penalty"},
		{"frequency_penalty an array", `{"model":"m","prompt":"p","frequency_penalty":[]}`, false, "frequency_penalty"},
		// Keys that equal a field only up to case: an engine decoding JSON
		// case-insensitively would read them as that field.
		{"STREAM upper case", `{"model":"m","prompt":"p","STREAM":true}`, false, "STREAM"},
		{"MODEL beside model", `{"model":"smol","MODEL":"nope","prompt":"p"}`, false, "MODEL"},
		{"Model before model", `{"Model":"nope","model":"smol","prompt":"p"}`, false, "Model"},
		{"stream with a long s", `{"model":"m","prompt":"p","\u017ftream":true}`, false, "\u017ftream"},
		{"top_k with a Kelvin sign", `{"model":"m","prompt":"p","top_\u212a":1}`, false, "top_\u212a"},
		{"Messages in a chat body", `{"model":"m","Messages":[],"messages":[{"role":"u"}]}`, true, "Messages"},
		{"stream_options a string", `{"model":"m","prompt":"p","stream_options":"x"}`, false, "stream_options"},
		{"stream_options.include_usage a number", `{"model":"m","prompt":"p","stream_options":{"include_usage":1}}`, false, "stream_options.include_usage"},
		{"Stream_Options", `{"model":"m","prompt":"p","Stream_Options":{}}`, false, "Stream_Options"},
		{"escaped exact key twice", `{"model":"m","prompt":"p","stre\u0061m":true,"stream":false}`, false, "stream"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseRequest([]byte(tt.body), tt.chat)
			var fe *FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("ParseRequest error = %v, want a *FieldError", err)
			}
			if fe.Param != tt.param {
				t.Fatalf("Param = %q, want %q (msg %q)", fe.Param, tt.param, fe.Msg)
			}
			if fe.Msg == "" {
				t.Fatal("empty Msg")
			}
			if p := fe.ParamOrNil(); (p == nil) != (tt.param == "") || (p != nil && *p != tt.param) {
				t.Fatalf("ParamOrNil = %v, want %q", p, tt.param)
			}
		})
	}
}

// parsers are the edge's request parsers of this package, with the
// fields each reads and its name for max tokens.
var parsers = []struct {
	name   string
	parse  func([]byte) (Request, error)
	fields []string
	maxKey string
	chat   bool
}{
	{"completions", func(b []byte) (Request, error) { return ParseRequest(b, false) }, requestFields, "max_tokens", false},
	{"chat", func(b []byte) (Request, error) { return ParseRequest(b, true) }, requestFields, "max_tokens", true},
	{"responses", ParseResponses, responsesFields, "max_output_tokens", false},
	{"embeddings", ParseEmbeddings, []string{"model", "cache_salt", "input", "encoding_format", "dimensions"}, "", false},
	{"rerank", ParseRerank, []string{"model", "cache_salt", "query", "documents", "top_n"}, "", false},
	{"score", ParseScore, []string{"model", "cache_salt", "text_1", "text_2"}, "", false},
	{"tokenize", ParseTokenize, []string{"model", "cache_salt", "prompt", "messages"}, "", false},
	{"detokenize", ParseDetokenize, []string{"model", "cache_salt", "tokens"}, "", false},
}

// FuzzParseRequestAgrees checks what the edge's parsers of this package
// read against encoding/json's reading of the same body (keys
// case-sensitive, as the engines' JSON readers are): whatever body they
// accept is valid JSON, and the fields that route and limit a request
// (model, stream, seed, max_tokens or its API's name for it, temperature,
// cache_salt, as far as the API has them) hold what a JSON decoder reads
// there, so the gateway never routes one request while the engine serves
// another. It also checks that an accepted body gives none of the fields
// its parser reads twice.
func FuzzParseRequestAgrees(f *testing.F) {
	f.Add([]byte(`{"model":"smol","prompt":"hi","stream":true,"seed":7,"max_tokens":3,"temperature":0.5,"cache_salt":"s"}`), uint8(0))
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":3,"max_completion_tokens":9}`), uint8(1))
	f.Add([]byte(`{"\u006dodel":"a\/b","prompt":["x","y"],"seed":1.0,"max_tokens":2e1}`), uint8(0))
	f.Add([]byte(`{"model":"m","model":"n","prompt":"p"}`), uint8(0))
	f.Add([]byte(`{"model":"m","input":"x","stream":true,"max_output_tokens":4,"cache_salt":"s","temperature":1}`), uint8(2))
	f.Add([]byte(`{"model":"e","input":["a",[1,2]],"cache_salt":"s","dimensions":8}`), uint8(3))
	f.Add([]byte(`{"model":"r","query":"q","documents":["a",{"text":"b"}],"top_n":1}`), uint8(4))
	f.Add([]byte(`{"model":"s","text_1":"a","text_2":["b"]}`), uint8(5))
	f.Add([]byte(`{"model":"t","messages":[{"role":"user","content":"x"}]}`), uint8(6))
	f.Add([]byte(`{"model":"d","tokens":[1,2]}`), uint8(7))
	f.Fuzz(func(t *testing.T, body []byte, api uint8) {
		p := parsers[int(api)%len(parsers)]
		chat, parse, fields, maxKey := p.chat, p.parse, p.fields, p.maxKey
		req, err := parse(body)
		if err != nil {
			return
		}
		if !json.Valid(body) {
			t.Fatalf("%s accepted %q, which is not valid JSON", p.name, body)
		}
		seen := make(map[string]bool)
		raws := make(map[string]json.RawMessage)
		for _, m := range decodeMembers(t, body) {
			if slices.Contains(fields, m.key) {
				if seen[m.key] {
					t.Fatalf("%s accepted %q, which gives %q twice", p.name, body, m.key)
				}
				seen[m.key] = true
			}
			raws[m.key] = json.RawMessage(m.value)
		}
		var want struct {
			Model       string
			Stream      bool
			Temperature *float64
			CacheSalt   string
		}
		for key, dst := range map[string]any{"model": &want.Model, "stream": &want.Stream,
			"temperature": &want.Temperature, "cache_salt": &want.CacheSalt} {
			if raw, ok := raws[key]; ok && slices.Contains(fields, key) {
				if err := json.Unmarshal(raw, dst); err != nil {
					t.Fatalf("%s accepted %q; encoding/json reads its %s %s: %v", p.name, body, key, raw, err)
				}
			}
		}
		if req.Model != want.Model || req.Stream != want.Stream || req.CacheSalt != want.CacheSalt {
			t.Fatalf("%s read %q: model %q stream %v cache_salt %q; encoding/json reads %q %v %q",
				p.name, body, req.Model, req.Stream, req.CacheSalt, want.Model, want.Stream, want.CacheSalt)
		}
		if (req.Temperature == nil) != (want.Temperature == nil) || req.Temperature != nil && *req.Temperature != *want.Temperature {
			t.Fatalf("%s read %q: temperature %v; encoding/json reads %v", p.name, body, deref(req.Temperature), deref(want.Temperature))
		}
		var seed *big.Float
		if req.Seed != nil {
			seed = new(big.Float).SetUint64(*req.Seed)
		}
		if slices.Contains(fields, "seed") && !sameNumber(t, seed, raws["seed"]) {
			t.Fatalf("%s read %q: seed %v; the body's is %s", p.name, body, deref(req.Seed), raws["seed"])
		}
		var maxTokens json.RawMessage // none: the API has no such field
		if maxKey != "" {
			maxTokens = raws[maxKey]
		}
		if raw, ok := raws["max_completion_tokens"]; chat && ok && string(raw) != "null" {
			maxTokens = raw
		}
		var mt *big.Float
		if req.MaxTokens != nil {
			mt = new(big.Float).SetInt64(int64(*req.MaxTokens))
		}
		if !sameNumber(t, mt, maxTokens) {
			t.Fatalf("%s read %q: max tokens %v; the body's is %s", p.name, body, deref(req.MaxTokens), maxTokens)
		}
	})
}

// sameNumber reports whether raw (absent, null or a JSON number) holds
// the number n (nil: none), exactly.
func sameNumber(t *testing.T, n *big.Float, raw json.RawMessage) bool {
	t.Helper()
	if raw == nil || string(raw) == "null" {
		return n == nil
	}
	var num json.Number
	if err := json.Unmarshal(raw, &num); err != nil {
		t.Fatalf("%s: not a number: %v", raw, err)
	}
	f, _, err := big.ParseFloat(string(num), 10, 256, big.ToNearestEven)
	if err != nil {
		t.Fatalf("%s: %v", raw, err)
	}
	return n != nil && f.Cmp(n) == 0
}

func deref[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}

// TestJudgeable: a request whose answer has one choice of its completion's
// tokens alone is judgeable by a cascade step; several prompts (a batch of
// texts or of token-id lists), n above 1 (a number, or vLLM's number in a
// string) or echo are not. Prompts counts a batch's prompts.
func TestJudgeable(t *testing.T) {
	cases := []struct {
		body      string
		judgeable bool
		prompts   int
	}{
		{`{"model":"m","prompt":"hi"}`, true, 1},
		{`{"model":"m","prompt":[1,2,3]}`, true, 1},
		{`{"model":"m","prompt":["hi"]}`, true, 1},
		{`{"model":"m","prompt":[[1,2]]}`, true, 1},
		{`{"model":"m","prompt":["a","b"]}`, false, 2},
		{`{"model":"m","prompt":[[1],[2],[3]]}`, false, 3},
		{`{"model":"m","prompt":"hi","n":1,"echo":false}`, true, 1},
		{`{"model":"m","prompt":"hi","n":2}`, false, 1},
		{`{"model":"m","prompt":"hi","n":"2"}`, false, 1},
		{`{"model":"m","prompt":"hi","echo":true}`, false, 1},
	}
	for _, tc := range cases {
		r, err := ParseRequest([]byte(tc.body), false)
		if err != nil {
			t.Fatalf("%s: %v", tc.body, err)
		}
		if r.Judgeable() != tc.judgeable || r.Prompts() != tc.prompts {
			t.Errorf("%s: judgeable %v, %d prompts; want %v, %d", tc.body, r.Judgeable(), r.Prompts(), tc.judgeable, tc.prompts)
		}
	}
	r, err := ParseRequest([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"n":3}`), true)
	if err != nil || r.Judgeable() {
		t.Fatalf("chat with n 3: judgeable %v (%v)", r.Judgeable(), err)
	}
}

// TestHasMedia: a chat whose messages hold a part that is not text has
// media; text parts, string contents and completions do not.
func TestHasMedia(t *testing.T) {
	cases := []struct {
		body  string
		chat  bool
		media bool
	}{
		{`{"model":"m","messages":[{"role":"user","content":"hi"}]}`, true, false},
		{`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}`, true, false},
		{`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"what is this?"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}]}`, true, true},
		{`{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"AAAA","format":"wav"}}]}]}`, true, true},
		{`{"model":"m","prompt":"a \"type\" of prompt"}`, false, false},
	}
	for _, tc := range cases {
		r, err := ParseRequest([]byte(tc.body), tc.chat)
		if err != nil {
			t.Fatalf("%s: %v", tc.body, err)
		}
		if r.HasMedia() != tc.media {
			t.Errorf("%s: HasMedia %v, want %v", tc.body, r.HasMedia(), tc.media)
		}
	}
}
