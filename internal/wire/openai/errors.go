package openai

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"

	"github.com/tlgate/tlgate/internal/routing/echo"
)

// Error codes the gateway answers with, in the error body's "code".
const (
	CodeInvalidRequest    = "invalid_request"
	CodeInvalidAPIKey     = "invalid_api_key"
	CodeInsufficientScope = "insufficient_scope"
	CodeModelNotFound     = "model_not_found"
	CodeRequestTooLarge   = "request_too_large"
	CodeNoCapacity        = "no_capacity"
	CodeUpstreamFailed    = "upstream_failed"
	CodeUpstreamTimeout   = "upstream_timeout"
	CodeIfMatchRequired   = "if_match_required"
	CodeETagMismatch      = "etag_mismatch"
	CodeInvalidRoutes     = "invalid_routes"
	// CodeRateLimitExceeded answers a request over its key's limits (429).
	CodeRateLimitExceeded = "rate_limit_exceeded"
	// CodeOverloaded (503, with Retry-After): every routable worker of the
	// model is at its concurrency limit and the request could not wait.
	CodeOverloaded = "overloaded"
	// CodeObjectiveUnreachable (429, with Retry-After): the request's
	// time-to-first-token objective cannot be met by the gateway's
	// estimate, and its key is not served late.
	CodeObjectiveUnreachable = "objective_unreachable"
	// CodeSaturated (429, with Retry-After): the request is sheddable and
	// its model's engines report themselves saturated.
	CodeSaturated = "saturated"
	// CodeUnsupportedEndpoint relays an engine's 404 or 405 to a path it
	// does not serve (the engine's answer, not a failure).
	CodeUnsupportedEndpoint = "unsupported_endpoint"
	// CodeNotFound answers a path the gateway has no endpoint on (404).
	CodeNotFound = "not_found"
	// CodeMethodNotAllowed answers a method a path does not take (405).
	CodeMethodNotAllowed = "method_not_allowed"
)

// ErrorBody is OpenAI's error envelope:
// {"error":{"message":...,"type":...,"param":null|"x","code":...}}.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail is the inside of ErrorBody.
type ErrorDetail struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    string  `json:"code"`
}

// ErrorType returns the OpenAI error type for an HTTP status: 400 and 413
// (and any other 4xx) invalid_request_error, 401 authentication_error, 403
// permission_error, 404 not_found_error, 429 rate_limit_error, 503
// service_unavailable, any other 5xx server_error.
func ErrorType(status int) string {
	switch {
	case status == http.StatusUnauthorized:
		return "authentication_error"
	case status == http.StatusForbidden:
		return "permission_error"
	case status == http.StatusNotFound:
		return "not_found_error"
	case status == http.StatusTooManyRequests:
		return "rate_limit_error"
	case status == http.StatusServiceUnavailable:
		return "service_unavailable"
	case status >= 500:
		return "server_error"
	default:
		return "invalid_request_error"
	}
}

// MarshalError encodes an ErrorBody for status, code, msg and param (nil
// encodes as null). HTML characters in msg are kept as they are.
func MarshalError(status int, code, msg string, param *string) []byte {
	return marshalBody(ErrorBody{Error: ErrorDetail{Message: msg, Type: ErrorType(status), Param: param, Code: code}})
}

func marshalBody(b ErrorBody) []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	// Encoding a struct of strings cannot fail.
	_ = enc.Encode(b)
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}

// WriteError answers with OpenAI's error shape: Content-Type
// application/json, the status, and the body of MarshalError.
func WriteError(w http.ResponseWriter, status int, code, msg string, param *string) {
	body := MarshalError(status, code, msg, param)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// MethodNotAllowed answers every request 405 method_not_allowed, with
// the Allow header allow ("GET, HEAD") and a message naming the method,
// the path and the methods it takes.
func MethodNotAllowed(allow string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", allow)
		WriteError(w, http.StatusMethodNotAllowed, CodeMethodNotAllowed,
			fmt.Sprintf("%s is not allowed on %s (allowed: %s).", echo.Clip(r.Method), echo.Clip(r.URL.Path), allow), nil)
	}
}

// MarshalSSEError returns one server-sent event carrying the error of
// MarshalError (its type that of status), for a stream ended by the
// gateway after its first byte.
func MarshalSSEError(status int, code, msg string) []byte {
	body := MarshalError(status, code, msg, nil)
	out := make([]byte, 0, len(body)+8)
	out = append(out, "data: "...)
	out = append(out, body...)
	return append(out, "\n\n"...)
}

// SSEError returns one server-sent event carrying an error, for a stream
// that fails after its first byte: `data: {"error":{...}}` and a blank line.
// Its type is server_error (mid-stream failures are the server's).
func SSEError(code, msg string) []byte {
	body := marshalBody(ErrorBody{Error: ErrorDetail{Message: msg, Type: "server_error", Code: code}})
	out := make([]byte, 0, len(body)+8)
	out = append(out, "data: "...)
	out = append(out, body...)
	return append(out, "\n\n"...)
}

// ResponsesErrorEvent returns a Responses API stream's error event, for a
// stream the gateway ends after its first byte: `event: error` and data
// {"type":"error","code":...,"message":...,"param":null,"sequence_number":seq},
// seq one past the last event's (NextSequenceNumber).
func ResponsesErrorEvent(code, msg string, seq int64) []byte {
	b, _ := json.Marshal(struct {
		Type     string  `json:"type"`
		Code     string  `json:"code"`
		Message  string  `json:"message"`
		Param    *string `json:"param"`
		Sequence int64   `json:"sequence_number"`
	}{"error", code, msg, nil, seq}) // strings and numbers always encode
	return append(append([]byte("event: error\ndata: "), b...), "\n\n"...)
}

var sequenceKey = []byte(`"sequence_number":`)

// NextSequenceNumber returns the sequence number that follows the last
// "sequence_number" in b (whole events of a Responses stream: every event
// carries one, in order), or next when b holds none.
func NextSequenceNumber(b []byte, next int64) int64 {
	for i := bytes.LastIndex(b, sequenceKey); i >= 0; i = bytes.LastIndex(b[:i], sequenceKey) {
		rest := bytes.TrimLeft(b[i+len(sequenceKey):], " ")
		n := 0
		for n < len(rest) && n < 18 && rest[n] >= '0' && rest[n] <= '9' {
			n++
		}
		if n > 0 {
			v, err := strconv.ParseInt(string(rest[:n]), 10, 64)
			if err == nil {
				return v + 1
			}
		}
	}
	return next
}
