package loadgen

import (
	"bytes"
	"errors"
	"testing"

	"github.com/tlgate/tlgate/enginesim/tokenizer"
)

// TestBuildMix checks the mixed workload: about the asked share of long
// prompts, every prompt within its class's lengths (in the reference
// tokenizer's tokens, the chat template's and a few words' split into
// more than one token beside) and answered with
// its class's max_tokens, all streamed and of their own, reproducibly.
func TestBuildMix(t *testing.T) {
	c := MixConfig{Requests: 200, Model: "m", LongShare: 0.3, LongTokens: [2]int{2048, 4096}, ChatTokens: [2]int{64, 128},
		LongMaxTokens: 16, ChatMaxTokens: 32, Seed: 3}
	m, err := BuildMix(c)
	if err != nil {
		t.Fatal(err)
	}
	tok := tokenizer.Default()
	longs := 0
	firsts := map[string]bool{}
	for i, r := range m.Requests {
		d := decodeBody(t, r)
		if !r.Stream || !d.Stream || r.Prefix != -1 || r.After != 0 || d.Model != "m" || len(d.Messages) != 1 {
			t.Fatalf("request %d: %+v", i, d)
		}
		n := len(tok.Encode(tokenizer.RenderChat([]tokenizer.Message{{Role: "user", Content: d.Messages[0].Content}})))
		span, maxTokens := c.ChatTokens, c.ChatMaxTokens
		if m.Long[i] {
			span, maxTokens = c.LongTokens, c.LongMaxTokens
			longs++
		}
		if n < span[0] || n > span[1]+span[1]/20+8 || d.MaxTokens != maxTokens {
			t.Errorf("request %d (long %v): %d prompt tokens, max_tokens %d; want %v and %d", i, m.Long[i], n, d.MaxTokens, span, maxTokens)
		}
		first := d.Messages[0].Content[:min(40, len(d.Messages[0].Content))]
		if firsts[first] {
			t.Errorf("request %d opens like an earlier one: %q", i, first)
		}
		firsts[first] = true
	}
	if longs < 40 || longs > 80 {
		t.Errorf("%d long prompts of 200, want about 60", longs)
	}
	if m.MeanLongTokens < 2048 || m.MeanLongTokens > 4096*1.05+8 || m.MeanChatTokens < 64 || m.MeanChatTokens > 128*1.05+8 {
		t.Errorf("means %.0f and %.0f", m.MeanLongTokens, m.MeanChatTokens)
	}
	again, _ := BuildMix(c)
	for i := range m.Requests {
		if !bytes.Equal(m.Requests[i].Body, again.Requests[i].Body) {
			t.Fatalf("request %d differs between two builds", i)
		}
	}
	for _, bad := range []MixConfig{
		{},
		{Requests: 1, LongShare: 2, LongTokens: [2]int{1, 2}, ChatTokens: [2]int{1, 2}, LongMaxTokens: 1, ChatMaxTokens: 1},
		{Requests: 1, LongTokens: [2]int{5, 2}, ChatTokens: [2]int{1, 2}, LongMaxTokens: 1, ChatMaxTokens: 1},
		{Requests: 1, LongTokens: [2]int{1, 2}, ChatTokens: [2]int{1, 2}, ChatMaxTokens: 1},
	} {
		if _, err := BuildMix(bad); !errors.Is(err, ErrWorkload) {
			t.Errorf("BuildMix(%+v) = %v, want ErrWorkload", bad, err)
		}
	}
}
