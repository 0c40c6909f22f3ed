package chatbridge

import (
	"bytes"
	"encoding/json"
	"net/http"
	"time"

	"github.com/tidwall/gjson"

	"github.com/tlgate/tlgate/internal/wire/anthropic"
	"github.com/tlgate/tlgate/internal/wire/openai"
	"github.com/tlgate/tlgate/internal/wire/sse"
)

// Stream is the writer an engine's chat stream is relayed to: it reads
// the chat chunks and writes the client API's events to the client's
// writer. The stream's usage chunk (the translated body asks for it)
// ends up in the API's last events; "data: [DONE]" becomes the API's end;
// an error event (the engine's, or the gateway's for a stream cut after
// its first byte) becomes the API's error event, its message kept.
type Stream struct {
	b *Bridge
	w http.ResponseWriter

	checked, sse bool
	buf          []byte
	sc           sse.Scanner
	out          []byte // the events to write, per Write

	started, ended bool
	model          string
	created        int64
	finish         string
	stop           gjson.Result // the stop string matched (matchedStop)
	usage          gjson.Result // the chat usage object, once seen

	// Messages: whether a text block is open and the index of the next
	// block; the tool calls streamed so far, by the chat index, in
	// the order they began, each written as one whole block once the calls
	// end (chat may interleave calls' arguments; Anthropic's blocks follow
	// one another).
	textOpen bool
	block    int
	uses     []*openCall
	usedLast bool // the last block written is a tool_use

	// Responses: the sequence number of the next event, the output
	// items done, the message item open and the function calls open (by
	// the chat tool call index), in the order they were opened.
	seq   int64
	done  []outputItem
	msg   *outputItem
	text  []byte
	lps   []byte // the message's token logprobs so far, a JSON list's elements
	calls []*openCall
}

// openCall is a function call item being streamed.
type openCall struct {
	index int // the chat tool call's index
	out   int // its output_index
	item  outputItem
	args  []byte
}

// Stream returns the writer that translates a chat stream into the API's
// events on w.
func (b *Bridge) Stream(w http.ResponseWriter) *Stream {
	return &Stream{b: b, w: w, sc: sse.Scanner{Ends: sse.Ends{Done: true}}}
}

// Header is the client's headers.
func (s *Stream) Header() http.Header { return s.w.Header() }

// WriteHeader writes the client's status.
func (s *Stream) WriteHeader(code int) { s.w.WriteHeader(code) }

// Unwrap returns the client's writer, for http.ResponseController.
func (s *Stream) Unwrap() http.ResponseWriter { return s.w }

