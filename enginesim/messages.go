package enginesim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/tlgate/tlgate/enginesim/tokenizer"
)

// messagesRequest is the part of an Anthropic Messages body the engine
// reads.
type messagesRequest struct {
	Model    string          `json:"model"`
	System   json.RawMessage `json:"system"`
	Messages []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
	MaxTokens     *int            `json:"max_tokens"`
	StopSequences json.RawMessage `json:"stop_sequences"`
	Stream        bool            `json:"stream"`
	sampling
}

type (
	messageJSON struct {
		ID           string             `json:"id"`
		Type         string             `json:"type"`
		Role         string             `json:"role"`
		Model        string             `json:"model"`
		Content      []messageBlockJSON `json:"content"`
		StopReason   *string            `json:"stop_reason"`
		StopSequence *string            `json:"stop_sequence"`
		Usage        messageUsageJSON   `json:"usage"`
	}
	messageBlockJSON struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	messageUsageJSON struct {
		InputTokens  int `json:"input_tokens"`
		OutputTokens int `json:"output_tokens"`
	}
)

func (e *Engine) messagesRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/messages", e.traced("enginesim.messages", e.handleMessages))
}

// writeAnthropicError writes Anthropic's error shape.
func writeAnthropicError(w http.ResponseWriter, status int, typ, msg string) {
	_ = writeJSON(w, status, map[string]any{"type": "error", "error": map[string]string{"type": typ, "message": msg}})
}

// anthropicType maps the engine's OpenAI error types to Anthropic's.
func anthropicType(status int) string {
	switch {
	case status == http.StatusNotFound:
		return "not_found_error"
	case status == http.StatusServiceUnavailable:
		return "overloaded_error"
	case status >= 500:
		return "api_error"
	}
	return "invalid_request_error"
}

// handleMessages serves POST /v1/messages in Anthropic's shapes, errors
// included.
func (e *Engine) handleMessages(w http.ResponseWriter, r *http.Request) {
	if id := r.Header.Get("X-Request-Id"); id != "" {
		w.Header().Set("X-Request-Id", id)
	}
	body, ok := e.readBody(w, r)
	if !ok {
		return
	}
	bad := func(msg string) { writeAnthropicError(w, http.StatusBadRequest, "invalid_request_error", msg) }
	var req messagesRequest
	if err := decodeJSON(body, &req); err != nil {
		bad(err.Error())
		return
	}
	if req.Model != e.cfg.Model {
		writeAnthropicError(w, http.StatusNotFound, "not_found_error", fmt.Sprintf("model: %s", req.Model))
		return
	}
	if req.MaxTokens == nil {
		bad("max_tokens: Field required")
		return
	}
	if len(req.Messages) == 0 {
		bad("messages: at least one message is required")
		return
	}
	var conv []tokenizer.Message
	system, err := partsText(req.System, "text")
	if err != nil {
		bad("system: " + err.Error())
		return
	}
	if system != "" {
		conv = append(conv, tokenizer.Message{Role: "system", Content: system})
	}
	for i, m := range req.Messages {
		if m.Role != "user" && m.Role != "assistant" {
			bad(fmt.Sprintf("messages.%d.role: must be \"user\" or \"assistant\"", i))
			return
		}
		text, err := partsText(m.Content, "text")
		if err != nil {
			bad(fmt.Sprintf("messages.%d.content: %v", i, err))
			return
		}
		conv = append(conv, tokenizer.Message{Role: m.Role, Content: text})
	}
	// max_tokens 0 is Anthropic's way to have the prompt's KV computed
	// and cached without generating: the fields are checked as for one
	// token, the prompt prefilled, and the answer holds no content.
	maxTokens := *req.MaxTokens
	if maxTokens < 0 {
		bad(fmt.Sprintf("max_tokens: must be at least 0, got %d", maxTokens))
		return
	}
	g, err := e.genFor(conv, max(maxTokens, 1), req.sampling, req.StopSequences, req.Stream)
	if err != nil {
		bad(strings.TrimPrefix(err.Error(), errBadRequest.Error()+": "))
		return
	}
	g.maxTokens = maxTokens
	msg := &messageJSON{ID: randomID("msg_"), Type: "message", Role: "assistant", Model: e.cfg.Model, Content: []messageBlockJSON{},
		Usage: messageUsageJSON{InputTokens: len(g.prompt)}}
	s := &sse{w: w}
	var text strings.Builder
	begin := func() error {
		if s.started {
			return nil
		}
		if err := s.event("message_start", map[string]any{"type": "message_start", "message": msg}); err != nil {
			return err
		}
		if err := s.event("content_block_start", map[string]any{"type": "content_block_start", "index": 0,
			"content_block": messageBlockJSON{Type: "text"}}); err != nil {
			return err
		}
		return s.event("ping", map[string]any{"type": "ping"})
	}
	emit := func(st *step) error {
		text.WriteString(st.delta)
		if !g.stream {
			return nil
		}
		if err := begin(); err != nil {
			return err
		}
		if st.delta == "" {
			return nil
		}
		return s.event("content_block_delta", map[string]any{"type": "content_block_delta", "index": 0,
			"delta": map[string]string{"type": "text_delta", "text": st.delta}})
	}
	res, ok := e.runGen(w, r, g, emit, func() bool { return s.started }, func(status int, _, _, m string) {
		writeAnthropicError(w, status, anthropicType(status), m)
	})
	if !ok {
		return
	}
	reason := "end_turn"
	switch {
	case res.finish == "length" || g.maxTokens == 0:
		reason = "max_tokens"
	case res.finish == "stop":
		if len(g.stop) > 0 && res.completionTokens < g.maxTokens {
			reason = "stop_sequence"
		}
	}
	msg.StopReason = &reason
	msg.Usage.OutputTokens = res.completionTokens
	var werr error
	if g.stream {
		werr = begin()
		for _, ev := range []struct {
			name string
			v    map[string]any
		}{
			{"content_block_stop", map[string]any{"type": "content_block_stop", "index": 0}},
			{"message_delta", map[string]any{"type": "message_delta", "delta": map[string]any{"stop_reason": reason, "stop_sequence": nil},
				"usage": map[string]int{"output_tokens": res.completionTokens}}},
			{"message_stop", map[string]any{"type": "message_stop"}},
		} {
			if werr == nil {
				werr = s.event(ev.name, ev.v)
			}
		}
	} else {
		if g.maxTokens > 0 {
			msg.Content = []messageBlockJSON{{Type: "text", Text: text.String()}}
		}
		werr = writeJSON(w, http.StatusOK, msg)
	}
	if werr != nil {
		e.core.count(func(c *counters) { c.aborted++ })
		panic(http.ErrAbortHandler)
	}
	e.core.count(func(c *counters) { c.completed++ })
}
