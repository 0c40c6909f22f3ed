package enginesim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/tlgate/tlgate/enginesim/tokenizer"
)

// defaultMaxOutputTokens is max_output_tokens when a Responses request
// has none.
const defaultMaxOutputTokens = 256

// responsesRequest is the part of a Responses API body the engine reads.
type responsesRequest struct {
	Model              string          `json:"model"`
	Input              json.RawMessage `json:"input"`
	Instructions       *string         `json:"instructions"`
	PreviousResponseID *string         `json:"previous_response_id"`
	Store              *bool           `json:"store"`
	Stream             bool            `json:"stream"`
	MaxOutputTokens    *int            `json:"max_output_tokens"`
	sampling
}

// Response shapes of the Responses API, as vLLM answers them.
type (
	responseJSON struct {
		ID                 string             `json:"id"`
		Object             string             `json:"object"`
		CreatedAt          int64              `json:"created_at"`
		Model              string             `json:"model"`
		Status             string             `json:"status"`
		Output             []responseItemJSON `json:"output"`
		Usage              *responseUsageJSON `json:"usage"`
		Instructions       *string            `json:"instructions"`
		PreviousResponseID *string            `json:"previous_response_id"`
		Store              bool               `json:"store"`
		MaxOutputTokens    int                `json:"max_output_tokens"`
		Temperature        float64            `json:"temperature"`
		TopP               float64            `json:"top_p"`
		ParallelToolCalls  bool               `json:"parallel_tool_calls"`
		ToolChoice         string             `json:"tool_choice"`
		Tools              []any              `json:"tools"`
		Metadata           map[string]string  `json:"metadata"`
		IncompleteDetails  *incompleteJSON    `json:"incomplete_details"`
		Error              *json.RawMessage   `json:"error"`
		Text               map[string]any     `json:"text"`
		Truncation         string             `json:"truncation"`
	}
	incompleteJSON struct {
		Reason string `json:"reason"`
	}
	responseItemJSON struct {
		Type    string             `json:"type"`
		ID      string             `json:"id"`
		Role    string             `json:"role"`
		Status  string             `json:"status"`
		Content []responsePartJSON `json:"content"`
	}
	responsePartJSON struct {
		Type        string `json:"type"`
		Text        string `json:"text"`
		Annotations []any  `json:"annotations"`
	}
	responseUsageJSON struct {
		InputTokens         int            `json:"input_tokens"`
		OutputTokens        int            `json:"output_tokens"`
		TotalTokens         int            `json:"total_tokens"`
		InputTokensDetails  map[string]int `json:"input_tokens_details"`
		OutputTokensDetails map[string]int `json:"output_tokens_details"`
	}
)

func (e *Engine) responsesRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/responses", e.traced("enginesim.responses", e.handleResponses))
	mux.HandleFunc("GET /v1/responses/{id}", e.handleGetResponse)
	mux.HandleFunc("DELETE /v1/responses/{id}", e.handleDeleteResponse)
}

// responseInput reads a Responses input: a string (one user message) or
// an array of message items (role and content: a string or text parts);
// other items contribute their output or arguments under their type.
func responseInput(raw json.RawMessage) ([]tokenizer.Message, error) {
	if isNull(raw) {
		return nil, fmt.Errorf("%w: input is required", errBadRequest)
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return []tokenizer.Message{{Role: "user", Content: s}}, nil
	}
	var items []struct {
		Type      string          `json:"type"`
		Role      string          `json:"role"`
		Content   json.RawMessage `json:"content"`
		Output    string          `json:"output"`
		Arguments string          `json:"arguments"`
	}
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, fmt.Errorf("%w: input must be a string or an array of items", errBadRequest)
	}
	out := make([]tokenizer.Message, 0, len(items))
	for i, it := range items {
		if it.Role == "" {
			if it.Type == "" {
				return nil, fmt.Errorf("%w: input[%d] has neither role nor type", errBadRequest, i)
			}
			out = append(out, tokenizer.Message{Role: it.Type, Content: it.Output + it.Arguments})
			continue
		}
		text, err := partsText(it.Content, "input_text", "output_text", "text")
		if err != nil {
			return nil, fmt.Errorf("%w: input[%d].content: %w", errBadRequest, i, err)
		}
		out = append(out, tokenizer.Message{Role: it.Role, Content: text})
	}
	return out, nil
}

