package openai

import (
	"testing"

	"github.com/tidwall/gjson"
)

func TestParsePooling(t *testing.T) {
	type parse func([]byte) (Request, error)
	tests := []struct {
		name   string
		parse  parse
		body   string
		ep     Endpoint
		prompt string
		salt   string
		param  string // a refusal's param; "-" for a refusal without one
	}{
		{"embeddings string", ParseEmbeddings, `{"model":"e","input":"hello"}`, EndpointEmbeddings, "hello", "", ""},
		{"embeddings batch", ParseEmbeddings, `{"model":"e","input":["a","b"],"encoding_format":"base64","dimensions":8}`, EndpointEmbeddings, "ab", "", ""},
		{"embeddings tokens", ParseEmbeddings, `{"model":"e","input":[1,2,3]}`, EndpointEmbeddings, "", "", ""},
		{"embeddings token arrays", ParseEmbeddings, `{"model":"e","input":[[1,2],[3]],"user":"u"}`, EndpointEmbeddings, "", "", ""},
		{"embeddings salt", ParseEmbeddings, `{"model":"e","input":"x","cache_salt":"s"}`, EndpointEmbeddings, "x", "s", ""},
		{"embeddings no input", ParseEmbeddings, `{"model":"e"}`, "", "", "", "input"},
		{"embeddings no model", ParseEmbeddings, `{"input":"x"}`, "", "", "", "model"},
		{"embeddings empty string", ParseEmbeddings, `{"model":"e","input":""}`, "", "", "", "input"},
		{"embeddings empty array", ParseEmbeddings, `{"model":"e","input":[]}`, "", "", "", "input"},
		{"embeddings mixed array", ParseEmbeddings, `{"model":"e","input":["a",1]}`, "", "", "", "input[1]"},
		{"embeddings negative token", ParseEmbeddings, `{"model":"e","input":[1,-2]}`, "", "", "", "input[1]"},
		{"embeddings empty token array", ParseEmbeddings, `{"model":"e","input":[[1],[]]}`, "", "", "", "input[1]"},
		{"embeddings object", ParseEmbeddings, `{"model":"e","input":{"a":1}}`, "", "", "", "input"},
		{"embeddings bad format", ParseEmbeddings, `{"model":"e","input":"x","encoding_format":"int8"}`, "", "", "", "encoding_format"},
		{"embeddings zero dimensions", ParseEmbeddings, `{"model":"e","input":"x","dimensions":0}`, "", "", "", "dimensions"},
		{"embeddings model twice", ParseEmbeddings, `{"model":"e","model":"f","input":"x"}`, "", "", "", "model"},
		{"embeddings not JSON", ParseEmbeddings, `{"model":`, "", "", "", "-"},
		{"embeddings not an object", ParseEmbeddings, `["x"]`, "", "", "", "-"},
		{"embeddings model a path", ParseEmbeddings, `{"model":"a/../b","input":"x"}`, "", "", "", "model"},
		{"embeddings salt not a string", ParseEmbeddings, `{"model":"e","input":"x","cache_salt":1}`, "", "", "", "cache_salt"},
		{"rerank", ParseRerank, `{"model":"r","query":"q","documents":["a",{"text":"b"}],"top_n":1}`, EndpointRerank, "qab", "", ""},
		{"rerank no query", ParseRerank, `{"model":"r","documents":["a"]}`, "", "", "", "query"},
		{"rerank no documents", ParseRerank, `{"model":"r","query":"q"}`, "", "", "", "documents"},
		{"rerank empty documents", ParseRerank, `{"model":"r","query":"q","documents":[]}`, "", "", "", "documents"},
		{"rerank bad document", ParseRerank, `{"model":"r","query":"q","documents":["a",3]}`, "", "", "", "documents[1]"},
		{"rerank negative top_n", ParseRerank, `{"model":"r","query":"q","documents":["a"],"top_n":-1}`, "", "", "", "top_n"},
		{"score one to many", ParseScore, `{"model":"r","text_1":"q","text_2":["a","b"]}`, EndpointScore, "qab", "", ""},
		{"score no text_2", ParseScore, `{"model":"r","text_1":"q"}`, "", "", "", "text_2"},
		{"score bad text_1", ParseScore, `{"model":"r","text_1":5,"text_2":"a"}`, "", "", "", "text_1"},
		{"tokenize prompt", ParseTokenize, `{"model":"m","prompt":"hi","add_special_tokens":true}`, EndpointTokenize, "hi", "", ""},
		{"tokenize messages", ParseTokenize, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, EndpointTokenize, "user\nhi\n", "", ""},
		{"tokenize neither", ParseTokenize, `{"model":"m"}`, "", "", "", "prompt"},
		{"tokenize both", ParseTokenize, `{"model":"m","prompt":"a","messages":[{"role":"user","content":"hi"}]}`, "", "", "", "prompt"},
		{"tokenize no model", ParseTokenize, `{"prompt":"a"}`, "", "", "", "model"},
		{"detokenize", ParseDetokenize, `{"model":"m","tokens":[1,2]}`, EndpointDetokenize, "", "", ""},
		{"detokenize bad tokens", ParseDetokenize, `{"model":"m","tokens":["a"]}`, "", "", "", "tokens"},
		{"detokenize no tokens", ParseDetokenize, `{"model":"m"}`, "", "", "", "tokens"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := tt.parse([]byte(tt.body))
			if tt.param != "" {
				fe, ok := err.(*FieldError)
				if !ok {
					t.Fatalf("err = %v, want a *FieldError", err)
				}
				if want := tt.param; want != "-" && fe.Param != want || want == "-" && fe.Param != "" {
					t.Fatalf("param = %q (%s), want %q", fe.Param, fe.Msg, tt.param)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if req.Endpoint != tt.ep || req.Prompt != tt.prompt || req.CacheSalt != tt.salt || req.Model == "" {
				t.Fatalf("req = %+v, want endpoint %q prompt %q salt %q", req, tt.ep, tt.prompt, tt.salt)
			}
			if !req.Endpoint.Pooling() || req.Stream {
				t.Fatalf("%s: Pooling %v Stream %v", req.Endpoint, req.Endpoint.Pooling(), req.Stream)
			}
		})
	}
}

func TestAnswerOK(t *testing.T) {
	tests := []struct {
		ep   Endpoint
		body string
		ok   bool
	}{
		{EndpointCompletions, `{"choices":[]}`, true},
		{"", `{"choices":[]}`, true},
		{EndpointChat, `{"data":[]}`, false},
		{EndpointEmbeddings, `{"object":"list","data":[{"embedding":[0.1]}]}`, true},
		{EndpointEmbeddings, `{"choices":[]}`, false},
		{EndpointScore, `{"data":[]}`, true},
		{EndpointRerank, `{"results":[]}`, true},
		{EndpointRerank, `{"data":[]}`, false},
		{EndpointTokenize, `{"tokens":[1],"count":1}`, true},
		{EndpointTokenize, `{"count":1}`, false},
		{EndpointDetokenize, `{"prompt":"x"}`, true},
		{EndpointDetokenize, `{"prompt":1}`, false},
		{EndpointEmbeddings, `[1]`, false},
	}
	for _, tt := range tests {
		if got := tt.ep.AnswerOK(gjson.Parse(tt.body)); got != tt.ok {
			t.Errorf("%q.AnswerOK(%s) = %v, want %v", tt.ep, tt.body, got, tt.ok)
		}
	}
}
