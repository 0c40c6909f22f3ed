package openai

import (
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

func TestPrefixKey(t *testing.T) {
	sys := strings.Repeat("S", 80)
	tests := []struct {
		name, body, want string
	}{
		{"chat rendered as role, content, newline",
			`{"model":"m","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}]}`,
			"system\nBe brief.\nuser\nHi\n"},
		{"chat cut at 64 bytes",
			`{"messages":[{"role":"system","content":"` + sys + `"},{"role":"user","content":"Hi"}]}`,
			("system\n" + sys)[:64]},
		{"chat cut inside the second message",
			`{"messages":[{"role":"system","content":"` + sys[:50] + `"},{"role":"user","content":"Hello there"}]}`,
			("system\n" + sys[:50] + "\nuser\nHello there\n")[:64]},
		{"chat content parts, text only",
			`{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"b"}]}]}`,
			"user\nab\n"},
		{"chat null content",
			`{"messages":[{"role":"assistant","content":null},{"role":"user","content":"q"}]}`,
			"assistant\n\nuser\nq\n"},
		{"chat escaped content unescaped",
			`{"messages":[{"role":"user","content":"line\nnext \u00e9"}]}`,
			"user\nline\nnext é\n"},
		{"completions prompt string", `{"model":"m","prompt":"Once upon a time"}`, "Once upon a time"},
		{"completions prompt string cut", `{"prompt":"` + sys + `"}`, sys[:64]},
		{"completions prompt array", `{"prompt":["Once ","upon"]}`, "Once upon"},
		{"completions prompt array cut", `{"prompt":["` + sys[:40] + `","` + strings.Repeat("T", 40) + `"]}`, sys[:40] + strings.Repeat("T", 24)},
		{"token prompt has no text", `{"prompt":[1,2,3]}`, ""},
		{"no prompt", `{"model":"m"}`, ""},
		{"not json", `{"prompt":"x"`, ""},
		{"not an object", `"prompt"`, ""},
		{"malformed message skipped", `{"messages":[1,{"role":"user","content":"k"}]}`, "user\nk\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := PrefixKey([]byte(tt.body))
			if string(got) != tt.want {
				t.Fatalf("PrefixKey = %q, want %q", got, tt.want)
			}
			if len(got) > PrefixKeyLen {
				t.Fatalf("len = %d > %d", len(got), PrefixKeyLen)
			}
		})
	}
}

func FuzzPrefixKey(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}]}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}`,
		`{"prompt":"Once upon a time"}`,
		`{"prompt":["a","b"]}`,
		`{"prompt":[[1,2],[3]]}`,
		`{"messages":[1,{"role":2},{"role":"u","content":{}}]}`,
		`[`, ``, `{"prompt":"\ud800"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		key := PrefixKey(body)
		if len(key) > PrefixKeyLen {
			t.Fatalf("len = %d > %d", len(key), PrefixKeyLen)
		}
		for _, chat := range []bool{false, true} {
			req, err := ParseRequest(body, chat)
			if err != nil {
				continue
			}
			if len(req.PrefixKey) > PrefixKeyLen || !strings.HasPrefix(req.Prompt, string(req.PrefixKey)) {
				t.Fatalf("Request.PrefixKey %q is not the prompt's prefix", req.PrefixKey)
			}
			// A completions body may carry a stray "messages" array, which
			// PrefixKey reads as chat; otherwise both must agree.
			if chat == gjson.GetBytes(body, "messages").IsArray() && string(key) != string(req.PrefixKey) {
				t.Fatalf("chat %v: PrefixKey = %q, Request.PrefixKey = %q", chat, key, req.PrefixKey)
			}
		}
	})
}

// TestRenderContent: chat's messages[i].content and Responses'
// input[i].content read parts by one rule, each with its own field name
// in errors and its own text part types.
func TestRenderContent(t *testing.T) {
	tests := []struct {
		name, content string
		field         string
		textParts     []string
		want          string // rendered
		param         string // the error's param; "" for none
	}{
		{"a string", `"hi"`, "messages", chatTextParts, "hi", ""},
		{"null", `null`, "input", responsesTextParts, "", ""},
		{"absent", ``, "messages", chatTextParts, "", ""},
		{"a number", `3`, "messages", chatTextParts, "", "messages[2].content"},
		{"an object", `{}`, "input", responsesTextParts, "", "input[2].content"},
		{"chat text parts", `[{"type":"text","text":"a"},{"type":"image_url","image_url":{}},{"type":"text","text":"b"}]`, "messages", chatTextParts, "ab", ""},
		{"chat skips Responses' part types", `[{"type":"input_text","text":"a"},{"type":"text","text":"b"}]`, "messages", chatTextParts, "b", ""},
		{"Responses' text part types", `[{"type":"input_text","text":"a"},{"type":"output_text","text":"b"},{"type":"text","text":"c"},{"type":"input_image"}]`, "input", responsesTextParts, "abc", ""},
		{"a part not an object", `["x"]`, "input", responsesTextParts, "", "input[2].content[0]"},
		{"chat: a part without a type", `[{"text":"x"}]`, "messages", chatTextParts, "", "messages[2].content[0].type"},
		{"chat: a number type", `[{"type":1,"text":"x"}]`, "messages", chatTextParts, "", "messages[2].content[0].type"},
		{"Responses: a number type", `[{"type":1,"text":"x"}]`, "input", responsesTextParts, "", "input[2].content[0].type"},
		{"Responses: a null type", `[{"type":null}]`, "input", responsesTextParts, "", "input[2].content[0].type"},
		{"Responses: an array type", `[{"type":["input_text"],"text":"x"}]`, "input", responsesTextParts, "", "input[2].content[0].type"},
		{"a text that is not a string", `[{"type":"output_text","text":1}]`, "input", responsesTextParts, "", "input[2].content[0].text"},
		{"the first error, the rest rendered", `[{"type":"text","text":"a"},{"type":2},{"type":"text","text":3},{"type":"text","text":"b"}]`, "messages", chatTextParts, "ab", "messages[2].content[1].type"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := Renderer{limit: -1}
			c := gjson.Parse(tt.content)
			if tt.content == "" {
				c = gjson.Result{}
			}
			err := renderContent(&r, c, Brackets.Elem(tt.field, 2)+".content", tt.textParts, Brackets)
			if string(r.buf) != tt.want {
				t.Errorf("rendered %q, want %q", r.buf, tt.want)
			}
			switch {
			case tt.param == "" && err != nil:
				t.Fatalf("error %v, want none", err)
			case tt.param != "" && (err == nil || err.Param != tt.param || !strings.HasPrefix(err.Msg, tt.param+" must be")):
				t.Fatalf("error %+v, want one naming %s", err, tt.param)
			}
		})
	}
}
