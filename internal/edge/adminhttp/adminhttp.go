// Package adminhttp is the admin API's HTTP edge: it authenticates (the
// admin scope), decodes, asks the admin or router actor, and encodes the
// answer. It decides nothing itself.
//
//	GET  /admin/v1/workers                 {"epoch":N,"workers":[...]}
//	GET  /admin/v1/routes                  {"epoch":N,"routes":[...]}, ETag: "N"
//	PUT  /admin/v1/routes                  If-Match required; 200 with the new body, its warnings and ETag
//	PUT  /admin/v1/routes?dry_run=true     the same checks, nothing changed: the table, its changes and warnings
//	POST /admin/v1/models/{model}:drain    202 {"model":...,"drained":[...],"workers":n}
//	POST /admin/v1/models/{model}:resume   202 {"model":...,"resumed":[...],"workers":n}
//	POST /admin/v1/workers/{id}:lift-ejection  200 {"worker":...,"lifted":bool,"fleet":bool}
//	GET  /admin/v1/traffic                 the last 15 minutes per model (when Deps.Traffic is set)
//
// Errors are OpenAI-shaped: 400 invalid_routes (param names the bad
// field), 401 invalid_api_key, 403 insufficient_scope or cross_origin (a
// write whose Origin header is another site's), 404 model_not_found
// or not_found, 405 method_not_allowed, 412 etag_mismatch, 413
// request_too_large, 428 if_match_required, 500 internal_error, 503
// unavailable (an actor did not answer in time), 503 store_unavailable
// with Retry-After (the shared route store cannot be reached; routing goes
// on with the table in force, and the message says whether the write was
// not made or its outcome is unknown).
package adminhttp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/tlgate/tlgate/actors/admin"
	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/internal/adapter/traffic"
	"github.com/tlgate/tlgate/internal/guard/auth"
	"github.com/tlgate/tlgate/internal/routing/echo"
	"github.com/tlgate/tlgate/internal/routing/routes"
	"github.com/tlgate/tlgate/internal/wire/openai"
)

// Error codes of the admin API beyond those of package openai.
const (
	CodeNotFound         = "not_found"
	CodeMethodNotAllowed = openai.CodeMethodNotAllowed
	CodeInternal         = "internal_error"
	CodeUnavailable      = "unavailable"
	CodeEpochExhausted   = "epoch_exhausted"
	CodeStoreUnavailable = "store_unavailable"
	// CodeCrossOrigin: a write whose Origin is another site (403).
	CodeCrossOrigin = "cross_origin"
)

// StoreRetryAfter is the Retry-After (seconds) of a store_unavailable.
const StoreRetryAfter = "2"

// Defaults for zero Deps fields.
const (
	DefaultMaxBodyBytes = 1 << 20
	// DefaultTimeout is longer than admin.DefaultAskTimeout, so a drain
	// whose registry does not answer reports that rather than a timeout.
	DefaultTimeout = 5 * time.Second
)

// Deps is what the edge needs.
type Deps struct {
	// Root sends the requests (RequestFuture with Timeout).
	Root *actor.RootContext
	// Admin answers GetRoutes, PutRoutes and Drain; Router answers
	// ListWorkers.
	Admin, Router *actor.PID
	// Keyring guards every path with the admin scope; it must not be nil
	// (auth.New(nil) is the keyring with authentication off).
	Keyring *auth.Keyring
	// MaxBodyBytes bounds a PUT body (413 above); 0 means 1 MiB.
	MaxBodyBytes int64
	// Timeout bounds each question to an actor; 0 means DefaultTimeout.
	Timeout time.Duration
	// Traffic, when set, serves GET /admin/v1/traffic: the last 15
	// minutes per model (traffic.Snapshot), summed over this replica and
	// the other replicas' rings TrafficPeers returns (nil: this one's).
	Traffic      *traffic.Recorder
	TrafficPeers func(ctx context.Context) []traffic.Raw
}

