package enginesim

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"time"

	"github.com/tlgate/tlgate/enginesim/tokenizer"
)

// sampling is the sampling fields the Responses and Messages bodies share
// with chat (their names differ: max_output_tokens, max_tokens).
type sampling struct {
	Temperature *float64     `json:"temperature"`
	TopP        *float64     `json:"top_p"`
	TopK        *int         `json:"top_k"`
	Seed        *json.Number `json:"seed"`
}

// genFor builds the generation of a Responses or Messages request: the
// conversation rendered with the chat template, maxTokens, sampling.
func (e *Engine) genFor(conv []tokenizer.Message, maxTokens int, s sampling, stop json.RawMessage, stream bool) (*genRequest, error) {
	g := &genRequest{chat: true, stream: stream, prompt: e.tok.Encode(tokenizer.RenderChat(conv)), maxTokens: maxTokens}
	req := openAIRequest{MaxTokens: &maxTokens, Temperature: s.Temperature, TopP: s.TopP, TopK: s.TopK, Seed: s.Seed, Stop: stop}
	if err := g.sampling(&req); err != nil {
		return nil, err
	}
	return g, nil
}

// runGen serves a generation of the Responses or Messages API: the faults
// and checks of handleInference (stall, die, draining), then generate
// with emit. It reports false when it answered (or aborted) itself; a
// failure after a streamed answer started aborts the connection, so the
// stream never ends cleanly.
func (e *Engine) runGen(w http.ResponseWriter, r *http.Request, g *genRequest, emit func(*step) error, started func() bool, fail func(status int, typ, code, msg string)) (result, bool) {
	f := e.Faults()
	if f.StallMS > 0 {
		e.hook(func(h *hooks) chan struct{} { return h.stalled })
		if err := sleepCtx(r.Context(), time.Duration(f.StallMS)*time.Millisecond); err != nil {
			e.core.count(func(c *counters) { c.aborted++ })
			return result{}, false
		}
	}
	if f.Die && f.DieAfterTokens == 0 {
		e.core.count(func(c *counters) { c.aborted++ })
		panic(http.ErrAbortHandler)
	}
	if e.Draining() {
		fail(http.StatusServiceUnavailable, "server_error", "draining", "engine is draining")
		return result{}, false
	}
	tokens := 0
	res, err := e.generate(r.Context(), g, nil, func(s *step) error {
		if err := emit(s); err != nil {
			return err
		}
		tokens++
		if f.Die && tokens >= f.DieAfterTokens {
			return errDie
		}
		return nil
	})
	switch {
	case errors.Is(err, errDie):
		e.core.count(func(c *counters) { c.aborted++ })
		panic(http.ErrAbortHandler)
	case err != nil:
		e.core.count(func(c *counters) { c.aborted++ })
		if started() {
			panic(http.ErrAbortHandler)
		}
		switch {
		case errors.Is(err, errTooLarge):
			fail(http.StatusBadRequest, "invalid_request_error", "context_length_exceeded", err.Error())
		case errors.Is(err, errCoreClosed):
			fail(http.StatusServiceUnavailable, "server_error", "unavailable", "engine is stopping")
		case r.Context().Err() != nil:
		default:
			fail(http.StatusInternalServerError, "server_error", "internal_error", err.Error())
		}
		return result{}, false
	}
	return res, true
}

// sse writes server-sent events with an event name, flushing each.
type sse struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	started bool
	buf     []byte
}

// event writes "event: name" and v as its data.
func (s *sse) event(name string, v any) error {
	if !s.started {
		s.started = true
		s.rc = startSSE(s.w)
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("enginesim: encode event: %w", err)
	}
	s.buf = append(append(append(append(append(s.buf[:0], "event: "...), name...), "\ndata: "...), b...), "\n\n"...)
	if _, err := s.w.Write(s.buf); err != nil {
		return err
	}
	return s.rc.Flush()
}

// randomID returns prefix and 24 random hex digits.
func randomID(prefix string) string {
	var b [12]byte
	for i := range b {
		b[i] = byte(rand.Uint32())
	}
	return prefix + hex.EncodeToString(b[:])
}
