package probe

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tlgate/tlgate/internal/routing/fleet"
	controlv1 "github.com/tlgate/tlgate/protos/tl/control/v1"
)

// DefaultTimeout bounds a whole probe (every request it makes) when
// Config.Timeout is zero: one heartbeat interval. An SGLang probe gets 1.5 s
// more, its health check taking a second at least (see KindSGLang).
const DefaultTimeout = 2 * time.Second

const (
	modelsPath  = "/v1/models"
	metricsPath = "/metrics"
	propsPath   = "/props"

	// maxMetricsBytes bounds a /metrics answer (a busy vLLM serves a few
	// hundred kilobytes of histograms).
	maxMetricsBytes = 16 << 20
	// maxJSONBytes bounds a /v1/models or /props answer.
	maxJSONBytes = 4 << 20
	// maxHealthBytes is how much of a health answer is read before the
	// connection is reused; the rest is dropped.
	maxHealthBytes = 64 << 10
)

// workerIDPattern is the worker id syntax of tl.control.v1.
var workerIDPattern = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,128}$`)

// Config describes one engine to probe.
type Config struct {
	// ID is the worker id reported as WorkerStatus.worker_id
	// ([A-Za-z0-9._:-]{1,128}).
	ID string
	// HTTPAddress is the engine's host:port (plain HTTP), or an http:// or
	// https:// URL with no path; WorkerStatus.http_address gets its host:port.
	HTTPAddress string
	// Model is the served model id, which GET /v1/models must list (a probe
	// of an engine serving another fails with ErrModelNotServed); empty
	// means discover it: the first id of GET /v1/models, kept while the
	// list names it and until a probe fails.
	Model string
	// Kind selects the health endpoint and the metric names.
	Kind Kind
	// AuthHeader, when not empty, is sent as the Authorization header of
	// every request, e.g. "Bearer sk-...".
	AuthHeader string
	// Client makes the requests; nil means http.DefaultClient.
	Client *http.Client
	// Timeout bounds a whole probe; zero means DefaultTimeout. A probe of
	// KindSGLang gets 1.5 s more, for its health check's generation.
	Timeout time.Duration
	// KVEvents is where the engine publishes its KV cache events, as
	// configured (a tcp endpoint with no host is on the engine's host);
	// reported as WorkerStatus.kv_events.
	KVEvents fleet.KVEvents
}

// Validate reports whether the config can be probed; the error wraps
// ErrInvalidConfig (or ErrUnknownKind) and names the field.
func (c Config) Validate() error {
	if _, _, err := splitAddress(c.HTTPAddress); err != nil {
		return err
	}
	switch {
	case !workerIDPattern.MatchString(c.ID):
		return fmt.Errorf("probe: %w: id %q must match [A-Za-z0-9._:-]{1,128}", ErrInvalidConfig, c.ID)
	case !c.Kind.Valid():
		return fmt.Errorf("probe: %w: kind: %w %q", ErrInvalidConfig, ErrUnknownKind, c.Kind)
	case c.Timeout < 0:
		return fmt.Errorf("probe: %w: timeout %v is negative", ErrInvalidConfig, c.Timeout)
	}
	return nil
}

// splitAddress returns the base URL requests go to and the host:port to
// report for an HTTPAddress.
func splitAddress(addr string) (base, hostport string, err error) {
	if strings.Contains(addr, "://") {
		u, perr := url.Parse(addr)
		switch {
		case perr != nil:
			return "", "", fmt.Errorf("probe: %w: http address: %w", ErrInvalidConfig, perr)
		case u.Scheme != "http" && u.Scheme != "https":
			return "", "", fmt.Errorf("probe: %w: http address %q: scheme must be http or https", ErrInvalidConfig, addr)
		case u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.User != nil:
			return "", "", fmt.Errorf("probe: %w: http address %q: want scheme://host:port only", ErrInvalidConfig, addr)
		}
		hostport = u.Host
		if u.Port() == "" {
			hostport = net.JoinHostPort(u.Hostname(), map[string]string{"http": "80", "https": "443"}[u.Scheme])
		}
		return u.Scheme + "://" + u.Host, hostport, nil
	}
	host, port, serr := net.SplitHostPort(addr)
	if serr != nil || host == "" || port == "" {
		return "", "", fmt.Errorf("probe: %w: http address %q: want host:port", ErrInvalidConfig, addr)
	}
	return "http://" + addr, addr, nil
}

// Result is everything one successful probe learned.
type Result struct {
	// Status is the heartbeat-equivalent status (never nil in a Result
	// returned without error).
	Status *controlv1.WorkerStatus
	// Figures are the figures behind Status, with the names of those that
	// fell back.
	Figures Figures
	// MetricsErr is why /metrics could not be used (unreachable, non-2xx,
	// malformed, too large), or nil. The engine answered its health check,
	// so the probe still succeeds: Status carries fallback figures.
	MetricsErr error
	// SkippedAdapters are the LoRA adapters the engine lists under its
	// model that Status leaves out, so that the status stays valid and the
	// engine keeps serving its model and its other adapters.
	SkippedAdapters []SkippedAdapter
}

// SkippedAdapter is a LoRA adapter a probe leaves out of the status.
type SkippedAdapter struct {
	ID     string
	Reason string // why: SkipInvalidID or SkipTooMany
}

// Reasons for leaving an adapter out.
const (
	// SkipInvalidID: the adapter's id is not a model id (vLLM's
	// /v1/load_lora_adapter takes any lora_name), so no request could
	// name it.
	SkipInvalidID = "not a valid model id"
	// SkipTooMany: the engine lists more than fleet.MaxAdapters adapters;
	// the first ones are kept.
	SkipTooMany = "more adapters than a worker may report"
)

// Prober probes one engine. Its methods are safe for concurrent use; it
// remembers the discovered model id and llama.cpp's context size between
// probes and forgets both when a probe fails (the engine may have been
// restarted with another model).
type Prober struct {
	cfg      Config
	base     string
	hostport string
	cfgErr   error
	client   *http.Client
	timeout  time.Duration

	mu        sync.Mutex
	model     string           // discovered model id, "" until known
	ctxTokens uint32           // llama.cpp n_ctx from /props, 0 until known
	adapters  []string         // LoRA adapters of the last /v1/models read
	skipped   []SkippedAdapter // and those it left out
	// For an engine that exports no start time: the counters of the last
	// probe that read them, and when one of them last went backwards
	// (the engine restarted; zero until then).
	counters  map[string]float64
	restarted time.Time
}

// New returns a Prober for cfg. An invalid cfg (see Config.Validate) makes
// every probe fail with that error.
func New(cfg Config) *Prober {
	p := &Prober{cfg: cfg, client: cfg.Client, timeout: cfg.Timeout, cfgErr: cfg.Validate()}
	if p.client == nil {
		p.client = http.DefaultClient
	}
	if p.timeout == 0 {
		p.timeout = DefaultTimeout
	}
	p.timeout += cfg.Kind.healthWait()
	if p.cfgErr == nil {
		p.base, p.hostport, _ = splitAddress(cfg.HTTPAddress)
	}
	return p
}

// Probe checks the engine's health, reads its metrics and returns the
// status a heartbeat would carry: worker_id, http_address, role UNIFIED,
// model, queue depth, running, KV figures and kv_block_tokens (16 for vLLM
// unless its cache_config_info says otherwise). It fails on a connection
// error, a non-2xx health answer, a failed model discovery, or the timeout;
// unusable metrics do not fail it (see Result.MetricsErr).
func (p *Prober) Probe(ctx context.Context) (*controlv1.WorkerStatus, error) {
	res, err := p.ProbeDetail(ctx)
	if err != nil {
		return nil, err
	}
	return res.Status, nil
}

// ProbeDetail is Probe returning also the figures and why metrics could
// not be used.
func (p *Prober) ProbeDetail(ctx context.Context) (Result, error) {
	if p.cfgErr != nil {
		return Result{}, p.cfgErr
	}
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	res, err := p.probe(ctx)
	if err != nil {
		p.mu.Lock()
		p.model, p.ctxTokens = "", 0
		p.mu.Unlock()
		return Result{}, fmt.Errorf("probe %s at %s: %w", p.cfg.ID, p.hostport, err)
	}
	return res, nil
}

func (p *Prober) probe(ctx context.Context) (Result, error) {
	limit := int64(maxHealthBytes)
	if p.cfg.Kind == KindOpenAI {
		limit = maxJSONBytes // the health answer is the model list
	}
	code, body, err := p.get(ctx, p.cfg.Kind.healthPath(), limit)
	if err != nil {
		return Result{}, fmt.Errorf("health: %w", err)
	}
	if code/100 != 2 {
		return Result{}, fmt.Errorf("health: GET %s: %w: %d", p.cfg.Kind.healthPath(), ErrUnhealthy, code)
	}
	var listed []byte
	if p.cfg.Kind == KindOpenAI {
		listed = body // the generic kind's health answer is the model list
	}
	modelID, adapters, skipped, err := p.models(ctx, listed)
	if err != nil {
		return Result{}, err
	}
	fig, merr := p.figures(ctx)
	if ctx.Err() != nil {
		return Result{}, fmt.Errorf("metrics: %w", context.Cause(ctx))
	}
	if fig.StartedAtUnixMs == 0 {
		fig.StartedAtUnixMs = p.incarnation(fig.Counters, time.Now())
	}
	return Result{
		Status: &controlv1.WorkerStatus{
			WorkerId:        p.cfg.ID,
			HttpAddress:     p.hostport,
			Role:            controlv1.Role_ROLE_UNIFIED,
			Model:           modelID,
			QueueDepth:      fig.QueueDepth,
			Running:         fig.Running,
			KvFreeBlocks:    fig.KVFreeBlocks,
			KvTotalBlocks:   fig.KVTotalBlocks,
			KvBlockTokens:   fig.BlockTokens,
			StartedAtUnixMs: fig.StartedAtUnixMs,
			LoraAdapters:    adapters,
			KvEvents:        kvEventsStatus(p.cfg.KVEvents),
		},
		Figures:         fig,
		MetricsErr:      merr,
		SkippedAdapters: skipped,
	}, nil
}

// incarnation stands in for the start time of an engine that exports none
// (llama.cpp's server): 0 until a counter of its /metrics goes backwards,
// then the time of the last probe that saw one do so (the engine
// restarted), in Unix milliseconds. Reported as started_at, it lets the
// gateway tell the restarted engine from the one it ejected.
func (p *Prober) incarnation(counters map[string]float64, now time.Time) uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if wentBackwards(p.counters, counters) {
		p.restarted = now
	}
	if len(counters) > 0 {
		p.counters = counters
	}
	if p.restarted.IsZero() {
		return 0
	}
	return uint64(p.restarted.UnixMilli())
}

// listedModel is one entry of an OpenAI model list (GET /v1/models); a
// LoRA adapter names its base model as parent, as vLLM lists them.
type listedModel struct {
	ID     string  `json:"id"`
	Parent *string `json:"parent"`
}

// models reads the engine's model list (listed, the generic kind's health
// answer, else GET /v1/models) and returns the model the worker serves and
// its LoRA adapters: the entries whose parent is that model, read on every
// probe so adapters loaded or unloaded at run time are followed. An
// adapter whose id is not a model id, and every adapter past the first
// fleet.MaxAdapters, is left out and returned as skipped: the status would
// otherwise be rejected whole and the engine serve nothing.
//
// A configured model must be in the list: an engine that serves another
// fails the probe with ErrModelNotServed (every request for the configured
// model would be the engine's 404). Without one, the model is the one
// discovered earlier while the list still names it, else the list's first
// id. When the list cannot be read, a configured model stands unchecked
// and the last adapters with it (a failed read says nothing about them);
// discovery fails the probe.
func (p *Prober) models(ctx context.Context, listed []byte) (string, []string, []SkippedAdapter, error) {
	var readErr error
	if listed == nil {
		code, b, err := p.get(ctx, modelsPath, maxJSONBytes)
		switch {
		case err != nil:
			readErr = err
		case code/100 != 2:
			readErr = fmt.Errorf("GET %s: %w: %d", modelsPath, ErrHTTPStatus, code)
		default:
			listed = b
		}
	}
	var list struct {
		Data []listedModel `json:"data"`
	}
	if readErr == nil {
		if err := json.Unmarshal(listed, &list); err != nil {
			readErr = fmt.Errorf("decode %s: %w", modelsPath, err)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if readErr != nil {
		if p.cfg.Model != "" {
			return p.cfg.Model, slices.Clone(p.adapters), slices.Clone(p.skipped), nil
		}
		return "", nil, nil, fmt.Errorf("model discovery: %w", readErr)
	}
	model := p.cfg.Model
	switch {
	case model != "":
		if !listsModel(list.Data, model) {
			return "", nil, nil, fmt.Errorf("%w: the engine serves %s (GET %s), not the configured model %q",
				ErrModelNotServed, listedIDs(list.Data), modelsPath, model)
		}
	case p.model != "" && listsModel(list.Data, p.model):
		model = p.model
	default:
		for _, m := range list.Data {
			if m.ID != "" {
				model = m.ID
				break
			}
		}
		if model == "" {
			return "", nil, nil, fmt.Errorf("model discovery: %w", ErrNoModel)
		}
		p.model = model
	}
	var (
		adapters []string
		skipped  []SkippedAdapter
		seen     = map[string]bool{}
	)
	for _, m := range list.Data {
		if m.Parent == nil || *m.Parent != model || m.ID == "" || m.ID == model || seen[m.ID] {
			continue
		}
		seen[m.ID] = true
		switch {
		case !fleet.ValidModelID(m.ID):
			skipped = append(skipped, SkippedAdapter{ID: m.ID, Reason: SkipInvalidID})
		case len(adapters) == fleet.MaxAdapters:
			skipped = append(skipped, SkippedAdapter{ID: m.ID, Reason: SkipTooMany})
		default:
			adapters = append(adapters, m.ID)
		}
	}
	p.adapters, p.skipped = adapters, skipped
	return model, adapters, slices.Clone(skipped), nil
}

// listsModel reports whether the list names id.
func listsModel(list []listedModel, id string) bool {
	return slices.ContainsFunc(list, func(m listedModel) bool { return m.ID == id })
}

// listedIDs names the ids of a model list for an error: at most five,
// quoted, or "no model".
func listedIDs(list []listedModel) string {
	var ids []string
	for _, m := range list {
		if m.ID != "" {
			ids = append(ids, strconv.Quote(m.ID))
		}
	}
	switch {
	case len(ids) == 0:
		return "no model"
	case len(ids) > 5:
		return strings.Join(ids[:5], ", ") + fmt.Sprintf(" and %d more", len(ids)-5)
	}
	return strings.Join(ids, ", ")
}

// figures reads the metrics; on any failure it returns the fallback figures
// and the reason.
func (p *Prober) figures(ctx context.Context) (Figures, error) {
	kind := p.cfg.Kind
	if kind == KindOpenAI {
		return fallbackFigures(kind), nil
	}
	ctxTokens := uint32(0)
	if kind == KindLlamaCpp {
		ctxTokens = p.llamaContext(ctx)
	}
	code, body, err := p.get(ctx, metricsPath, maxMetricsBytes)
	if err == nil && code/100 != 2 {
		err = fmt.Errorf("GET %s: %w: %d", metricsPath, ErrHTTPStatus, code)
	}
	var fig Figures
	if err == nil {
		fig, err = parseMetrics(kind, bytes.NewReader(body), ctxTokens)
	}
	if err != nil {
		return fallbackFigures(kind), fmt.Errorf("metrics: %w", err)
	}
	return fig, nil
}

// llamaContext is llama.cpp's per-slot context size from GET /props
// (default_generation_settings.n_ctx), read once and remembered; 0 when it
// cannot be read, to be tried again on the next probe. With the unified KV
// cache (llama-server's default) a slot's context is the whole cache; with
// per-slot caches it is one slot's share, a lower bound.
func (p *Prober) llamaContext(ctx context.Context) uint32 {
	p.mu.Lock()
	known := p.ctxTokens
	p.mu.Unlock()
	if known != 0 {
		return known
	}
	code, body, err := p.get(ctx, propsPath, maxJSONBytes)
	if err != nil || code/100 != 2 {
		return 0
	}
	var props struct {
		DefaultGenerationSettings struct {
			NCtx uint32 `json:"n_ctx"`
		} `json:"default_generation_settings"`
	}
	if json.Unmarshal(body, &props) != nil {
		return 0
	}
	n := props.DefaultGenerationSettings.NCtx
	p.mu.Lock()
	p.ctxTokens = n
	p.mu.Unlock()
	return n
}

// get sends GET path and returns the status and up to limit bytes of the
// body. A body longer than limit is an error except for health checks, whose
// body only matters when it is the model list.
func (p *Prober) get(ctx context.Context, path string, limit int64) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.base+path, nil)
	if err != nil {
		return 0, nil, fmt.Errorf("GET %s: %w", path, err)
	}
	if p.cfg.AuthHeader != "" {
		req.Header.Set("Authorization", p.cfg.AuthHeader)
	}
	switch path {
	case metricsPath:
		req.Header.Set("Accept", "text/plain;version=0.0.4")
	default:
		req.Header.Set("Accept", "application/json")
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("GET %s: %w", path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return 0, nil, fmt.Errorf("GET %s: read body: %w", path, err)
	}
	if int64(len(body)) > limit {
		if path == p.cfg.Kind.healthPath() && p.cfg.Kind != KindOpenAI {
			return resp.StatusCode, body[:limit], nil
		}
		return 0, nil, fmt.Errorf("GET %s: %w (over %d bytes)", path, ErrBodyTooLarge, limit)
	}
	return resp.StatusCode, body, nil
}

// kvEventsStatus is k as a status reports it (nil: none).
func kvEventsStatus(k fleet.KVEvents) *controlv1.KvEvents {
	if k.Endpoint == "" {
		return nil
	}
	return &controlv1.KvEvents{Endpoint: k.Endpoint, ReplayEndpoint: k.Replay, Topic: k.Topic}
}
