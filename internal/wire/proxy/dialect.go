package proxy

import (
	"bytes"

	"github.com/tidwall/gjson"

	"github.com/tlgate/tlgate/internal/wire/openai"
)

// Dialect is what the proxy must know of an API whose answers are not
// OpenAI completions: which whole answers are successes, how an engine's
// client error is re-encoded for the client, which SSE event ends a
// stream, and the event that ends a stream failed after commit. An
// Attempt with a nil Dialect is a completions or chat completions one.
type Dialect struct {
	// Success reports whether a 2xx JSON object is this API's answer.
	Success func(root gjson.Result) bool
	// Error encodes an engine's client error for the client; nil: OpenAI's
	// shape.
	Error func(status int, code, msg string, param *string) []byte
	// EndEvents are the SSE event names ("event: response.completed")
	// after which a stream is complete; nil: the "data: [DONE]" event.
	EndEvents []string
	// DoneAlso: a "data: [DONE]" event ends the stream too (engines that
	// add one after the API's own last event).
	DoneAlso bool
	// ErrorEvent is the event written after a committed stream failed, for
	// reason; nil: OpenAI's error data event. seq is the sequence number
	// that follows the relayed events' (with Sequenced; else 0).
	ErrorEvent func(reason Failure, seq int64) []byte
	// Sequenced: every event carries a "sequence_number" (the Responses
	// API), which the relay follows for ErrorEvent.
	Sequenced bool
}

// success reports whether root is a success answer of d; without a
// Dialect, of the OpenAI endpoint expect.
func (d *Dialect) success(root gjson.Result, expect openai.Endpoint) bool {
	if d == nil || d.Success == nil {
		return expect.AnswerOK(root)
	}
	return root.IsObject() && d.Success(root)
}

// encodeError encodes an engine's client error in d's shape.
func (d *Dialect) encodeError(status int, code, msg string, param *string) []byte {
	if d == nil || d.Error == nil {
		return openai.MarshalError(status, code, msg, param)
	}
	return d.Error(status, code, msg, param)
}

// errorEvent is the event that ends a stream failed after commit; seq is
// the sequence number that follows the relayed events'.
func (d *Dialect) errorEvent(reason Failure, seq int64) []byte {
	if d == nil || d.ErrorEvent == nil {
		return errorEvent(reason)
	}
	return d.ErrorEvent(reason, seq)
}

// sequenced reports whether d's events carry sequence numbers.
func (d *Dialect) sequenced() bool { return d != nil && d.Sequenced }

// endsOnDone reports whether "data: [DONE]" ends d's streams.
func (d *Dialect) endsOnDone() bool {
	return d == nil || len(d.EndEvents) == 0 || d.DoneAlso
}

// endEvent reports whether an "event:" line's value (trimmed) is one of d's
// end events.
func (d *Dialect) endEvent(name []byte) bool {
	if d == nil {
		return false
	}
	for _, e := range d.EndEvents {
		if string(name) == e {
			return true
		}
	}
	return false
}

// eventName returns the value of an "event:" field line, or nil.
func eventName(line []byte) []byte {
	v, ok := bytes.CutPrefix(line, []byte("event:"))
	if !ok {
		return nil
	}
	return bytes.TrimPrefix(v, []byte{' '})
}
