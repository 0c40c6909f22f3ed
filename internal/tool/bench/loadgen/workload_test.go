package loadgen

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"
)

func baseConfig(k Kind) WorkloadConfig {
	return WorkloadConfig{Kind: k, Requests: 200, Model: "m", SystemPrompts: 4, SystemBytes: 600, UserBytes: 80,
		MaxTokens: 8, StreamFraction: 0.5, Seed: 7}
}

// decoded is a request body as the engine reads it.
type decoded struct {
	Model    string `json:"model"`
	Messages []struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	} `json:"messages"`
	MaxTokens int  `json:"max_tokens"`
	Stream    bool `json:"stream"`
}

func decodeBody(t *testing.T, r Request) decoded {
	t.Helper()
	var d decoded
	if err := json.Unmarshal(r.Body, &d); err != nil {
		t.Fatalf("body %q: %v", r.Body, err)
	}
	return d
}

func TestBuild(t *testing.T) {
	for _, tc := range []struct {
		kind         Kind
		shared, dist bool // requests opening with a shared / own prompt exist
	}{
		{Shared, true, false},
		{Distinct, false, true},
		{Mixed, true, true},
	} {
		t.Run(string(tc.kind), func(t *testing.T) {
			w, err := Build(baseConfig(tc.kind))
			if err != nil {
				t.Fatal(err)
			}
			if len(w.Requests) != 200 {
				t.Fatalf("%d requests", len(w.Requests))
			}
			systemOf := map[int]string{} // shared prompt index -> its text
			own := map[string]bool{}
			var shared, streamed int
			for _, r := range w.Requests {
				d := decodeBody(t, r)
				if r.Path != ChatPath || d.Model != "m" || d.MaxTokens != 8 || d.Stream != r.Stream || len(d.Messages) != 2 ||
					d.Messages[0].Role != "system" || d.Messages[1].Role != "user" {
					t.Fatalf("request %+v decodes to %+v", r, d)
				}
				if r.Stream {
					streamed++
				}
				sys := d.Messages[0].Content
				if len(sys) < 600 || len(sys) > 700 || len(d.Messages[1].Content) < 80 {
					t.Errorf("system prompt of %d bytes, user message of %d", len(sys), len(d.Messages[1].Content))
				}
				if r.Prefix < 0 {
					if own[sys] {
						t.Errorf("two requests share a system prompt of their own")
					}
					own[sys] = true
					continue
				}
				shared++
				if r.Prefix >= 4 {
					t.Fatalf("prefix %d of 4 system prompts", r.Prefix)
				}
				if prev, ok := systemOf[r.Prefix]; ok && prev != sys {
					t.Errorf("shared prompt %d has two texts", r.Prefix)
				}
				systemOf[r.Prefix] = sys
			}
			if (shared > 0) != tc.shared || (shared < 200) != tc.dist {
				t.Errorf("%d of 200 requests open with a shared prompt", shared)
			}
			if tc.shared && len(systemOf) != 4 {
				t.Errorf("%d shared prompts used, want 4", len(systemOf))
			}
			// The shared prompts must differ within the gateway's 64-byte
			// prefix key ("system\n" and the prompt's first 57 bytes).
			firsts := map[string]bool{}
			for _, s := range systemOf {
				firsts[s[:57]] = true
			}
			if len(firsts) != len(systemOf) {
				t.Errorf("shared prompts share their first 57 bytes")
			}
			if got := w.SharedFraction; got != float64(shared)/200 {
				t.Errorf("SharedFraction %v, counted %d/200", got, shared)
			}
			if streamed < 60 || streamed > 140 {
				t.Errorf("%d of 200 streamed at fraction 0.5", streamed)
			}
			// ~600+80 bytes of words at about one token per word, plus the
			// template: well over 100 tokens, well under 700.
			if w.MeanPromptTokens < 100 || w.MeanPromptTokens > 700 {
				t.Errorf("mean prompt %v tokens", w.MeanPromptTokens)
			}
		})
	}
}

func TestBuildIsReproducible(t *testing.T) {
	a, err := Build(baseConfig(Mixed))
	if err != nil {
		t.Fatal(err)
	}
	b, err := Build(baseConfig(Mixed))
	if err != nil {
		t.Fatal(err)
	}
	for i := range a.Requests {
		if !bytes.Equal(a.Requests[i].Body, b.Requests[i].Body) {
			t.Fatalf("request %d differs between two builds", i)
		}
	}
	c := baseConfig(Mixed)
	c.Seed++
	other, err := Build(c)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(a.Requests[0].Body, other.Requests[0].Body) {
		t.Error("another seed gives the same first request")
	}
}

func TestBuildStreamFractions(t *testing.T) {
	for _, f := range []float64{0, 1} {
		c := baseConfig(Shared)
		c.StreamFraction = f
		w, err := Build(c)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range w.Requests {
			if r.Stream != (f == 1) {
				t.Fatalf("fraction %v: a request with stream=%v", f, r.Stream)
			}
		}
	}
}

func TestBuildErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*WorkloadConfig)
	}{
		{"unknown kind", func(c *WorkloadConfig) { c.Kind = "burst" }},
		{"no requests", func(c *WorkloadConfig) { c.Requests = 0 }},
		{"no shared prompts", func(c *WorkloadConfig) { c.SystemPrompts = 0 }},
		{"empty system prompt", func(c *WorkloadConfig) { c.SystemBytes = 0 }},
		{"empty user message", func(c *WorkloadConfig) { c.UserBytes = 0 }},
		{"no tokens", func(c *WorkloadConfig) { c.MaxTokens = 0 }},
		{"stream fraction above 1", func(c *WorkloadConfig) { c.StreamFraction = 1.5 }},
		{"negative stream fraction", func(c *WorkloadConfig) { c.StreamFraction = -0.1 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := baseConfig(Shared)
			tc.edit(&c)
			if _, err := Build(c); !errors.Is(err, ErrWorkload) {
				t.Errorf("Build: %v, want ErrWorkload", err)
			}
		})
	}
	// Distinct needs no shared prompts.
	c := baseConfig(Distinct)
	c.SystemPrompts = 0
	if _, err := Build(c); err != nil {
		t.Errorf("distinct without shared prompts: %v", err)
	}
}

func TestCompletion(t *testing.T) {
	for _, stream := range []bool{false, true} {
		r := Completion("m", 4, stream)
		var d struct {
			Model     string `json:"model"`
			Prompt    string `json:"prompt"`
			MaxTokens int    `json:"max_tokens"`
			Stream    bool   `json:"stream"`
		}
		if err := json.Unmarshal(r.Body, &d); err != nil {
			t.Fatal(err)
		}
		if r.Path != CompletionsPath || r.Stream != stream || d.Stream != stream || d.Model != "m" || d.MaxTokens != 4 || d.Prompt == "" || r.Prefix != -1 {
			t.Errorf("Completion(m, 4, %v) = %+v decoding to %+v", stream, r, d)
		}
	}
}
