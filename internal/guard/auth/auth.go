// Package auth checks API keys presented as "Authorization: Bearer <key>"
// against configured keys with scopes (inference, debug, admin). Keys are
// kept only as SHA-256 digests and compared in constant time.
package auth

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync/atomic"
	"time"

	"github.com/tlgate/tlgate/internal/wire/openai"
)

// Scope is a permission a key carries.
type Scope string

// The scopes: inference for the OpenAI API, debug for diagnostics such as
// X-TL-Route, admin for /admin/v1, trace for a client whose traceparent's
// sampled flag is honoured.
const (
	ScopeInference Scope = "inference"
	ScopeDebug     Scope = "debug"
	ScopeAdmin     Scope = "admin"
	ScopeTrace     Scope = "trace"
)

// AllScopes returns every scope, in a fixed order.
func AllScopes() []Scope { return []Scope{ScopeInference, ScopeDebug, ScopeAdmin, ScopeTrace} }

func known(s Scope) bool {
	return s == ScopeInference || s == ScopeDebug || s == ScopeAdmin || s == ScopeTrace
}

var (
	// ErrMissingKey is returned when a request carries no Authorization header.
	ErrMissingKey = errors.New("auth: missing API key")
	// ErrInvalidKey is returned when the header is not "Bearer <key>" or the
	// key matches no configured key.
	ErrInvalidKey = errors.New("auth: invalid API key")
	// ErrNotBearer wraps ErrInvalidKey for an Authorization header that is
	// not "Bearer <key>" (a key without its scheme, another scheme).
	ErrNotBearer = fmt.Errorf("%w: the Authorization header is not \"Bearer <key>\"", ErrInvalidKey)
	// ErrBadSpec is wrapped by New for an invalid key specification.
	ErrBadSpec = errors.New("auth: invalid key specification")
	// ErrDuplicateHeader is returned when a request carries more than one
	// Authorization header: which one counts would depend on the reader.
	ErrDuplicateHeader = errors.New("auth: more than one Authorization header")
	// ErrConflictingKeys is returned when a request carries its key both in
	// Authorization and in the API's own key header, and they differ.
	ErrConflictingKeys = errors.New("auth: two different credentials")
	// ErrAuthOff is returned by Replace for no keys while keys are
	// configured.
	ErrAuthOff = errors.New("auth: a reload cannot turn authentication off (no api_keys left); restart the gateway for that")
)

// KeySpec configures one key: its secret given plainly (already resolved
// from the environment) or as the hex SHA-256 of the secret, never both.
type KeySpec struct {
	Name   string
	Secret string
	SHA256 string
	Scopes []string
	// IsolateCache salts every request of the key (Key.CacheSalt).
	IsolateCache bool
	// Admission is the key's place in the admission queue.
	Admission Admission
}

// Admission is a key's place in the admission queue: its default
// priority (nil: its routes'), the most any of its requests may have (nil:
// its x-tlgate-priority header may lower a request, never raise it), its
// default TTFT objective (0: its routes'), and whether its requests wait
// when their objective can no longer be met instead of being refused.
type Admission struct {
	Priority, MaxPriority *int
	Objective             time.Duration
	ServeLate             bool
}

// Key is an authenticated caller: the configured key's name and scopes.
type Key struct {
	Name string
	// Anonymous is true when authentication is off (no keys configured).
	Anonymous bool
	// Scopes is shared with the Keyring: read it, never modify it.
	Scopes []Scope
	// IsolateCache: every request of the key is salted (CacheSalt), as if
	// it sent a cache_salt, so that it shares no prefix cache with
	// another key's.
	IsolateCache bool
	// Admission is the key's priorities and objective (KeySpec.Admission).
	Admission Admission
	// digest is the SHA-256 of the key's secret: the secret of its cache
	// salts.
	digest [sha256.Size]byte
}

// Has reports whether the key carries scope s.
func (k Key) Has(s Scope) bool { return slices.Contains(k.Scopes, s) }

// AnonymousKey is the key of every request when no keys are configured:
// every scope.
func AnonymousKey() Key {
	return Key{Name: "anonymous", Anonymous: true, Scopes: AllScopes()}
}

type entry struct {
	digest [sha256.Size]byte
	key    Key
}

// Keyring holds the configured keys. It is safe for concurrent use; its
// keys change only as a whole, by Replace, which every copy made by
// WithOnReject sees.
type Keyring struct {
	cur *atomic.Pointer[[]entry]
	// onReject, when set, is told of every request Require refuses.
	onReject func(r *http.Request, status int, code string)
}

// WithOnReject returns a copy of k whose Require calls f (which must not
// block) with the status and error code of every request it refuses.
func (k *Keyring) WithOnReject(f func(r *http.Request, status int, code string)) *Keyring {
	c := *k
	c.onReject = f
	return &c
}

