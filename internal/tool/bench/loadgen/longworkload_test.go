package loadgen

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/tlgate/tlgate/enginesim/tokenizer"
)

func longConfig(k Kind) WorkloadConfig {
	c := baseConfig(k)
	c.Conversations, c.AnswerBytes = 7, 50
	c.Documents, c.DocumentBytes = 5, 900
	return c
}

func TestBuildMultiTurn(t *testing.T) {
	w, err := Build(longConfig(MultiTurn))
	if err != nil {
		t.Fatal(err)
	}
	if len(w.Requests) != 200 || w.MeanPromptTokens <= 0 {
		t.Fatalf("%d requests, mean %v tokens", len(w.Requests), w.MeanPromptTokens)
	}
	// Every turn extends its previous turn by an answer and a user message,
	// and waits for it; the first turns of the 7 conversations wait for
	// nothing.
	firsts := 0
	sys := decodeBody(t, w.Requests[0]).Messages[0].Content
	for i, r := range w.Requests {
		d := decodeBody(t, r)
		if d.Messages[0].Content != sys {
			t.Fatalf("request %d: the conversations do not share the system prompt", i)
		}
		if r.After == 0 {
			firsts++
			if len(d.Messages) != 2 || d.Messages[0].Role != "system" || d.Messages[1].Role != "user" {
				t.Fatalf("first turn %d: %+v", i, d.Messages)
			}
			continue
		}
		if r.After > i {
			t.Fatalf("request %d waits for a later one (%d)", i, r.After-1)
		}
		prev := decodeBody(t, w.Requests[r.After-1])
		if len(d.Messages) != len(prev.Messages)+2 || d.Messages[len(d.Messages)-2].Role != "assistant" || d.Messages[len(d.Messages)-1].Role != "user" {
			t.Fatalf("request %d: %d messages after %d", i, len(d.Messages), len(prev.Messages))
		}
		for j := range prev.Messages {
			if prev.Messages[j] != d.Messages[j] {
				t.Fatalf("request %d rewrites message %d of its previous turn", i, j)
			}
		}
	}
	if firsts != 7 {
		t.Fatalf("%d conversations started, want 7", firsts)
	}
}

func TestBuildRAG(t *testing.T) {
	w, err := Build(longConfig(RAG))
	if err != nil {
		t.Fatal(err)
	}
	docs := map[int]string{}
	var sys string
	for i, r := range w.Requests {
		d := decodeBody(t, r)
		if len(d.Messages) != 2 || r.Prefix < 0 || r.Prefix >= 5 || r.After != 0 {
			t.Fatalf("request %d: prefix %d, %d messages", i, r.Prefix, len(d.Messages))
		}
		if sys == "" {
			sys = d.Messages[0].Content
		}
		doc, _, ok := strings.Cut(d.Messages[1].Content, "\n\nQuestion: ")
		if d.Messages[0].Content != sys || !ok || len(doc) < 900 {
			t.Fatalf("request %d: system prompt shared %v, document of %d bytes", i, d.Messages[0].Content == sys, len(doc))
		}
		if prev, seen := docs[r.Prefix]; seen && prev != doc {
			t.Fatalf("document %d has two texts", r.Prefix)
		}
		docs[r.Prefix] = doc
	}
	if len(docs) != 5 {
		t.Fatalf("%d documents used, want 5", len(docs))
	}
	// DocumentTokens: the mean tokens of the prefix a document's questions
	// share, as the engine renders and tokenizes it.
	tok := tokenizer.Default()
	var sum int
	for _, doc := range docs {
		sum += len(tok.Encode(tokenizer.RenderChat([]tokenizer.Message{{Role: "system", Content: sys}, {Role: "user", Content: doc}})))
	}
	if want := float64(sum) / 5; w.DocumentTokens != want {
		t.Errorf("DocumentTokens %v, want %v", w.DocumentTokens, want)
	}
}

// TestNumberShareDensity: numbers make the text denser in tokens per
// byte, as WorkloadConfig.NumberShare says.
func TestNumberShareDensity(t *testing.T) {
	tok := tokenizer.Default()
	density := func(share float64) float64 {
		c := longConfig(RAG)
		c.DocumentBytes, c.NumberShare = 20000, share
		w, err := Build(c)
		if err != nil {
			t.Fatal(err)
		}
		doc, _, _ := strings.Cut(decodeBody(t, w.Requests[0]).Messages[1].Content, "\n\nQuestion: ")
		return float64(len(doc)) / float64(len(tok.Encode(doc)))
	}
	for _, tc := range []struct {
		share    float64
		min, max float64 // bytes per token
	}{{0, 5, 7}, {0.1, 3.5, 4.5}, {0.2, 2.6, 3.4}} {
		if got := density(tc.share); got < tc.min || got > tc.max {
			t.Errorf("number share %v: %.2f bytes per token, want %v to %v", tc.share, got, tc.min, tc.max)
		}
	}
}

func TestBuildLongErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		kind Kind
		edit func(*WorkloadConfig)
	}{
		{"no conversations", MultiTurn, func(c *WorkloadConfig) { c.Conversations = 0 }},
		{"no answer", MultiTurn, func(c *WorkloadConfig) { c.AnswerBytes = 0 }},
		{"no documents", RAG, func(c *WorkloadConfig) { c.Documents = 0 }},
		{"empty documents", RAG, func(c *WorkloadConfig) { c.DocumentBytes = 0 }},
		{"no requests", RAG, func(c *WorkloadConfig) { c.Requests = 0 }},
		{"stream fraction", MultiTurn, func(c *WorkloadConfig) { c.StreamFraction = 2 }},
		{"number share of one", RAG, func(c *WorkloadConfig) { c.NumberShare = 1 }},
		{"negative number share", MultiTurn, func(c *WorkloadConfig) { c.NumberShare = -0.1 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := longConfig(tc.kind)
			tc.edit(&c)
			if _, err := Build(c); !errors.Is(err, ErrWorkload) {
				t.Errorf("Build: %v, want ErrWorkload", err)
			}
		})
	}
}

// TestRunClosedWaitsForPreviousTurn: with more clients than conversations,
// no turn reaches the engine before its previous turn was answered.
func TestRunClosedWaitsForPreviousTurn(t *testing.T) {
	c := longConfig(MultiTurn)
	c.Requests, c.Conversations = 60, 3
	w, err := Build(c)
	if err != nil {
		t.Fatal(err)
	}
	index := map[string]int{}
	for i, r := range w.Requests {
		index[string(r.Body)] = i
	}
	answered := make([]atomic.Bool, len(w.Requests))
	var mu sync.Mutex
	var early []int
	f := &fakeEngine{}
	url := serve(t, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(rw, err.Error(), http.StatusBadRequest)
			return
		}
		i, ok := index[string(body)]
		if !ok {
			http.Error(rw, "unknown body", http.StatusBadRequest)
			return
		}
		if a := w.Requests[i].After; a > 0 && !answered[a-1].Load() {
			mu.Lock()
			early = append(early, i)
			mu.Unlock()
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		f.ServeHTTP(rw, r)
		answered[i].Store(true)
	}))
	res := RunClosed(context.Background(), newTestClient(t), Fixed(url), Closed{Concurrency: 8, Requests: w.Requests})
	if res.OK != 60 {
		t.Fatalf("OK %d, failed %d (%v)", res.OK, res.Failed, res.Errors)
	}
	if len(early) > 0 {
		t.Fatalf("turns %v were sent before their previous turn was answered", early)
	}
}
