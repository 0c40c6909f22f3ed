package loadgen

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"

	"github.com/tlgate/tlgate/enginesim/tokenizer"
)

// MixConfig is a workload of long prompts mixed with chat, every request
// streamed, every prompt of its own (no prefix is shared, so no prefix
// cache helps): with probability LongShare a request's prompt is drawn
// evenly from LongTokens and answered with LongMaxTokens tokens, else from
// ChatTokens with ChatMaxTokens.
type MixConfig struct {
	Requests int
	Model    string
	// LongShare in [0, 1] is the share of long prompts.
	LongShare float64
	// LongTokens and ChatTokens are the prompts' lengths in the reference
	// tokenizer's tokens, [least, most] (the chat template adds a few).
	LongTokens, ChatTokens [2]int
	// LongMaxTokens and ChatMaxTokens are the answers' max_tokens (the
	// reference engine always generates that many).
	LongMaxTokens, ChatMaxTokens int
	Seed                         uint64
}

// Mix is a built mixed workload.
type Mix struct {
	Requests []Request
	// Long tells which requests have long prompts.
	Long []bool
	// MeanLongTokens and MeanChatTokens are the rendered prompts' mean
	// lengths in the reference engine's tokens, of the long requests and
	// of the chat ones.
	MeanLongTokens, MeanChatTokens float64
}

// BuildMix generates the workload c describes; the same config always
// gives the same requests.
func BuildMix(c MixConfig) (*Mix, error) {
	valid := func(r [2]int) bool { return r[0] >= 1 && r[1] >= r[0] }
	switch {
	case c.Requests < 1:
		return nil, fmt.Errorf("%w: %d requests", ErrWorkload, c.Requests)
	case c.LongShare < 0 || c.LongShare > 1:
		return nil, fmt.Errorf("%w: long share %v outside [0, 1]", ErrWorkload, c.LongShare)
	case !valid(c.LongTokens) || !valid(c.ChatTokens):
		return nil, fmt.Errorf("%w: prompt lengths %v and %v must be [least, most] with 1 <= least <= most", ErrWorkload, c.LongTokens, c.ChatTokens)
	case c.LongMaxTokens < 1 || c.ChatMaxTokens < 1:
		return nil, fmt.Errorf("%w: max_tokens %d and %d must be positive", ErrWorkload, c.LongMaxTokens, c.ChatMaxTokens)
	}
	rng := rand.New(rand.NewPCG(c.Seed, 0x6d6978))
	tok := tokenizer.Default()
	words := newWords(tok, 0)
	m := &Mix{Requests: make([]Request, c.Requests), Long: make([]bool, c.Requests)}
	var longTokens, chatTokens, longs int
	for i := range m.Requests {
		long := rng.Float64() < c.LongShare
		span, maxTokens := c.ChatTokens, c.ChatMaxTokens
		if long {
			span, maxTokens = c.LongTokens, c.LongMaxTokens
		}
		n := span[0] + rng.IntN(span[1]-span[0]+1)
		prompt := words.count(rng, n)
		b := chatBody{Model: c.Model, Messages: []chatMessage{{Role: "user", Content: prompt}},
			MaxTokens: maxTokens, Seed: rng.Uint64() >> 1, Stream: true}
		body, err := json.Marshal(&b)
		if err != nil {
			return nil, fmt.Errorf("loadgen: encode request: %w", err)
		}
		m.Requests[i] = Request{Path: ChatPath, Body: body, Stream: true, Prefix: -1}
		m.Long[i] = long
		t := len(tok.Encode(tokenizer.RenderChat([]tokenizer.Message{{Role: "user", Content: prompt}})))
		if long {
			longTokens += t
			longs++
		} else {
			chatTokens += t
		}
	}
	if longs > 0 {
		m.MeanLongTokens = float64(longTokens) / float64(longs)
	}
	if chats := c.Requests - longs; chats > 0 {
		m.MeanChatTokens = float64(chatTokens) / float64(chats)
	}
	return m, nil
}

// count returns n random words (about n tokens), without a leading space.
func (w words) count(rng *rand.Rand, n int) string {
	var b strings.Builder
	b.Grow(8 * n)
	for range n {
		b.WriteString(w.pieces[rng.IntN(len(w.pieces))])
	}
	return strings.TrimPrefix(b.String(), " ")
}