// partsText reads a string, null, or an array of parts whose type is one
// of types (their text concatenated; other parts are skipped).
func partsText(raw json.RawMessage, types ...string) (string, error) {
	if isNull(raw) {
		return "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", fmt.Errorf("must be a string or an array of content parts")
	}
	var b strings.Builder
	for _, p := range parts {
		for _, t := range types {
			if p.Type == t {
				b.WriteString(p.Text)
				break
			}
		}
	}
	return b.String(), nil
}

// handleResponses serves POST /v1/responses: store (default true) keeps
// the response in memory, previous_response_id continues a stored one's
// conversation (404 when this engine does not hold it).
func (e *Engine) handleResponses(w http.ResponseWriter, r *http.Request) {
	if id := r.Header.Get("X-Request-Id"); id != "" {
		w.Header().Set("X-Request-Id", id)
	}
	var req responsesRequest
	if !e.readJSON(w, r, &req) {
		return
	}
	if req.Model != e.cfg.Model {
		writeModelNotFound(w, req.Model)
		return
	}
	var conv []tokenizer.Message
	if req.PreviousResponseID != nil && *req.PreviousResponseID != "" {
		prev, ok := e.stored.get(*req.PreviousResponseID)
		if !ok {
			writeResponseNotFound(w, *req.PreviousResponseID)
			return
		}
		conv = append(conv, prev.conv...)
	}
	if req.Instructions != nil && *req.Instructions != "" {
		conv = append([]tokenizer.Message{{Role: "system", Content: *req.Instructions}}, conv...)
	}
	input, err := responseInput(req.Input)
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_request", err.Error())
		return
	}
	conv = append(conv, input...)
	maxTokens := defaultMaxOutputTokens
	if req.MaxOutputTokens != nil {
		maxTokens = *req.MaxOutputTokens
	}
	g, err := e.genFor(conv, maxTokens, req.sampling, nil, req.Stream)
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_request", err.Error())
		return
	}
	store := req.Store == nil || *req.Store
	resp := &responseJSON{ID: randomID("resp_"), Object: "response", CreatedAt: time.Now().Unix(), Model: e.cfg.Model,
		Status: "in_progress", Output: []responseItemJSON{}, Instructions: req.Instructions, PreviousResponseID: req.PreviousResponseID,
		Store: store, MaxOutputTokens: maxTokens, Temperature: g.params.Temperature, TopP: g.params.TopP, ParallelToolCalls: true,
		ToolChoice: "auto", Tools: []any{}, Metadata: map[string]string{}, Text: map[string]any{"format": map[string]string{"type": "text"}},
		Truncation: "disabled"}
	msgID := randomID("msg_")
	out := &responsesOut{s: sse{w: w}, resp: resp, msgID: msgID}
	emit := func(s *step) error {
		out.text.WriteString(s.delta)
		if !g.stream {
			return nil
		}
		return out.delta(s.delta)
	}
	res, ok := e.runGen(w, r, g, emit, func() bool { return out.s.started }, func(status int, typ, code, msg string) {
		writeError(w, status, typ, code, msg)
	})
	if !ok {
		return
	}
	text := out.text.String()
	resp.Status = "completed"
	if res.finish == "length" {
		resp.Status, resp.IncompleteDetails = "incomplete", &incompleteJSON{Reason: "max_output_tokens"}
	}
	item := responseItemJSON{Type: "message", ID: msgID, Role: "assistant", Status: "completed",
		Content: []responsePartJSON{{Type: "output_text", Text: text, Annotations: []any{}}}}
	resp.Output = []responseItemJSON{item}
	resp.Usage = &responseUsageJSON{InputTokens: res.promptTokens, OutputTokens: res.completionTokens,
		TotalTokens:        res.promptTokens + res.completionTokens,
		InputTokensDetails: map[string]int{"cached_tokens": res.cached}, OutputTokensDetails: map[string]int{"reasoning_tokens": 0}}
	if store {
		b, _ := json.Marshal(resp) // plain data always encodes
		e.stored.put(resp.ID, &storedResponse{body: b, conv: append(conv, tokenizer.Message{Role: "assistant", Content: text})})
	}
	var err2 error
	if g.stream {
		err2 = out.finish(item)
	} else {
		err2 = writeJSON(w, http.StatusOK, resp)
	}
	if err2 != nil {
		e.core.count(func(c *counters) { c.aborted++ })
		panic(http.ErrAbortHandler)
	}
	e.core.count(func(c *counters) { c.completed++ })
}