// Write reads p's chat events (an event may span writes) and writes the
// API's events they make.
func (s *Stream) Write(p []byte) (int, error) {
	if !s.checked {
		s.checked = true
		s.sse = sse.IsEventStream(s.w.Header().Get("Content-Type"))
	}
	if !s.sse || s.ended {
		if s.ended {
			return len(p), nil // nothing follows the API's end
		}
		return s.w.Write(p)
	}
	s.buf = append(s.buf, p...)
	end, _, _ := s.sc.Scan(s.buf)
	for _, ev := range s.sc.Take() {
		if s.ended {
			break
		}
		if data := ev.Data(s.buf); data != nil {
			s.event(data)
		}
	}
	if end > 0 {
		s.buf = s.buf[:copy(s.buf, s.buf[end:])]
		s.sc.Shift(end)
	}
	if s.sc.Bad { // not SSE after all: nothing more can be translated, and nothing untranslated reaches the client
		s.ended = true
	}
	if len(s.out) > 0 {
		out := s.out
		s.out = s.out[:0]
		if _, err := s.w.Write(out); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

var doneData = []byte("[DONE]")

// event handles one chat data event.
func (s *Stream) event(data []byte) {
	if bytes.Equal(data, doneData) {
		s.end()
		return
	}
	c := gjson.ParseBytes(data)
	if e := c.Get("error"); e.Exists() {
		s.fail(e)
		return
	}
	if !s.started {
		s.start(c)
	}
	if u := c.Get("usage"); u.IsObject() {
		s.usage = u
	}
	ch := c.Get("choices.0")
	if !ch.Exists() {
		return
	}
	d := ch.Get("delta")
	if t := d.Get("content"); t.Str != "" {
		s.textDelta(t.Str, ch.Get("logprobs.content"))
	}
	elements(d.Get("tool_calls"), s.toolDelta)
	if f := ch.Get("finish_reason"); f.Type == gjson.String {
		s.finish, s.stop = f.Str, matchedStop(ch)
		s.closeAll()
	}
}

// start writes the API's first events, from the first chunk.
func (s *Stream) start(c gjson.Result) {
	s.started = true
	s.model, s.created = c.Get("model").Str, c.Get("created").Int()
	if s.created == 0 {
		s.created = time.Now().Unix()
	}
	if s.b.api == Messages {
		s.emit("message_start", map[string]any{"type": "message_start", "message": messageJSON{
			ID: messageID(c.Get("id").Str), Type: "message", Role: "assistant", Model: s.model, Content: []messageBlockJSON{}}})
		return
	}
	r := s.b.base(s.model, s.created, "in_progress")
	s.emitSeq("response.created", map[string]any{"response": r})
	s.emitSeq("response.in_progress", map[string]any{"response": r})
}

// emit appends one named event with data v.
func (s *Stream) emit(name string, v any) {
	data, err := json.Marshal(v)
	if err != nil {
		panic("chatbridge: " + err.Error()) // only the package's own types are written
	}
	s.out = append(s.out, "event: "...)
	s.out = append(s.out, name...)
	s.out = append(s.out, "\ndata: "...)
	s.out = append(s.out, data...)
	s.out = append(s.out, "\n\n"...)
}

// emitSeq appends a Responses event: fields, its type and its sequence
// number.
func (s *Stream) emitSeq(name string, fields map[string]any) {
	fields["type"] = name
	fields["sequence_number"] = s.seq
	s.seq++
	s.emit(name, fields)
}

// textDelta writes a chunk's text, with its token logprobs (lp, chat's
// list) for the Responses API, whose output_text carries them in the same
// shape.
func (s *Stream) textDelta(t string, lp gjson.Result) {
	if s.b.api == Messages {
		if !s.textOpen {
			s.closeUses()
			s.textOpen, s.usedLast = true, false
			empty := ""
			s.emit("content_block_start", map[string]any{"type": "content_block_start", "index": s.block,
				"content_block": messageBlockJSON{Type: "text", Text: &empty}})
		}
		s.emit("content_block_delta", map[string]any{"type": "content_block_delta", "index": s.block,
			"delta": map[string]string{"type": "text_delta", "text": t}})
		return
	}
	if s.msg == nil {
		s.closeCalls()
		content := []outputContent{}
		s.msg = &outputItem{Type: "message", ID: itemID("msg"), Status: "in_progress", Role: "assistant", Content: &content}
		s.text, s.lps = s.text[:0], s.lps[:0]
		s.emitSeq("response.output_item.added", map[string]any{"output_index": len(s.done), "item": *s.msg})
		s.emitSeq("response.content_part.added", map[string]any{"item_id": s.msg.ID, "output_index": len(s.done), "content_index": 0,
			"part": outputContent{Type: "output_text", Annotations: []any{}, Logprobs: json.RawMessage("[]")}})
	}
	s.text = append(s.text, t...)
	delta := json.RawMessage("[]")
	if lp.IsArray() {
		delta = raw(lp)
		lp.ForEach(func(_, v gjson.Result) bool {
			if len(s.lps) > 0 {
				s.lps = append(s.lps, ',')
			}
			s.lps = append(s.lps, v.Raw...)
			return true
		})
	}
	s.emitSeq("response.output_text.delta", map[string]any{"item_id": s.msg.ID, "output_index": len(s.done), "content_index": 0,
		"delta": t, "logprobs": delta})
}

// callAt is the call of calls the engine numbers idx (the last such), or
// nil.
func callAt(calls []*openCall, idx int) *openCall {
	var at *openCall
	for _, c := range calls {
		if c.index == idx {
			at = c
		}
	}
	return at
}

func (s *Stream) toolDelta(tc gjson.Result) {
	idx := int(tc.Get("index").Int())
	args := tc.Get("function.arguments").Str
	if s.b.api == Messages {
		s.closeBlock()
		use := callAt(s.uses, idx)
		if use == nil {
			use = &openCall{index: idx, item: outputItem{CallID: tc.Get("id").Str, Name: tc.Get("function.name").Str}}
			s.uses = append(s.uses, use)
		}
		use.args = append(use.args, args...)
		return
	}
	s.closeMessage()
	call := callAt(s.calls, idx)
	if call == nil {
		empty := ""
		call = &openCall{index: idx, out: len(s.done) + len(s.calls),
			item: outputItem{Type: "function_call", ID: itemID("fc"), Status: "in_progress", CallID: tc.Get("id").Str, Name: tc.Get("function.name").Str, Args: &empty}}
		s.calls = append(s.calls, call)
		s.emitSeq("response.output_item.added", map[string]any{"output_index": call.out, "item": call.item})
	}
	if args != "" {
		call.args = append(call.args, args...)
		s.emitSeq("response.function_call_arguments.delta", map[string]any{"item_id": call.item.ID, "output_index": call.out, "delta": args})
	}
}

// closeBlock ends the Messages text block open, if any.
func (s *Stream) closeBlock() {
	if !s.textOpen {
		return
	}
	s.emit("content_block_stop", map[string]any{"type": "content_block_stop", "index": s.block})
	s.textOpen = false
	s.block++
}

// closeMessage ends the Responses message item open, if any.
func (s *Stream) closeMessage() {
	if s.msg == nil {
		return
	}
	i := len(s.done)
	lps := json.RawMessage("[" + string(s.lps) + "]")
	part := outputContent{Type: "output_text", Text: string(s.text), Annotations: []any{}, Logprobs: lps}
	s.emitSeq("response.output_text.done", map[string]any{"item_id": s.msg.ID, "output_index": i, "content_index": 0, "text": part.Text, "logprobs": lps})
	s.emitSeq("response.content_part.done", map[string]any{"item_id": s.msg.ID, "output_index": i, "content_index": 0, "part": part})
	content := []outputContent{part}
	s.msg.Content, s.msg.Status = &content, "completed"
	s.emitSeq("response.output_item.done", map[string]any{"output_index": i, "item": *s.msg})
	s.done = append(s.done, *s.msg)
	s.msg = nil
}

// closeCalls ends the Responses function call items open, in order.
func (s *Stream) closeCalls() {
	for _, c := range s.calls {
		args := string(c.args)
		s.emitSeq("response.function_call_arguments.done", map[string]any{"item_id": c.item.ID, "output_index": c.out, "arguments": args})
		c.item.Args, c.item.Status = &args, "completed"
		s.emitSeq("response.output_item.done", map[string]any{"output_index": c.out, "item": c.item})
		s.done = append(s.done, c.item)
	}
	s.calls = s.calls[:0]
}

// closeUses writes the Messages tool calls streamed so far, each as one
// tool_use block with its whole input.
func (s *Stream) closeUses() {
	for _, u := range s.uses {
		s.emit("content_block_start", map[string]any{"type": "content_block_start", "index": s.block,
			"content_block": messageBlockJSON{Type: "tool_use", ID: u.item.CallID, Name: u.item.Name, Input: json.RawMessage("{}")}})
		if len(u.args) > 0 {
			s.emit("content_block_delta", map[string]any{"type": "content_block_delta", "index": s.block,
				"delta": map[string]string{"type": "input_json_delta", "partial_json": string(u.args)}})
		}
		s.emit("content_block_stop", map[string]any{"type": "content_block_stop", "index": s.block})
		s.block++
		s.usedLast = true
	}
	s.uses = s.uses[:0]
}

func (s *Stream) closeAll() {
	if s.b.api == Messages {
		s.closeBlock()
		s.closeUses()
		return
	}
	s.closeMessage()
	s.closeCalls()
}

// end writes the API's last events: Messages' message_delta (stop reason
// and usage) and message_stop; the Responses API's response.completed
// (or response.incomplete) with the whole response.
func (s *Stream) end() {
	if !s.started {
		s.start(gjson.Result{})
	}
	s.closeAll()
	s.ended = true
	if s.b.api == Messages {
		reason, seq := stopReason(s.finish, s.stop, s.usedLast)
		s.emit("message_delta", map[string]any{"type": "message_delta",
			"delta": map[string]any{"stop_reason": reason, "stop_sequence": seq},
			"usage": messageUsage{InputTokens: s.usage.Get("prompt_tokens").Int(), OutputTokens: s.usage.Get("completion_tokens").Int()}})
		s.emit("message_stop", map[string]string{"type": "message_stop"})
		return
	}
	status, incomplete := finishStatus(s.finish)
	r := s.b.base(s.model, s.created, status)
	r.IncompleteDetails, r.Output, r.Usage = incomplete, s.done, usageOf(s.usage)
	name := "response.completed"
	if status == "incomplete" {
		name = "response.incomplete"
	}
	s.emitSeq(name, map[string]any{"response": r})
}

// fail writes the API's error event for a chat error event (e, its
// "error" object); nothing follows it.
func (s *Stream) fail(e gjson.Result) {
	s.ended = true
	msg := e.Get("message").Str
	if msg == "" {
		msg = e.Raw
	}
	code := e.Get("code").Str
	if code == "" {
		code = e.Get("type").Str
	}
	if s.b.api == Messages {
		typ := anthropic.TypeAPI
		if code == openai.CodeRateLimitExceeded || e.Get("type").Str == anthropic.TypeRateLimit {
			typ = anthropic.TypeRateLimit // the key's tokens budget, not a fault
		}
		s.out = append(s.out, anthropic.SSEErrorOf(typ, msg)...)
		return
	}
	s.out = append(s.out, openai.ResponsesErrorEvent(code, msg, s.seq)...)
	s.seq++
}