// Worker is one worker as GET /admin/v1/workers lists it.
type Worker struct {
	ID            string `json:"id"`
	HTTPAddress   string `json:"http_address"`
	GRPCAddress   string `json:"grpc_address"`
	KVAddress     string `json:"kv_address"`
	Role          string `json:"role"`
	Model         string `json:"model"`
	KVFormat      uint32 `json:"kv_format"`
	QueueDepth    int    `json:"queue_depth"`
	Running       int    `json:"running"`
	KVFreeBlocks  int    `json:"kv_free_blocks"`
	KVTotalBlocks int    `json:"kv_total_blocks"`
	KVBlockTokens int    `json:"kv_block_tokens"`
	// Adapters are the LoRA adapters loaded on the worker.
	Adapters []string `json:"adapters,omitempty"`
	// Draining is the engine's own report; Drained says an operator
	// drained its model.
	Draining bool `json:"draining"`
	Drained  bool `json:"drained"`
	// InFlight is this replica's requests on the worker, PeerInFlight the
	// other replicas' (fleet sync; 0 with sync off).
	InFlight     int  `json:"in_flight"`
	PeerInFlight int  `json:"peer_in_flight"`
	Routable     bool `json:"routable"`
	// State says why it is or is not routable: routable, suspect,
	// ejected, draining, drained, stale, or down (a probed engine whose
	// probes fail: LastError says why, DownSince since when).
	State     string `json:"state"`
	LastError string `json:"last_error,omitempty"`
	DownSince string `json:"down_since,omitempty"`
	// LastHeartbeat is RFC 3339 (UTC, with fractional seconds), absent
	// for a down engine never heard from; StartedAt likewise, absent when
	// the engine did not say.
	LastHeartbeat string `json:"last_heartbeat,omitempty"`
	StartedAt     string `json:"started_at,omitempty"`
	// Source is heartbeat or probe; Kind the probed engine's kind.
	Source string `json:"source"`
	Kind   string `json:"kind"`
	// PrefixIndexChunks is the worker's share of the cache_aware prefix
	// index in chunks (0 under other policies).
	PrefixIndexChunks int `json:"prefix_index_chunks"`
	// CacheView is how cache_aware sees the worker's KV cache: exact (from
	// its KV events), stale (its events were lost or are late: routed on
	// the prefix index until they flow again) or approximate (the prefix
	// index). KVBlocks are the blocks its exact view holds per tier;
	// KVEvents is its events' PUB endpoint ("" when it publishes none).
	CacheView string         `json:"cache_view"`
	KVBlocks  map[string]int `json:"kv_blocks,omitempty"`
	KVEvents  string         `json:"kv_events,omitempty"`
	// EjectedUntil (RFC 3339) and EjectionReason are set while passive
	// health keeps the worker out; Ejections counts its ejections.
	// ConcurrencyLimit is admission control's in-flight limit (0: none).
	EjectedUntil     string `json:"ejected_until,omitempty"`
	EjectionReason   string `json:"ejection_reason,omitempty"`
	Ejections        int    `json:"ejections"`
	ConcurrencyLimit int    `json:"concurrency_limit"`
	// ConsecutiveFailures are its attempt failures in a row since its last
	// answer; while > 0 (and not ejected) it takes one request at a time.
	ConsecutiveFailures int `json:"consecutive_failures"`
}

// WorkersBody is the body of GET /admin/v1/workers.
type WorkersBody struct {
	Epoch   uint64   `json:"epoch"`
	Workers []Worker `json:"workers"`
	// Queued is the number of requests waiting per model queue
	// (admission control); absent when none waits. QueuedBands is the
	// same per priority band (highest first) and API key.
	Queued      map[string]int                `json:"queued,omitempty"`
	QueuedBands map[string][]router.QueueBand `json:"queued_bands,omitempty"`
}

// DrainBody is the body of a 202 drain or resume: the model named and the
// served models acted on (Drained for :drain, Resumed for :resume), with
// the number of known workers serving them.
type DrainBody struct {
	Model   string   `json:"model"`
	Drained []string `json:"drained,omitempty"`
	Resumed []string `json:"resumed,omitempty"`
	Workers int      `json:"workers"`
}

