// Package loadgen generates the benchmarks' workloads (shared prompts,
// multi-turn conversations, RAG, long generations) and drives them against
// a set of base URLs with keep-alive clients, in closed or open loops,
// recording time to first token, latency and errors per request.
package loadgen

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"

	"github.com/tlgate/tlgate/enginesim/tokenizer"
)

// Paths of the OpenAI endpoints the workloads use.
const (
	ChatPath        = "/v1/chat/completions"
	CompletionsPath = "/v1/completions"
)

// Request is one request a client sends: a POST of Body to Path.
type Request struct {
	Path   string
	Body   []byte
	Stream bool
	// Header, when set, is sent with the request (an API key, a priority).
	Header http.Header
	// Prefix is the index of the shared system prompt the request opens
	// with (the document, for RAG), or -1 for a prompt of its own.
	Prefix int
	// After is 1 + the index, in its workload, of the request that must
	// have been answered before this one is sent (a conversation's previous
	// turn), or 0.
	After int
}

// Kind names a workload.
type Kind string

// The workloads.
const (
	// Shared: every request opens with one of a few long system prompts,
	// followed by a random user message.
	Shared Kind = "shared"
	// Distinct: every request has a system prompt of its own.
	Distinct Kind = "distinct"
	// Mixed: half shared, half distinct, interleaved at random.
	Mixed Kind = "mixed"
	// MultiTurn: Conversations chats interleaved, all opening with the
	// same system prompt (an application's); every turn's prompt is the
	// previous turn's prompt, its answer and a new user message. Prompts
	// differ only after the system prompt, where a key of the first 64
	// bytes cannot see them.
	MultiTurn Kind = "multi-turn"
	// RAG: one shared system prompt, then one of Documents long documents
	// drawn at random, then a question.
	RAG Kind = "rag"
)

// Kinds lists the workloads in report order.
var Kinds = []Kind{Shared, Distinct, Mixed, MultiTurn, RAG}

// ErrWorkload is wrapped by the errors of an invalid WorkloadConfig.
var ErrWorkload = errors.New("loadgen: invalid workload")

// WorkloadConfig describes a chat workload.
type WorkloadConfig struct {
	Kind     Kind
	Requests int
	Model    string
	// SystemPrompts is the number of shared system prompts (Shared and
	// Mixed); SystemBytes the length of every system prompt (shared or
	// not) and UserBytes of every user message, in bytes of English words.
	SystemPrompts, SystemBytes, UserBytes int
	// MaxTokens is every request's max_tokens.
	MaxTokens int
	// StreamFraction of the requests, drawn at random, are streamed.
	StreamFraction float64
	// Seed makes the workload reproducible.
	Seed uint64
	// Conversations (MultiTurn, >= 1) are interleaved, turn after turn in
	// a new random order each round; AnswerBytes is the length of the
	// assistant message standing in for each turn's answer.
	Conversations, AnswerBytes int
	// Documents (RAG, >= 1) of DocumentBytes each.
	Documents, DocumentBytes int
	// NumberShare, in [0, 1), is the share of the text's words drawn as
	// numbers of 2 to 6 digits instead, which the reference tokenizer
	// reads one token per byte: text with figures, denser in tokens per
	// byte than words alone (about 5.9 bytes per token at 0, 4 at 0.1,
	// 3 at 0.2). 0 keeps the workloads as they were.
	NumberShare float64
}

// Workload is a built list of requests with its figures.
type Workload struct {
	Requests []Request
	// MeanPromptTokens is the mean length of the rendered chat prompts in
	// the reference engine's tokens; SharedFraction the fraction of the
	// requests that open with a shared system prompt.
	MeanPromptTokens float64
	SharedFraction   float64
	// DocumentTokens (RAG) is the mean length, in the reference engine's
	// tokens, of the prefix a document's questions share: the system
	// prompt and the document, as rendered.
	DocumentTokens float64
}

// chatBody is the JSON of one chat completions request.
type chatBody struct {
	Model       string        `json:"model"`
	Messages    []chatMessage `json:"messages"`
	MaxTokens   int           `json:"max_tokens"`
	Temperature float64       `json:"temperature"`
	Seed        uint64        `json:"seed"`
	Stream      bool          `json:"stream,omitempty"`
}

type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// CheckNumberShare reports a WorkloadConfig.NumberShare outside [0, 1).
func CheckNumberShare(s float64) error {
	if !(s >= 0 && s < 1) { // NaN included
		return fmt.Errorf("must be in [0, 1), got %v", s)
	}
	return nil
}

