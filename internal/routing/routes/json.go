package routes

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"

	"github.com/tlgate/tlgate/internal/routing/echo"
)

// ErrBadJSON is wrapped by every error of ParseJSON.
var ErrBadJSON = errors.New("routes: bad route table JSON")

// Document is the JSON body of the admin routes API: GET answers it with
// the current epoch, PUT sends it back (the epoch is then ignored: If-Match
// carries the concurrency check).
type Document struct {
	Epoch  uint64  `json:"epoch"`
	Routes []Route `json:"routes"`
}

// EncodeJSON renders the admin API body {"epoch":N,"routes":[...]}, with
// an empty list (never null) for an empty table.
func EncodeJSON(epoch uint64, rs []Route) ([]byte, error) {
	if rs == nil {
		rs = []Route{}
	}
	b, err := json.Marshal(Document{Epoch: epoch, Routes: rs})
	if err != nil {
		return nil, fmt.Errorf("routes: encode: %w", err)
	}
	return b, nil
}

// ParseJSON decodes the admin API body {"routes":[...]} strictly: the body
// must be one JSON object; "routes" is required and not null (an empty
// list is an empty table); "epoch" is allowed and ignored (so a GET body can be edited and
// sent back); any other field, at any depth, is rejected with its path,
// as are values of the wrong type (`routes[0].backends[1].weight: want a
// number, got "x"`). ParseJSON checks the shape only: NewTable (Validate)
// checks the rules.
func ParseJSON(b []byte) ([]Route, error) {
	if err := wellFormed(b); err != nil {
		return nil, err
	}
	fields, err := object(b, "body")
	if err != nil {
		return nil, err
	}
	if err := allow(fields, "", "routes", "epoch"); err != nil {
		return nil, err
	}
	if raw, ok := fields["epoch"]; ok {
		var epoch uint64
		if err := decode(raw, &epoch, "epoch", "a non-negative integer"); err != nil {
			return nil, err
		}
	}
	rawRoutes, ok := fields["routes"]
	if !ok {
		return nil, fmt.Errorf("%w: routes: required", ErrBadJSON)
	}
	// null is not an empty table: a body that means to clear every route
	// says so with [].
	if isNull(rawRoutes) {
		return nil, fmt.Errorf("%w: routes: required, got null (send [] for an empty table)", ErrBadJSON)
	}
	items, err := array(rawRoutes, "routes")
	if err != nil {
		return nil, err
	}
	rs := make([]Route, len(items))
	for i, raw := range items {
		if rs[i], err = route(raw, fmt.Sprintf("routes[%d]", i)); err != nil {
			return nil, err
		}
	}
	return rs, nil
}

func route(raw json.RawMessage, at string) (Route, error) {
	var r Route
	f, err := object(raw, at)
	if err != nil {
		return r, err
	}
	if err := allow(f, at+".", "model", "aliases", "backends", "cascade", "targets", "priority", "ttft_objective_ms", "on_escalation_failure"); err != nil {
		return r, err
	}
	if err := field(f, "priority", &r.Priority, at, "an integer"); err != nil {
		return r, err
	}
	if err := field(f, "ttft_objective_ms", &r.TTFTObjectiveMs, at, "an integer"); err != nil {
		return r, err
	}
	if err := field(f, "on_escalation_failure", &r.OnEscalationFailure, at, "a string"); err != nil {
		return r, err
	}
	if err := field(f, "model", &r.Model, at, "a string"); err != nil {
		return r, err
	}
	if err := field(f, "aliases", &r.Aliases, at, "a list of strings"); err != nil {
		return r, err
	}
	if err := field(f, "targets", &r.Targets, at, "a list of strings"); err != nil {
		return r, err
	}
	if raw, ok := f["backends"]; ok && !isNull(raw) {
		items, err := array(raw, at+".backends")
		if err != nil {
			return r, err
		}
		r.Backends = make([]Backend, len(items))
		for k, item := range items {
			bp := fmt.Sprintf("%s.backends[%d]", at, k)
			bf, err := object(item, bp)
			if err != nil {
				return r, err
			}
			if err := allow(bf, bp+".", "model", "weight"); err != nil {
				return r, err
			}
			if err := field(bf, "model", &r.Backends[k].Model, bp, "a string"); err != nil {
				return r, err
			}
			if err := field(bf, "weight", &r.Backends[k].Weight, bp, "a number"); err != nil {
				return r, err
			}
		}
	}
	if raw, ok := f["cascade"]; ok && !isNull(raw) {
		items, err := array(raw, at+".cascade")
		if err != nil {
			return r, err
		}
		r.Cascade = make([]Step, len(items))
		for k, item := range items {
			sp := fmt.Sprintf("%s.cascade[%d]", at, k)
			sf, err := object(item, sp)
			if err != nil {
				return r, err
			}
			if err := allow(sf, sp+".", "model", "accept_if"); err != nil {
				return r, err
			}
			if err := field(sf, "model", &r.Cascade[k].Model, sp, "a string"); err != nil {
				return r, err
			}
			if err := field(sf, "accept_if", &r.Cascade[k].AcceptIf, sp, "a string"); err != nil {
				return r, err
			}
		}
	}
	return r, nil
}

