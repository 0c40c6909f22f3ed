package loadgen

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"

	"github.com/tlgate/tlgate/enginesim/tokenizer"
)

// buildLong builds the MultiTurn and RAG workloads (Build checked the
// number share).
func buildLong(c WorkloadConfig) (*Workload, error) {
	switch {
	case c.Requests < 1:
		return nil, fmt.Errorf("%w: %d requests", ErrWorkload, c.Requests)
	case c.SystemBytes < 1 || c.UserBytes < 1 || c.MaxTokens < 1:
		return nil, fmt.Errorf("%w: system %d bytes, user %d bytes, max_tokens %d must be positive", ErrWorkload, c.SystemBytes, c.UserBytes, c.MaxTokens)
	case c.StreamFraction < 0 || c.StreamFraction > 1:
		return nil, fmt.Errorf("%w: stream fraction %v outside [0, 1]", ErrWorkload, c.StreamFraction)
	case c.Kind == MultiTurn && (c.Conversations < 1 || c.AnswerBytes < 1):
		return nil, fmt.Errorf("%w: multi-turn needs conversations (%d) and answer bytes (%d) >= 1", ErrWorkload, c.Conversations, c.AnswerBytes)
	case c.Kind == RAG && (c.Documents < 1 || c.DocumentBytes < 1):
		return nil, fmt.Errorf("%w: rag needs documents (%d) and document bytes (%d) >= 1", ErrWorkload, c.Documents, c.DocumentBytes)
	}
	rng := rand.New(rand.NewPCG(c.Seed, 0x6c6f6e67))
	tok := tokenizer.Default()
	words := newWords(tok, c.NumberShare)
	w := &Workload{Requests: make([]Request, 0, c.Requests)}
	var tokens int
	add := func(msgs []chatMessage, prefix, after int) error {
		stream := rng.Float64() < c.StreamFraction
		b := chatBody{Model: c.Model, Messages: msgs, MaxTokens: c.MaxTokens, Seed: rng.Uint64() >> 1, Stream: stream}
		body, err := json.Marshal(&b)
		if err != nil {
			return fmt.Errorf("loadgen: encode request: %w", err)
		}
		w.Requests = append(w.Requests, Request{Path: ChatPath, Body: body, Stream: stream, Prefix: prefix, After: after})
		tm := make([]tokenizer.Message, len(msgs))
		for i, m := range msgs {
			tm[i] = tokenizer.Message{Role: m.Role, Content: m.Content}
		}
		tokens += len(tok.Encode(tokenizer.RenderChat(tm)))
		return nil
	}
	switch c.Kind {
	case MultiTurn:
		convs := make([][]chatMessage, c.Conversations)
		last := make([]int, c.Conversations)  // 1 + index of the previous turn
		sys := words.text(rng, c.SystemBytes) // the application's, shared
		for i := range convs {
			convs[i] = []chatMessage{{Role: "system", Content: sys}}
		}
		order := make([]int, c.Conversations)
		for i := range order {
			order[i] = i
		}
		for len(w.Requests) < c.Requests {
			rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
			for _, k := range order {
				if len(w.Requests) == c.Requests {
					break
				}
				if last[k] > 0 {
					convs[k] = append(convs[k], chatMessage{Role: "assistant", Content: words.text(rng, c.AnswerBytes)})
				}
				convs[k] = append(convs[k], chatMessage{Role: "user", Content: words.text(rng, c.UserBytes)})
				if err := add(convs[k], -1, last[k]); err != nil {
					return nil, err
				}
				last[k] = len(w.Requests)
			}
		}
	case RAG:
		sys := words.text(rng, c.SystemBytes)
		docs := make([]string, c.Documents) // each as its questions quote it
		var docTokens int
		for i := range docs {
			docs[i] = "Document:\n" + words.text(rng, c.DocumentBytes)
			docTokens += len(tok.Encode(tokenizer.RenderChat([]tokenizer.Message{{Role: "system", Content: sys}, {Role: "user", Content: docs[i]}})))
		}
		w.DocumentTokens = float64(docTokens) / float64(len(docs))
		for range c.Requests {
			d := rng.IntN(len(docs))
			msgs := []chatMessage{{Role: "system", Content: sys}, {Role: "user", Content: docs[d] + "\n\nQuestion: " + words.text(rng, c.UserBytes)}}
			if err := add(msgs, d, 0); err != nil {
				return nil, err
			}
		}
	}
	w.MeanPromptTokens = float64(tokens) / float64(len(w.Requests))
	if c.Kind == RAG {
		w.SharedFraction = 1
	}
	return w, nil
}