// New validates specs and builds a Keyring. Every key needs a unique
// non-empty name, exactly one of Secret and SHA256 (64 hex digits), and at
// least one known scope; two keys may not share a secret. Errors name the key,
// never its secret. No specs gives a Keyring with authentication off.
func New(specs []KeySpec) (*Keyring, error) {
	entries, err := buildEntries(specs)
	if err != nil {
		return nil, err
	}
	kr := &Keyring{cur: new(atomic.Pointer[[]entry])}
	kr.cur.Store(&entries)
	return kr, nil
}

// Replace puts the keys of specs, validated as New does, in place of the
// current ones, for every request authenticated from then on. It refuses,
// changing nothing, specs that New would refuse, and no specs at all while
// keys are configured (ErrAuthOff): turning authentication off is for a
// restart, which checks that every listener is on loopback.
func (k *Keyring) Replace(specs []KeySpec) error {
	entries, err := k.replacement(specs)
	if err != nil {
		return err
	}
	k.cur.Store(&entries)
	return nil
}

// Check reports the error Replace would return for specs, changing
// nothing: a reload that changes more than the keys checks them all first.
func (k *Keyring) Check(specs []KeySpec) error {
	_, err := k.replacement(specs)
	return err
}

// replacement is the entries Replace would install for specs.
func (k *Keyring) replacement(specs []KeySpec) ([]entry, error) {
	entries, err := buildEntries(specs)
	if err != nil {
		return nil, err
	}
	if len(entries) == 0 && k.Enabled() {
		return nil, ErrAuthOff
	}
	return entries, nil
}

// buildEntries validates specs (see New) into the keyring's entries.
func buildEntries(specs []KeySpec) ([]entry, error) {
	entries := make([]entry, 0, len(specs))
	names := make(map[string]bool, len(specs))
	for i, s := range specs {
		e, err := newEntry(s)
		if err != nil {
			return nil, fmt.Errorf("%w: api_keys[%d] (%q): %s", ErrBadSpec, i, s.Name, err)
		}
		if names[s.Name] {
			return nil, fmt.Errorf("%w: api_keys[%d]: name %q is used twice", ErrBadSpec, i, s.Name)
		}
		names[s.Name] = true
		for _, o := range entries {
			if o.digest == e.digest {
				return nil, fmt.Errorf("%w: api_keys[%d] (%q): same secret as %q", ErrBadSpec, i, s.Name, o.key.Name)
			}
		}
		entries = append(entries, e)
	}
	return entries, nil
}

func newEntry(s KeySpec) (entry, error) {
	var e entry
	if s.Name == "" {
		return e, errors.New("name is required")
	}
	switch {
	case s.Secret != "" && s.SHA256 != "":
		return e, errors.New("give the secret or its sha256, not both")
	case s.Secret != "":
		e.digest = sha256.Sum256([]byte(s.Secret))
	case s.SHA256 != "":
		b, err := hex.DecodeString(s.SHA256)
		if err != nil || len(b) != sha256.Size {
			return e, errors.New("sha256 must be 64 hex digits")
		}
		copy(e.digest[:], b)
	default:
		return e, errors.New("a secret or its sha256 is required")
	}
	if len(s.Scopes) == 0 {
		return e, errors.New("at least one scope is required")
	}
	e.key.Name = s.Name
	e.key.IsolateCache = s.IsolateCache
	e.key.Admission = s.Admission
	e.key.digest = e.digest
	for _, sc := range s.Scopes {
		if !known(Scope(sc)) {
			return e, fmt.Errorf("unknown scope %q (want inference, debug or admin)", sc)
		}
		if !e.key.Has(Scope(sc)) {
			e.key.Scopes = append(e.key.Scopes, Scope(sc))
		}
	}
	return e, nil
}

// Enabled reports whether keys are configured. When false every request is
// the AnonymousKey; the composition root allows that only on loopback.
func (k *Keyring) Enabled() bool { return len(*k.cur.Load()) > 0 }

// Authenticate reads "Authorization: Bearer <key>" and returns the matching
// key: ErrMissingKey without the header, ErrInvalidKey for any other header
// or an unknown key. The presented key's SHA-256 is compared with every
// stored digest in constant time, without stopping at a match, so timing
// reveals neither whether nor which key matched. With no keys configured it
// returns the AnonymousKey.
func (k *Keyring) Authenticate(r *http.Request) (Key, error) {
	return k.authenticate(r, "")
}