// MaxJSONDepth is how deeply a route table body may nest arrays and
// objects; a table needs five levels ({"routes":[{"cascade":[{...}]}]}).
const MaxJSONDepth = 32

// wellFormed checks that b is one JSON value, nested at most MaxJSONDepth
// deep, with nothing after it, naming what is wrong in the table's words
// rather than the JSON decoder's.
func wellFormed(b []byte) error {
	if len(bytes.TrimSpace(b)) == 0 {
		return fmt.Errorf("%w: body: empty", ErrBadJSON)
	}
	if tooDeep(b, MaxJSONDepth) {
		return fmt.Errorf("%w: body: nested more than %d levels deep (a route table needs 5)", ErrBadJSON, MaxJSONDepth)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	var v json.RawMessage
	if err := dec.Decode(&v); err != nil {
		return fmt.Errorf("%w: body: %s", ErrBadJSON, syntaxProblem(err))
	}
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("%w: body: trailing data after the object", ErrBadJSON)
	}
	return nil
}

// tooDeep reports whether b nests arrays and objects more than max deep.
func tooDeep(b []byte, max int) bool {
	depth, inString, escaped := 0, false, false
	for _, c := range b {
		switch {
		case escaped:
			escaped = false
		case inString:
			switch c {
			case '\\':
				escaped = true
			case '"':
				inString = false
			}
		case c == '"':
			inString = true
		case c == '[' || c == '{':
			if depth++; depth > max {
				return true
			}
		case c == ']' || c == '}':
			depth--
		}
	}
	return false
}

// syntaxProblem says what the JSON decoder's err found.
func syntaxProblem(err error) string {
	var se *json.SyntaxError
	switch {
	case errors.As(err, &se):
		return fmt.Sprintf("not valid JSON (at byte %d)", se.Offset)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "not valid JSON: it ends inside a value"
	}
	return "not valid JSON"
}

// object decodes raw as one JSON object into its fields, rejecting
// duplicate keys and trailing data.
func object(raw []byte, path string) (map[string]json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	tok, err := dec.Token()
	if err == io.EOF {
		return nil, fmt.Errorf("%w: %s: empty", ErrBadJSON, path)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %s", ErrBadJSON, path, syntaxProblem(err))
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, fmt.Errorf("%w: %s: want an object, got %s", ErrBadJSON, path, kind(raw))
	}
	fields := make(map[string]json.RawMessage)
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %s", ErrBadJSON, path, syntaxProblem(err))
		}
		key := tok.(string) // object keys are always strings
		var val json.RawMessage
		if err := dec.Decode(&val); err != nil {
			return nil, fmt.Errorf("%w: %s: %s", ErrBadJSON, join(path, key), syntaxProblem(err))
		}
		if _, dup := fields[key]; dup {
			return nil, fmt.Errorf("%w: %s: duplicate field", ErrBadJSON, join(path, key))
		}
		fields[key] = val
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return nil, fmt.Errorf("%w: %s: %s", ErrBadJSON, path, syntaxProblem(err))
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("%w: %s: trailing data after the object", ErrBadJSON, path)
	}
	return fields, nil
}

// array decodes raw as a JSON list (null is an empty one).
func array(raw json.RawMessage, path string) ([]json.RawMessage, error) {
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, fmt.Errorf("%w: %s: want a list, got %s", ErrBadJSON, path, kind(raw))
	}
	return items, nil
}

// allow rejects any field not named in known, reporting the first unknown
// one in sorted order.
func allow(fields map[string]json.RawMessage, prefix string, known ...string) error {
	var unknown []string
	for k := range fields {
		if !slices.Contains(known, k) {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	sort.Strings(unknown)
	return fmt.Errorf("%w: %s%s: unknown field (known: %s)", ErrBadJSON, prefix, echo.Clip(unknown[0]), strings.Join(known, ", "))
}

// field decodes fields[name] into dst when present and not null.
func field(fields map[string]json.RawMessage, name string, dst any, at, want string) error {
	raw, ok := fields[name]
	if !ok || isNull(raw) {
		return nil
	}
	return decode(raw, dst, at+"."+name, want)
}

func decode(raw json.RawMessage, dst any, path, want string) error {
	if err := json.Unmarshal(raw, dst); err != nil {
		return fmt.Errorf("%w: %s: want %s, got %s", ErrBadJSON, path, want, kind(raw))
	}
	return nil
}

func isNull(raw json.RawMessage) bool { return string(bytes.TrimSpace(raw)) == "null" }

// join names a field of the value at path; a key too long to repeat is
// cut (echo.Clip).
func join(path, key string) string {
	key = echo.Clip(key)
	if path == "body" {
		return key
	}
	return path + "." + key
}

// kind describes a JSON value for an error: its raw text when short, else
// its type.
func kind(raw []byte) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) <= 40 {
		return string(raw)
	}
	switch raw[0] {
	case '{':
		return "an object"
	case '[':
		return "a list"
	case '"':
		return "a long string"
	}
	return "a long value"
}