// responsesOut streams a response as the Responses API's events.
type responsesOut struct {
	s     sse
	resp  *responseJSON
	msgID string
	text  strings.Builder
	seq   int
	begun bool
}

func (o *responsesOut) event(typ string, fields map[string]any) error {
	fields["type"] = typ
	fields["sequence_number"] = o.seq
	o.seq++
	return o.s.event(typ, fields)
}

// delta writes one text delta, after the opening events the first time.
func (o *responsesOut) delta(d string) error {
	if !o.begun {
		o.begun = true
		if err := o.event("response.created", map[string]any{"response": o.resp}); err != nil {
			return err
		}
		if err := o.event("response.in_progress", map[string]any{"response": o.resp}); err != nil {
			return err
		}
		item := responseItemJSON{Type: "message", ID: o.msgID, Role: "assistant", Status: "in_progress", Content: []responsePartJSON{}}
		if err := o.event("response.output_item.added", map[string]any{"output_index": 0, "item": item}); err != nil {
			return err
		}
		if err := o.event("response.content_part.added", map[string]any{"item_id": o.msgID, "output_index": 0, "content_index": 0,
			"part": responsePartJSON{Type: "output_text", Annotations: []any{}}}); err != nil {
			return err
		}
	}
	if d == "" {
		return nil
	}
	return o.event("response.output_text.delta", map[string]any{"item_id": o.msgID, "output_index": 0, "content_index": 0,
		"delta": d, "logprobs": []any{}})
}

// finish writes the closing events, response.completed last.
func (o *responsesOut) finish(item responseItemJSON) error {
	if err := o.delta(""); err != nil {
		return err
	}
	text := item.Content[0].Text
	steps := []struct {
		typ    string
		fields map[string]any
	}{
		{"response.output_text.done", map[string]any{"item_id": o.msgID, "output_index": 0, "content_index": 0, "text": text, "logprobs": []any{}}},
		{"response.content_part.done", map[string]any{"item_id": o.msgID, "output_index": 0, "content_index": 0, "part": item.Content[0]}},
		{"response.output_item.done", map[string]any{"output_index": 0, "item": item}},
		{"response.completed", map[string]any{"response": o.resp}},
	}
	for _, s := range steps {
		if err := o.event(s.typ, s.fields); err != nil {
			return err
		}
	}
	return nil
}

func (e *Engine) handleGetResponse(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	s, ok := e.stored.get(id)
	if !ok {
		writeResponseNotFound(w, id)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(append(bytes.Clone(s.body), '\n'))
}

func (e *Engine) handleDeleteResponse(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if !e.stored.remove(id) {
		writeResponseNotFound(w, id)
		return
	}
	_ = writeJSON(w, http.StatusOK, map[string]any{"id": id, "object": "response", "deleted": true})
}

func writeResponseNotFound(w http.ResponseWriter, id string) {
	writeError(w, http.StatusNotFound, "invalid_request_error", "response_not_found",
		fmt.Sprintf("Response with id '%s' not found.", id))
}