// New returns the admin API handler. It serves the /admin/v1/ paths; mount
// it at "/admin/v1/". Every path, including unknown ones, needs a key with
// the admin scope.
func New(d Deps) http.Handler {
	if d.Keyring == nil {
		panic("adminhttp: Deps.Keyring is nil; use auth.New(nil) to run without keys")
	}
	if d.MaxBodyBytes <= 0 {
		d.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if d.Timeout <= 0 {
		d.Timeout = DefaultTimeout
	}
	h := &handler{d: d}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /admin/v1/workers", h.workers)
	mux.HandleFunc("GET /admin/v1/routes", h.getRoutes)
	mux.HandleFunc("PUT /admin/v1/routes", h.putRoutes)
	// ServeMux cannot match "{model}:drain" inside one segment: match the
	// rest of the path (model ids may hold '/') and split at the last ':'.
	mux.HandleFunc("POST /admin/v1/models/{target...}", h.drain)
	mux.HandleFunc("POST /admin/v1/workers/{target...}", h.liftEjection)
	if d.Traffic != nil {
		mux.HandleFunc("GET /admin/v1/traffic", func(w http.ResponseWriter, r *http.Request) {
			var peers []traffic.Raw
			if d.TrafficPeers != nil {
				peers = d.TrafficPeers(r.Context())
			}
			writeJSON(w, http.StatusOK, d.Traffic.SnapshotWith(peers))
		})
		mux.Handle("/admin/v1/traffic", openai.MethodNotAllowed("GET, HEAD"))
	}
	mux.Handle("/admin/v1/workers", openai.MethodNotAllowed("GET, HEAD"))
	mux.Handle("/admin/v1/routes", openai.MethodNotAllowed("GET, HEAD, PUT"))
	mux.Handle("/admin/v1/models/", openai.MethodNotAllowed("POST"))
	mux.Handle("/admin/v1/workers/", openai.MethodNotAllowed("POST"))
	mux.HandleFunc("/admin/v1/", func(w http.ResponseWriter, r *http.Request) {
		openai.WriteError(w, http.StatusNotFound, CodeNotFound, fmt.Sprintf("No admin endpoint %s %s.", echo.Clip(r.Method), echo.Clip(r.URL.Path)), nil)
	})
	return d.Keyring.Require(auth.ScopeAdmin, sameOrigin(mux))
}

// sameOrigin refuses (403 cross_origin) a write (any method but GET and
// HEAD) whose Origin header names another host than the request's own
// Host: a web page of another site, which a browser lets send a body-less
// POST without asking the gateway first. Without API keys (loopback) such
// a page could otherwise drain a model. tlctl sends no Origin, the
// console's own pages send the gateway's; the scheme is not compared, so
// that a console behind a TLS-terminating proxy still works.
func sameOrigin(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			if o := r.Header.Values("Origin"); len(o) > 0 && !originIsHost(o, r.Host) {
				openai.WriteError(w, http.StatusForbidden, CodeCrossOrigin,
					fmt.Sprintf("Admin writes from another site are refused: Origin %q is not this gateway (%q).", echo.Clip(strings.Join(o, ", ")), echo.Clip(r.Host)), nil)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// originIsHost reports whether origin (the Origin header's values) is one
// serialized origin, scheme://host[:port], whose host[:port] is host.
func originIsHost(origin []string, host string) bool {
	if len(origin) != 1 || host == "" {
		return false
	}
	u, err := url.Parse(origin[0])
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" ||
		u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
		return false
	}
	return strings.EqualFold(u.Host, host)
}

type handler struct{ d Deps }

// ask sends msg to pid and waits for the answer; a timeout is answered
// 503 here, and ok is false.
func (h *handler) ask(w http.ResponseWriter, pid *actor.PID, msg any) (res any, ok bool) {
	res, err := h.d.Root.RequestFuture(pid, msg, h.d.Timeout).Result()
	if err != nil {
		openai.WriteError(w, http.StatusServiceUnavailable, CodeUnavailable,
			fmt.Sprintf("The gateway did not answer in time (%v); try again.", err), nil)
		return nil, false
	}
	return res, true
}

func (h *handler) workers(w http.ResponseWriter, r *http.Request) {
	res, ok := h.ask(w, h.d.Router, &router.ListWorkers{})
	if !ok {
		return
	}
	wr, ok := res.(*router.WorkersResult)
	if !ok {
		internal(w, res)
		return
	}
	body := WorkersBody{Epoch: wr.Epoch, Workers: make([]Worker, len(wr.Workers)), Queued: wr.Queued, QueuedBands: wr.Bands}
	for i, v := range wr.Workers {
		body.Workers[i] = workerOf(v)
	}
	writeJSON(w, http.StatusOK, body)
}

func workerOf(v router.WorkerView) Worker {
	out := Worker{
		ID: v.ID, HTTPAddress: v.HTTPAddress, GRPCAddress: v.GRPCAddress, KVAddress: v.KVAddress,
		Role: string(v.Role), Model: v.Model, KVFormat: v.KVFormat,
		QueueDepth: v.QueueDepth, Running: v.Running,
		KVFreeBlocks: v.KVFreeBlocks, KVTotalBlocks: v.KVTotalBlocks, KVBlockTokens: v.KVBlockTokens,
		Adapters: v.Adapters, Draining: v.Draining, Drained: v.Drained,
		InFlight: v.InFlight, PeerInFlight: v.PeerInFlight, Routable: v.Routable,
		State: v.State, LastError: v.LastError,
		Source: v.Source, Kind: v.Kind,
		PrefixIndexChunks: v.PrefixIndexChunks,
		CacheView:         v.CacheView, KVBlocks: v.KVBlocks, KVEvents: v.KVEvents.Endpoint,
	}
	if !v.LastHeartbeat.IsZero() {
		out.LastHeartbeat = v.LastHeartbeat.UTC().Format(time.RFC3339Nano)
	}
	if !v.DownSince.IsZero() {
		out.DownSince = v.DownSince.UTC().Format(time.RFC3339Nano)
	}
	if !v.StartedAt.IsZero() {
		out.StartedAt = v.StartedAt.UTC().Format(time.RFC3339Nano)
	}
	if !v.EjectedUntil.IsZero() {
		out.EjectedUntil, out.EjectionReason = v.EjectedUntil.UTC().Format(time.RFC3339Nano), v.EjectionReason
	}
	out.Ejections, out.ConcurrencyLimit, out.ConsecutiveFailures = v.Ejections, v.ConcurrencyLimit, v.ConsecutiveFailures
	return out
}

func (h *handler) getRoutes(w http.ResponseWriter, r *http.Request) {
	res, ok := h.ask(w, h.d.Admin, &admin.GetRoutes{})
	if !ok {
		return
	}
	rr, ok := res.(*admin.RoutesResult)
	if !ok {
		internal(w, res)
		return
	}
	h.writeRoutes(w, rr.Epoch, rr.Routes)
}

func (h *handler) writeRoutes(w http.ResponseWriter, epoch uint64, rs []routes.Route) {
	b, err := routes.EncodeJSON(epoch, rs)
	if err != nil {
		openai.WriteError(w, http.StatusInternalServerError, CodeInternal, err.Error(), nil)
		return
	}
	w.Header().Set("ETag", admin.ETag(epoch))
	writeBody(w, http.StatusOK, b)
}

// PutBody is the body of a PUT's 200: the table installed (or, for a dry
// run, the one that would be) with its epoch (a dry run's: the one in
// force), and what the table likely gets wrong; a dry run also lists the
// routes it would add, remove and change.
type PutBody struct {
	DryRun   bool             `json:"dry_run,omitempty"`
	Epoch    uint64           `json:"epoch"`
	Routes   []routes.Route   `json:"routes"`
	Changes  []routes.Change  `json:"changes,omitzero"`
	Warnings []routes.Warning `json:"warnings,omitempty"`
}

// writePut answers a PUT's success: the table with its warnings, and a
// dry run's changes (a list, empty when none).
func (h *handler) writePut(w http.ResponseWriter, pr *admin.PutResult) {
	body := PutBody{DryRun: pr.DryRun, Epoch: pr.Epoch, Routes: pr.Routes, Changes: pr.Changes, Warnings: pr.Warnings}
	if body.Routes == nil {
		body.Routes = []routes.Route{}
	}
	if pr.DryRun && body.Changes == nil {
		body.Changes = []routes.Change{}
	}
	b, err := json.Marshal(body)
	if err != nil {
		openai.WriteError(w, http.StatusInternalServerError, CodeInternal, err.Error(), nil)
		return
	}
	w.Header().Set("ETag", admin.ETag(pr.Epoch))
	writeBody(w, http.StatusOK, b)
}

func (h *handler) putRoutes(w http.ResponseWriter, r *http.Request) {
	dry := false
	switch v := r.URL.Query().Get("dry_run"); v {
	case "", "false", "0":
	case "true", "1":
		dry = true
	default:
		param := "dry_run"
		openai.WriteError(w, http.StatusBadRequest, openai.CodeInvalidRequest, fmt.Sprintf("dry_run must be true or false, got %q.", v), &param)
		return
	}
	if r.ContentLength > h.d.MaxBodyBytes {
		tooLarge(w, h.d.MaxBodyBytes)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.d.MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			tooLarge(w, h.d.MaxBodyBytes)
			return
		}
		openai.WriteError(w, http.StatusBadRequest, openai.CodeInvalidRequest, fmt.Sprintf("Could not read the body: %v.", err), nil)
		return
	}
	key, _ := auth.FromContext(r.Context())
	res, ok := h.ask(w, h.d.Admin, &admin.PutRoutes{
		Body:    body,
		IfMatch: strings.Join(r.Header.Values("If-Match"), ", "),
		KeyName: key.Name,
		DryRun:  dry,
	})
	if !ok {
		return
	}
	pr, ok := res.(*admin.PutResult)
	if !ok {
		internal(w, res)
		return
	}
	switch err := pr.Err; {
	case err == nil:
		h.writePut(w, pr)
	case errors.Is(err, admin.ErrIfMatchRequired):
		w.Header().Set("ETag", admin.ETag(pr.Epoch))
		openai.WriteError(w, http.StatusPreconditionRequired, openai.CodeIfMatchRequired, err.Error(), nil)
	case errors.Is(err, admin.ErrETagMismatch):
		w.Header().Set("ETag", admin.ETag(pr.Epoch))
		openai.WriteError(w, http.StatusPreconditionFailed, openai.CodeETagMismatch, err.Error(), nil)
	case errors.Is(err, admin.ErrInvalidRoutes):
		var param *string
		if p := admin.FieldPath(err); p != "" {
			param = &p
		}
		openai.WriteError(w, http.StatusBadRequest, openai.CodeInvalidRoutes, err.Error(), param)
	case errors.Is(err, admin.ErrEpochExhausted):
		openai.WriteError(w, http.StatusConflict, CodeEpochExhausted, err.Error(), nil)
	case errors.Is(err, admin.ErrStoreUnavailable):
		storeUnavailable(w, err)
	default:
		openai.WriteError(w, http.StatusInternalServerError, CodeInternal, err.Error(), nil)
	}
}

// drain serves POST /admin/v1/models/{model}:drain and :resume.
func (h *handler) drain(w http.ResponseWriter, r *http.Request) {
	target := r.PathValue("target")
	i := strings.LastIndexByte(target, ':')
	if i < 0 {
		openai.WriteError(w, http.StatusNotFound, CodeNotFound,
			fmt.Sprintf("No admin endpoint POST %s: use /admin/v1/models/{model}:drain or :resume.", echo.Clip(r.URL.Path)), nil)
		return
	}
	model, action := target[:i], target[i+1:]
	var on bool
	switch action {
	case "drain":
		on = true
	case "resume":
	default:
		openai.WriteError(w, http.StatusNotFound, CodeNotFound,
			fmt.Sprintf("Unknown model action %s: use :drain or :resume.", echo.Quote(action)), nil)
		return
	}
	if err := routes.CheckModelID(model); err != nil {
		openai.WriteError(w, http.StatusNotFound, openai.CodeModelNotFound, fmt.Sprintf("Model %s: %v.", echo.Quote(model), err), nil)
		return
	}
	key, _ := auth.FromContext(r.Context())
	res, ok := h.ask(w, h.d.Admin, &admin.Drain{Model: model, On: on, KeyName: key.Name})
	if !ok {
		return
	}
	dr, ok := res.(*admin.DrainResult)
	if !ok {
		internal(w, res)
		return
	}
	switch {
	case errors.Is(dr.Err, admin.ErrModelNotFound):
		openai.WriteError(w, http.StatusNotFound, openai.CodeModelNotFound, dr.Err.Error(), nil)
		return
	case errors.Is(dr.Err, admin.ErrStoreUnavailable):
		storeUnavailable(w, dr.Err)
		return
	case dr.Err != nil:
		openai.WriteError(w, http.StatusInternalServerError, CodeInternal, dr.Err.Error(), nil)
		return
	}
	body := DrainBody{Model: model, Workers: dr.Workers}
	if on {
		body.Drained = dr.Models
	} else {
		body.Resumed = dr.Models
	}
	writeJSON(w, http.StatusAccepted, body)
}

func storeUnavailable(w http.ResponseWriter, err error) {
	w.Header().Set("Retry-After", StoreRetryAfter)
	openai.WriteError(w, http.StatusServiceUnavailable, CodeStoreUnavailable, err.Error(), nil)
}

func tooLarge(w http.ResponseWriter, limit int64) {
	openai.WriteError(w, http.StatusRequestEntityTooLarge, openai.CodeRequestTooLarge,
		fmt.Sprintf("The body is larger than max_body_bytes (%d bytes).", limit), nil)
}

func internal(w http.ResponseWriter, res any) {
	openai.WriteError(w, http.StatusInternalServerError, CodeInternal, fmt.Sprintf("Unexpected answer %T.", res), nil)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		openai.WriteError(w, http.StatusInternalServerError, CodeInternal, err.Error(), nil)
		return
	}
	writeBody(w, status, b)
}

func writeBody(w http.ResponseWriter, status int, b []byte) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)+1))
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}