// authenticate is Authenticate, the key also accepted in header alt (when
// not empty) instead of Authorization: one credential only, so both headers
// with different keys is ErrConflictingKeys.
func (k *Keyring) authenticate(r *http.Request, alt string) (Key, error) {
	if len(r.Header.Values("Authorization")) > 1 || alt != "" && len(r.Header.Values(alt)) > 1 {
		return Key{}, ErrDuplicateHeader
	}
	var altToken string
	if alt != "" {
		altToken = r.Header.Get(alt)
	}
	h := r.Header.Get("Authorization")
	token, bearer := BearerToken(h)
	if h != "" && altToken != "" && (!bearer || token != altToken) {
		return Key{}, ErrConflictingKeys
	}
	entries := *k.cur.Load() // one set of keys for the whole check
	if len(entries) == 0 {
		return AnonymousKey(), nil
	}
	switch {
	case h == "" && altToken == "":
		return Key{}, ErrMissingKey
	case h == "":
		token = altToken
	case !bearer:
		return Key{}, ErrNotBearer
	}
	digest := sha256.Sum256([]byte(token))
	found := 0
	match := 0
	for i := range entries {
		eq := subtle.ConstantTimeCompare(digest[:], entries[i].digest[:])
		match = subtle.ConstantTimeSelect(eq, i, match)
		found |= eq
	}
	if found == 0 {
		return Key{}, ErrInvalidKey
	}
	return entries[match].key, nil
}

// Require wraps next so that it runs only for a key with scope: a missing or
// invalid key is answered 401 invalid_api_key, a key without the scope 403
// insufficient_scope, both in OpenAI's error shape. next finds the key in
// the request's context (FromContext).
func (k *Keyring) Require(scope Scope, next http.Handler) http.Handler {
	return k.RequireWith(scope, RequireOptions{}, next)
}

// RequireOptions adapt Require to an API other than OpenAI's.
type RequireOptions struct {
	// KeyHeader, when set, is a header that may carry the key instead of
	// Authorization: Bearer (Anthropic's "X-Api-Key").
	KeyHeader string
	// WriteError writes a refusal; nil: OpenAI's error shape.
	WriteError func(w http.ResponseWriter, status int, code, msg string)
}

// RequireWith is Require with the options o.
func (k *Keyring) RequireWith(scope Scope, o RequireOptions, next http.Handler) http.Handler {
	how := "Authorization: Bearer <key>"
	if o.KeyHeader != "" {
		how += " or " + o.KeyHeader + ": <key>"
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key, err := k.authenticate(r, o.KeyHeader)
		refuse := func(status int, code, msg string) {
			if k.onReject != nil {
				k.onReject(r, status, code)
			}
			if o.WriteError != nil {
				o.WriteError(w, status, code, msg)
				return
			}
			openai.WriteError(w, status, code, msg, nil)
		}
		switch {
		case errors.Is(err, ErrDuplicateHeader):
			msg := "The request has more than one Authorization header: send exactly one."
			if o.KeyHeader != "" {
				msg = fmt.Sprintf("The request has more than one Authorization or %s header: send exactly one.", o.KeyHeader)
			}
			refuse(http.StatusBadRequest, openai.CodeInvalidRequest, msg)
			return
		case errors.Is(err, ErrConflictingKeys):
			refuse(http.StatusBadRequest, openai.CodeInvalidRequest,
				fmt.Sprintf("The request carries two different credentials (Authorization and %s): send exactly one.", o.KeyHeader))
			return
		case errors.Is(err, ErrMissingKey):
			w.Header().Set("WWW-Authenticate", `Bearer realm="tlgate"`)
			refuse(http.StatusUnauthorized, openai.CodeInvalidAPIKey, "Missing API key: send it as "+how+".")
			return
		case errors.Is(err, ErrNotBearer):
			w.Header().Set("WWW-Authenticate", `Bearer realm="tlgate", error="invalid_request"`)
			refuse(http.StatusUnauthorized, openai.CodeInvalidAPIKey,
				"The Authorization header is not \"Bearer <key>\": send the key as "+how+".")
			return
		case err != nil:
			w.Header().Set("WWW-Authenticate", `Bearer realm="tlgate", error="invalid_token"`)
			refuse(http.StatusUnauthorized, openai.CodeInvalidAPIKey, "Invalid API key.")
			return
		case !key.Has(scope):
			refuse(http.StatusForbidden, openai.CodeInsufficientScope,
				fmt.Sprintf("This API key lacks the %q scope.", scope))
			return
		}
		next.ServeHTTP(w, r.WithContext(NewContext(r.Context(), key)))
	})
}

type ctxKey struct{}

// NewContext returns ctx carrying key.
func NewContext(ctx context.Context, key Key) context.Context {
	return context.WithValue(ctx, ctxKey{}, key)
}

// FromContext returns the key Require put in ctx.
func FromContext(ctx context.Context) (Key, bool) {
	k, ok := ctx.Value(ctxKey{}).(Key)
	return k, ok
}
