package probe

import (
	"errors"
	"testing"
)

func TestParseKind(t *testing.T) {
	tests := []struct {
		in   string
		want Kind
		err  bool
	}{
		{in: "vllm", want: KindVLLM},
		{in: " VLLM ", want: KindVLLM},
		{in: "sglang", want: KindSGLang},
		{in: "SGLang", want: KindSGLang},
		{in: "llamacpp", want: KindLlamaCpp},
		{in: "llama.cpp", want: KindLlamaCpp},
		{in: "openai", want: KindOpenAI},
		{in: "", err: true},
		{in: "tgi", err: true},
		{in: "llama", err: true},
	}
	for _, tt := range tests {
		got, err := ParseKind(tt.in)
		if tt.err {
			if !errors.Is(err, ErrUnknownKind) {
				t.Errorf("ParseKind(%q) error = %v, want ErrUnknownKind", tt.in, err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("ParseKind(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
}

func TestKindsAreValid(t *testing.T) {
	for _, k := range Kinds {
		if !k.Valid() {
			t.Errorf("%q.Valid() = false", k)
		}
		if got, err := ParseKind(string(k)); err != nil || got != k {
			t.Errorf("ParseKind(%q) = %q, %v", k, got, err)
		}
	}
	if Kind("tgi").Valid() {
		t.Error(`Kind("tgi").Valid() = true`)
	}
}