// Build generates the workload c describes. The same config always gives
// the same requests.
func Build(c WorkloadConfig) (*Workload, error) {
	if err := CheckNumberShare(c.NumberShare); err != nil {
		return nil, fmt.Errorf("%w: number share %w", ErrWorkload, err)
	}
	switch {
	case c.Kind == MultiTurn || c.Kind == RAG:
		return buildLong(c)
	case c.Kind != Shared && c.Kind != Distinct && c.Kind != Mixed:
		return nil, fmt.Errorf("%w: kind %q is not shared, distinct, mixed, multi-turn or rag", ErrWorkload, c.Kind)
	case c.Requests < 1:
		return nil, fmt.Errorf("%w: %d requests", ErrWorkload, c.Requests)
	case c.Kind != Distinct && c.SystemPrompts < 1:
		return nil, fmt.Errorf("%w: %d system prompts", ErrWorkload, c.SystemPrompts)
	case c.SystemBytes < 1 || c.UserBytes < 1 || c.MaxTokens < 1:
		return nil, fmt.Errorf("%w: system %d bytes, user %d bytes, max_tokens %d must be positive", ErrWorkload, c.SystemBytes, c.UserBytes, c.MaxTokens)
	case c.StreamFraction < 0 || c.StreamFraction > 1:
		return nil, fmt.Errorf("%w: stream fraction %v outside [0, 1]", ErrWorkload, c.StreamFraction)
	}
	rng := rand.New(rand.NewPCG(c.Seed, 0x6c6f616467656e))
	tok := tokenizer.Default()
	words := newWords(tok, c.NumberShare)
	systems := make([]string, c.SystemPrompts)
	for i := range systems {
		systems[i] = words.text(rng, c.SystemBytes)
	}
	w := &Workload{Requests: make([]Request, c.Requests)}
	var tokens, shared int
	for i := range w.Requests {
		prefix := -1
		if c.Kind == Shared || c.Kind == Mixed && rng.IntN(2) == 0 {
			prefix = rng.IntN(len(systems))
		}
		var sys string
		if prefix >= 0 {
			sys = systems[prefix]
			shared++
		} else {
			sys = words.text(rng, c.SystemBytes)
		}
		user := words.text(rng, c.UserBytes)
		stream := rng.Float64() < c.StreamFraction
		b := chatBody{
			Model:     c.Model,
			Messages:  []chatMessage{{Role: "system", Content: sys}, {Role: "user", Content: user}},
			MaxTokens: c.MaxTokens, Seed: rng.Uint64() >> 1, Stream: stream,
		}
		body, err := json.Marshal(&b)
		if err != nil {
			return nil, fmt.Errorf("loadgen: encode request: %w", err)
		}
		w.Requests[i] = Request{Path: ChatPath, Body: body, Stream: stream, Prefix: prefix}
		tokens += len(tok.Encode(tokenizer.RenderChat([]tokenizer.Message{{Role: "system", Content: sys}, {Role: "user", Content: user}})))
	}
	w.MeanPromptTokens = float64(tokens) / float64(c.Requests)
	w.SharedFraction = float64(shared) / float64(c.Requests)
	return w, nil
}

// Completion returns a small completions request: a short prompt and
// maxTokens tokens, streamed or not. Overhead runs send it again and again.
func Completion(model string, maxTokens int, stream bool) Request {
	b, _ := json.Marshal(map[string]any{
		"model": model, "prompt": "Measure the cost of one hop", "max_tokens": maxTokens,
		"temperature": 0, "seed": 1, "stream": stream,
	})
	return Request{Path: CompletionsPath, Body: b, Stream: stream, Prefix: -1}
}

// words draws English text from the reference tokenizer's whole words, so
// that the text tokenizes at about one token per word; with numbers set,
// that share of the words are numbers instead (one token per byte).
type words struct {
	pieces  []string
	numbers float64
}

func newWords(t *tokenizer.Tokenizer, numbers float64) words {
	ids := t.SpaceWords()
	w := words{pieces: make([]string, len(ids)), numbers: numbers}
	for i, id := range ids {
		w.pieces[i] = t.Piece(id)
	}
	return w
}

// text returns random words of at least n bytes (and one word more at
// most), without a leading space.
func (w words) text(rng *rand.Rand, n int) string {
	var b strings.Builder
	b.Grow(n + 16)
	for b.Len() <= n { // the leading space is trimmed below
		if w.numbers > 0 && rng.Float64() < w.numbers {
			b.WriteByte(' ')
			b.WriteString(strconv.Itoa(10 + rng.IntN(999990))) // 2 to 6 digits
			continue
		}
		b.WriteString(w.pieces[rng.IntN(len(w.pieces))])
	}
	return strings.TrimPrefix(b.String(), " ")
}
