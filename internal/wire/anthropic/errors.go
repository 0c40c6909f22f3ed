// Package anthropic is Anthropic's Messages API as the gateway speaks it
// on POST /v1/messages: the error shape and its type names, and the
// request fields routing needs (ParseRequest).
package anthropic

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
)

// Path is where the gateway serves the Messages API.
const Path = "/v1/messages"

// OnPath reports whether path is Path or below it: every error the gateway
// answers there, wherever it is written, is in Anthropic's shape.
func OnPath(path string) bool {
	return path == Path || strings.HasPrefix(path, Path+"/")
}

// Anthropic's error types.
const (
	TypeInvalidRequest = "invalid_request_error"
	TypeAuthentication = "authentication_error"
	TypePermission     = "permission_error"
	TypeNotFound       = "not_found_error"
	TypeRequestTooBig  = "request_too_large"
	TypeRateLimit      = "rate_limit_error"
	TypeAPI            = "api_error"
	TypeOverloaded     = "overloaded_error"
)

// ErrorBody is Anthropic's error envelope:
// {"type":"error","error":{"type":...,"message":...}}.
type ErrorBody struct {
	Type  string      `json:"type"`
	Error ErrorDetail `json:"error"`
}

// ErrorDetail is the inside of ErrorBody.
type ErrorDetail struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}

// ErrorType returns Anthropic's error type for an HTTP status: 401
// authentication_error, 403 permission_error, 404 not_found_error, 413
// request_too_large, 429 rate_limit_error, 503 and 529 overloaded_error,
// any other 5xx api_error, any other status invalid_request_error.
func ErrorType(status int) string {
	switch {
	case status == http.StatusUnauthorized:
		return TypeAuthentication
	case status == http.StatusForbidden:
		return TypePermission
	case status == http.StatusNotFound:
		return TypeNotFound
	case status == http.StatusRequestEntityTooLarge:
		return TypeRequestTooBig
	case status == http.StatusTooManyRequests:
		return TypeRateLimit
	case status == http.StatusServiceUnavailable || status == 529:
		return TypeOverloaded
	case status >= 500:
		return TypeAPI
	}
	return TypeInvalidRequest
}

// MarshalError encodes an ErrorBody for status and msg.
func MarshalError(status int, msg string) []byte {
	return marshal(ErrorBody{Type: "error", Error: ErrorDetail{Type: ErrorType(status), Message: msg}})
}

func marshal(b ErrorBody) []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(b) // a struct of strings always encodes
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}

// WriteError answers with Anthropic's error shape: Content-Type
// application/json, the status, and the body of MarshalError.
func WriteError(w http.ResponseWriter, status int, msg string) {
	body := MarshalError(status, msg)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// SSEError returns the "error" event that ends a stream failed after its
// first byte, of type api_error.
func SSEError(msg string) []byte { return SSEErrorOf(TypeAPI, msg) }

// SSEErrorOf returns an "error" event of Anthropic's error type typ (one
// of the Type constants), which ends a stream.
func SSEErrorOf(typ, msg string) []byte {
	body := marshal(ErrorBody{Type: "error", Error: ErrorDetail{Type: typ, Message: msg}})
	out := make([]byte, 0, len(body)+24)
	out = append(out, "event: error\ndata: "...)
	out = append(out, body...)
	return append(out, "\n\n"...)
}
