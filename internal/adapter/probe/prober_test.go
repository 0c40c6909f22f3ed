package probe

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/tlgate/tlgate/internal/routing/fleet"
	controlv1 "github.com/tlgate/tlgate/protos/tl/control/v1"
)

// fakeEngine serves the HTTP surface a Prober reads, for one kind.
type fakeEngine struct {
	kind Kind

	mu            sync.Mutex
	healthStatus  int    // 0: 200
	metrics       string // served on /metrics
	metricsStatus int    // 0: 200
	models        []string
	nCtx          int           // /props default_generation_settings.n_ctx; 0: /props answers 404
	stall         string        // a path whose handler waits for the client to go away
	healthDelay   time.Duration // how long the health check takes to answer
	hits          map[string]int
	auth          map[string][]string // Authorization headers seen, by path
}

func (e *fakeEngine) set(f func(e *fakeEngine)) {
	e.mu.Lock()
	defer e.mu.Unlock()
	f(e)
}

func (e *fakeEngine) hitCount(path string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.hits[path]
}

func (e *fakeEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	e.mu.Lock()
	if e.hits == nil {
		e.hits, e.auth = map[string]int{}, map[string][]string{}
	}
	e.hits[r.URL.Path]++
	e.auth[r.URL.Path] = append(e.auth[r.URL.Path], r.Header.Get("Authorization"))
	healthStatus, metrics, metricsStatus, models, nCtx, stall, healthDelay := e.healthStatus, e.metrics, e.metricsStatus, e.models, e.nCtx, e.stall, e.healthDelay
	e.mu.Unlock()

	if r.Method != http.MethodGet {
		http.Error(w, "method", http.StatusMethodNotAllowed)
		return
	}
	if r.URL.Path == stall {
		<-r.Context().Done()
		return
	}
	writeModels := func() {
		list := struct {
			Object string           `json:"object"`
			Data   []map[string]any `json:"data"`
		}{Object: "list", Data: []map[string]any{}}
		for _, m := range models {
			entry := map[string]any{"id": m, "object": "model", "owned_by": string(e.kind)}
			if id, parent, ok := strings.Cut(m, "@"); ok { // a LoRA adapter "id@parent", as vLLM lists one
				entry["id"], entry["parent"] = id, parent
			}
			list.Data = append(list.Data, entry)
		}
		_ = json.NewEncoder(w).Encode(list)
	}
	switch {
	case r.URL.Path == e.kind.healthPath():
		if healthDelay > 0 {
			select {
			case <-time.After(healthDelay):
			case <-r.Context().Done():
				return
			}
		}
		if healthStatus != 0 && healthStatus != http.StatusOK {
			http.Error(w, `{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}`, healthStatus)
			return
		}
		if e.kind == KindOpenAI {
			writeModels()
		}
	case r.URL.Path == modelsPath:
		writeModels()
	case r.URL.Path == metricsPath && e.kind != KindOpenAI:
		if metricsStatus != 0 && metricsStatus != http.StatusOK {
			http.Error(w, "metrics disabled", metricsStatus)
			return
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		_, _ = w.Write([]byte(metrics))
	case r.URL.Path == propsPath && e.kind == KindLlamaCpp && nCtx > 0:
		_ = json.NewEncoder(w).Encode(map[string]any{
			"default_generation_settings": map[string]any{"id": 0, "n_ctx": nCtx, "is_processing": false},
			"total_slots":                 1,
			"model_path":                  "models/m.gguf",
		})
	default:
		http.NotFound(w, r)
	}
}

// startEngine serves e on 127.0.0.1 and returns a Prober config for it.
func startEngine(t *testing.T, e *fakeEngine) (Config, *httptest.Server) {
	t.Helper()
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	return Config{
		ID:          "w-" + string(e.kind),
		HTTPAddress: strings.TrimPrefix(srv.URL, "http://"),
		Kind:        e.kind,
		Client:      srv.Client(),
		Timeout:     5 * time.Second,
	}, srv
}

func TestProbeKinds(t *testing.T) {
	tests := []struct {
		name   string
		engine *fakeEngine
		model  string
		want   *controlv1.WorkerStatus // worker_id and http_address are filled in
		miss   []string
	}{
		{
			name:   "vllm",
			engine: &fakeEngine{kind: KindVLLM, metrics: string(fixture(t, "vllm_v1.txt")), models: []string{"llama-8b"}}, // --served-model-name
			model:  "llama-8b",
			want: &controlv1.WorkerStatus{Role: controlv1.Role_ROLE_UNIFIED, Model: "llama-8b", QueueDepth: 3, Running: 5,
				KvFreeBlocks: 20250, KvTotalBlocks: 27000, KvBlockTokens: 16, StartedAtUnixMs: 1750000123400},
		},
		{
			name:   "sglang",
			engine: &fakeEngine{kind: KindSGLang, metrics: string(fixture(t, "sglang.txt")), models: []string{"meta-llama/Llama-3.1-8B-Instruct"}},
			want: &controlv1.WorkerStatus{Role: controlv1.Role_ROLE_UNIFIED, Model: "meta-llama/Llama-3.1-8B-Instruct", QueueDepth: 4, Running: 12,
				KvFreeBlocks: 360000, KvTotalBlocks: 500000, KvBlockTokens: 1},
		},
		{
			name:   "llamacpp with /props",
			engine: &fakeEngine{kind: KindLlamaCpp, metrics: string(fixture(t, "llamacpp_current.txt")), models: []string{"qwen2.5-0.5b"}, nCtx: 8192},
			want: &controlv1.WorkerStatus{Role: controlv1.Role_ROLE_UNIFIED, Model: "qwen2.5-0.5b", Running: 1,
				KvFreeBlocks: 8192, KvTotalBlocks: 8192, KvBlockTokens: 1},
			miss: []string{FigureKVFreeBlocks},
		},
		{
			name:   "llamacpp legacy gauges without /props",
			engine: &fakeEngine{kind: KindLlamaCpp, metrics: string(fixture(t, "llamacpp_legacy.txt")), models: []string{"tiny"}},
			want: &controlv1.WorkerStatus{Role: controlv1.Role_ROLE_UNIFIED, Model: "tiny", QueueDepth: 1, Running: 2,
				KvFreeBlocks: 3072, KvTotalBlocks: 4096, KvBlockTokens: 1},
		},
		{
			name:   "openai generic",
			engine: &fakeEngine{kind: KindOpenAI, models: []string{"gpt-x", "gpt-y"}},
			want: &controlv1.WorkerStatus{Role: controlv1.Role_ROLE_UNIFIED, Model: "gpt-x",
				KvFreeBlocks: 1, KvTotalBlocks: 1, KvBlockTokens: 16},
			miss: allMissing,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, _ := startEngine(t, tt.engine)
			cfg.Model = tt.model
			res, err := New(cfg).ProbeDetail(context.Background())
			if err != nil {
				t.Fatalf("ProbeDetail: %v", err)
			}
			want := proto.Clone(tt.want).(*controlv1.WorkerStatus)
			want.WorkerId, want.HttpAddress = cfg.ID, cfg.HTTPAddress
			if !proto.Equal(res.Status, want) {
				t.Errorf("status =\n %v\nwant\n %v", res.Status, want)
			}
			if res.MetricsErr != nil {
				t.Errorf("MetricsErr = %v", res.MetricsErr)
			}
			if strings.Join(res.Figures.Missing, ",") != strings.Join(tt.miss, ",") {
				t.Errorf("Missing = %v, want %v", res.Figures.Missing, tt.miss)
			}
			if tt.engine.kind == KindOpenAI && tt.engine.hitCount(metricsPath) != 0 {
				t.Errorf("the generic kind fetched /metrics")
			}
		})
	}
}

func TestProbeHealthFailing(t *testing.T) {
	tests := []struct {
		name   string
		engine *fakeEngine
	}{
		{"llamacpp loading the model", &fakeEngine{kind: KindLlamaCpp, healthStatus: http.StatusServiceUnavailable}},
		{"vllm internal error", &fakeEngine{kind: KindVLLM, healthStatus: http.StatusInternalServerError}},
		{"sglang unavailable", &fakeEngine{kind: KindSGLang, healthStatus: http.StatusServiceUnavailable}},
		{"openai unauthorized", &fakeEngine{kind: KindOpenAI, healthStatus: http.StatusUnauthorized}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.engine.models = []string{"m"}
			cfg, _ := startEngine(t, tt.engine)
			st, err := New(cfg).Probe(context.Background())
			if !errors.Is(err, ErrUnhealthy) || st != nil {
				t.Fatalf("Probe = %v, %v; want nil, ErrUnhealthy", st, err)
			}
			if n := tt.engine.hitCount(metricsPath); n != 0 {
				t.Errorf("an unhealthy engine's metrics were read %d times", n)
			}
		})
	}
}

func TestProbeConnectionRefused(t *testing.T) {
	cfg, srv := startEngine(t, &fakeEngine{kind: KindVLLM})
	srv.Close()
	st, err := New(cfg).Probe(context.Background())
	if err == nil || st != nil {
		t.Fatalf("Probe of a closed port = %v, %v; want an error", st, err)
	}
}

func TestProbeTimeout(t *testing.T) {
	for _, path := range []string{"/health", metricsPath} {
		t.Run(path, func(t *testing.T) {
			e := &fakeEngine{kind: KindVLLM, models: []string{"m"}, metrics: string(fixture(t, "vllm_v1.txt")), stall: path}
			cfg, _ := startEngine(t, e)
			cfg.Timeout = 20 * time.Millisecond
			st, err := New(cfg).Probe(context.Background())
			if !errors.Is(err, context.DeadlineExceeded) || st != nil {
				t.Fatalf("Probe = %v, %v; want nil, deadline exceeded", st, err)
			}
		})
	}
}

// handlerTransport answers requests with a handler, in the caller's
// goroutine, so that a test in a synctest bubble controls every wait.
type handlerTransport struct{ h http.Handler }

func (t handlerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	rec := httptest.NewRecorder()
	t.h.ServeHTTP(rec, r)
	if err := r.Context().Err(); err != nil {
		return nil, err
	}
	return rec.Result(), nil
}

// TestProbeSGLangHealthGenerates: SGLang's /health answers at its first
// once-a-second check after the generation it submits produced output:
// 1 s after the request on an idle engine, 2 s or more during a long
// prefill. With the default timeout such a probe is good up to 3 s;
// another kind's health check gets the default timeout alone.
func TestProbeSGLangHealthGenerates(t *testing.T) {
	tests := []struct {
		kind   Kind
		delay  time.Duration
		wantOK bool
	}{
		{KindSGLang, time.Second, true},
		{KindSGLang, 2 * time.Second, true},
		{KindSGLang, 3 * time.Second, true},
		{KindSGLang, 4 * time.Second, false},
		{KindVLLM, 2500 * time.Millisecond, false},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s health %v", tt.kind, tt.delay), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := &fakeEngine{kind: tt.kind, models: []string{"m"}, metrics: string(fixture(t, "sglang.txt")), healthDelay: tt.delay}
				cfg := Config{ID: "w", HTTPAddress: "engine.test:8000", Kind: tt.kind, Client: &http.Client{Transport: handlerTransport{e}}}
				res, err := New(cfg).ProbeDetail(t.Context())
				switch {
				case tt.wantOK && (err != nil || res.MetricsErr != nil):
					t.Fatalf("probe: %v, metrics %v; want a good probe", err, res.MetricsErr)
				case !tt.wantOK && !errors.Is(err, context.DeadlineExceeded):
					t.Fatalf("probe: %v; want deadline exceeded", err)
				}
			})
		})
	}
}

func TestProbeCanceled(t *testing.T) {
	e := &fakeEngine{kind: KindVLLM, models: []string{"m"}}
	cfg, _ := startEngine(t, e)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := New(cfg).Probe(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Probe with a canceled context: %v", err)
	}
}

func TestProbeMetricsUnusable(t *testing.T) {
	tests := []struct {
		name    string
		engine  *fakeEngine
		wantErr error
		block   uint32
	}{
		{"sglang without --enable-metrics", &fakeEngine{kind: KindSGLang, metricsStatus: http.StatusNotFound}, ErrHTTPStatus, 1},
		{"vllm malformed", &fakeEngine{kind: KindVLLM, metrics: string(fixture(t, "malformed_value.txt"))}, ErrMalformedMetrics, 16},
		{"llamacpp html page", &fakeEngine{kind: KindLlamaCpp, metrics: string(fixture(t, "malformed_html.txt"))}, ErrMalformedMetrics, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.engine.models = []string{"m"}
			cfg, _ := startEngine(t, tt.engine)
			p := New(cfg)
			res, err := p.ProbeDetail(context.Background())
			if err != nil {
				t.Fatalf("ProbeDetail: %v (a healthy engine with unusable metrics is still live)", err)
			}
			if !errors.Is(res.MetricsErr, tt.wantErr) {
				t.Errorf("MetricsErr = %v, want %v", res.MetricsErr, tt.wantErr)
			}
			want := &controlv1.WorkerStatus{WorkerId: cfg.ID, HttpAddress: cfg.HTTPAddress, Role: controlv1.Role_ROLE_UNIFIED, Model: "m",
				KvFreeBlocks: 1, KvTotalBlocks: 1, KvBlockTokens: tt.block}
			if !proto.Equal(res.Status, want) {
				t.Errorf("status = %v, want fallback %v", res.Status, want)
			}
			if strings.Join(res.Figures.Missing, ",") != strings.Join(allMissing, ",") {
				t.Errorf("Missing = %v, want all", res.Figures.Missing)
			}
			if st, err := p.Probe(context.Background()); err != nil || !proto.Equal(st, want) {
				t.Errorf("Probe = %v, %v; want %v", st, err, want)
			}
		})
	}
}

func TestProbeDiscoversModel(t *testing.T) {
	e := &fakeEngine{kind: KindVLLM, models: []string{"first", "second"}, metrics: string(fixture(t, "vllm_v1.txt"))}
	cfg, _ := startEngine(t, e)
	p := New(cfg)
	ctx := context.Background()

	for i := range 2 {
		st, err := p.Probe(ctx)
		if err != nil || st.GetModel() != "first" {
			t.Fatalf("probe %d: model %q, %v; want first", i, st.GetModel(), err)
		}
	}
	if n := e.hitCount(modelsPath); n != 2 {
		t.Errorf("GET /v1/models %d times over two probes, want 2 (discovered once, the adapters read on each)", n)
	}

	// The engine restarts with another model: the failed probe forgets the
	// old id and the next healthy one discovers the new one.
	e.set(func(e *fakeEngine) { e.healthStatus = http.StatusServiceUnavailable })
	if _, err := p.Probe(ctx); !errors.Is(err, ErrUnhealthy) {
		t.Fatalf("probe while down: %v", err)
	}
	e.set(func(e *fakeEngine) { e.healthStatus, e.models = 0, []string{"other"} })
	if st, err := p.Probe(ctx); err != nil || st.GetModel() != "other" {
		t.Fatalf("probe after restart: model %q, %v; want other", st.GetModel(), err)
	}

	// No model served: discovery fails the probe.
	e.set(func(e *fakeEngine) { e.healthStatus = http.StatusServiceUnavailable })
	_, _ = p.Probe(ctx)
	e.set(func(e *fakeEngine) { e.healthStatus, e.models = 0, nil })
	if _, err := p.Probe(ctx); !errors.Is(err, ErrNoModel) {
		t.Fatalf("probe with no model: %v, want ErrNoModel", err)
	}
}

func TestProbeDiscoversModelFromGenericHealth(t *testing.T) {
	e := &fakeEngine{kind: KindOpenAI, models: []string{"only"}}
	cfg, _ := startEngine(t, e)
	p := New(cfg)
	for range 2 {
		if st, err := p.Probe(context.Background()); err != nil || st.GetModel() != "only" {
			t.Fatalf("Probe: model %q, %v", st.GetModel(), err)
		}
	}
	if n := e.hitCount(modelsPath); n != 2 {
		t.Errorf("GET /v1/models %d times over two probes, want 2 (one health check each, no extra discovery)", n)
	}
	e.set(func(e *fakeEngine) { e.models = nil })
	cfg.ID = "w-fresh"
	if _, err := New(cfg).Probe(context.Background()); !errors.Is(err, ErrNoModel) {
		t.Fatalf("generic engine with an empty list: %v, want ErrNoModel", err)
	}
}

func TestProbeSendsAuthHeader(t *testing.T) {
	tests := []struct {
		name string
		auth string
	}{
		{"with a key", "Bearer sk-test-123"},
		{"without a key", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := &fakeEngine{kind: KindLlamaCpp, models: []string{"m"}, nCtx: 4096, metrics: string(fixture(t, "llamacpp_current.txt"))}
			cfg, _ := startEngine(t, e)
			cfg.AuthHeader = tt.auth
			if _, err := New(cfg).Probe(context.Background()); err != nil {
				t.Fatalf("Probe: %v", err)
			}
			e.mu.Lock()
			defer e.mu.Unlock()
			for _, path := range []string{"/health", modelsPath, propsPath, metricsPath} {
				got := e.auth[path]
				if len(got) != 1 || got[0] != tt.auth {
					t.Errorf("Authorization on %s = %q, want [%q]", path, got, tt.auth)
				}
			}
		})
	}
}

func TestProbeRemembersLlamaContext(t *testing.T) {
	e := &fakeEngine{kind: KindLlamaCpp, models: []string{"m"}, nCtx: 4096, metrics: string(fixture(t, "llamacpp_current.txt"))}
	cfg, _ := startEngine(t, e)
	p := New(cfg)
	for range 3 {
		st, err := p.Probe(context.Background())
		if err != nil || st.GetKvTotalBlocks() != 4096 {
			t.Fatalf("Probe: total %d, %v; want 4096", st.GetKvTotalBlocks(), err)
		}
	}
	if n := e.hitCount(propsPath); n != 1 {
		t.Errorf("GET /props %d times over three probes, want 1", n)
	}
}

func TestConfigValidate(t *testing.T) {
	base := Config{ID: "gpu-0.a:1", HTTPAddress: "127.0.0.1:8000", Kind: KindVLLM}
	tests := []struct {
		name     string
		edit     func(c *Config)
		hostport string // "" when invalid
	}{
		{"host:port", func(c *Config) {}, "127.0.0.1:8000"},
		{"http URL", func(c *Config) { c.HTTPAddress = "http://10.0.0.5:30000" }, "10.0.0.5:30000"},
		{"https URL without port", func(c *Config) { c.HTTPAddress = "https://engine.internal/" }, "engine.internal:443"},
		{"IPv6", func(c *Config) { c.HTTPAddress = "[::1]:8080" }, "[::1]:8080"},
		{"empty id", func(c *Config) { c.ID = "" }, ""},
		{"id with a space", func(c *Config) { c.ID = "gpu 0" }, ""},
		{"id too long", func(c *Config) { c.ID = strings.Repeat("a", 129) }, ""},
		{"no port", func(c *Config) { c.HTTPAddress = "127.0.0.1" }, ""},
		{"empty address", func(c *Config) { c.HTTPAddress = "" }, ""},
		{"URL with a path", func(c *Config) { c.HTTPAddress = "http://h:1/v1" }, ""},
		{"other scheme", func(c *Config) { c.HTTPAddress = "grpc://h:1" }, ""},
		{"unknown kind", func(c *Config) { c.Kind = "tgi" }, ""},
		{"empty kind", func(c *Config) { c.Kind = "" }, ""},
		{"negative timeout", func(c *Config) { c.Timeout = -time.Second }, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := base
			tt.edit(&c)
			err := c.Validate()
			if tt.hostport == "" {
				if !errors.Is(err, ErrInvalidConfig) {
					t.Fatalf("Validate = %v, want ErrInvalidConfig", err)
				}
				if _, perr := New(c).Probe(context.Background()); !errors.Is(perr, ErrInvalidConfig) {
					t.Fatalf("Probe with an invalid config = %v, want ErrInvalidConfig", perr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Validate: %v", err)
			}
			if p := New(c); p.hostport != tt.hostport {
				t.Errorf("reported address %q, want %q", p.hostport, tt.hostport)
			}
		})
	}
}

// BenchmarkProbe measures one probe of a vLLM engine over loopback: GET
// /health and GET /metrics (vllm_v1.txt), the model id configured.
func BenchmarkProbe(b *testing.B) {
	e := &fakeEngine{kind: KindVLLM, models: []string{"m"}, metrics: string(fixture(b, "vllm_v1.txt"))}
	srv := httptest.NewServer(e)
	defer srv.Close()
	p := New(Config{ID: "w", HTTPAddress: strings.TrimPrefix(srv.URL, "http://"), Kind: KindVLLM, Model: "m", Client: srv.Client()})
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := p.Probe(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// TestProbeReadsAdapters: every probe reads the LoRA adapters vLLM lists
// with the served model as parent, so adapters loaded or unloaded at run
// time are followed.
func TestProbeReadsAdapters(t *testing.T) {
	e := &fakeEngine{kind: KindVLLM, models: []string{"m", "sql@m", "chat@m", "x@other"}, metrics: string(fixture(t, "vllm_v1.txt"))}
	cfg, _ := startEngine(t, e)
	p := New(cfg)
	ctx := context.Background()
	probe := func(want ...string) {
		t.Helper()
		st, err := p.Probe(ctx)
		if err != nil || st.GetModel() != "m" || !slices.Equal(st.GetLoraAdapters(), want) {
			t.Fatalf("probe: model %q adapters %v, %v; want m %v", st.GetModel(), st.GetLoraAdapters(), err, want)
		}
	}
	probe("sql", "chat")
	e.set(func(e *fakeEngine) { e.models = []string{"m", "chat@m"} }) // sql unloaded
	probe("chat")
	e.set(func(e *fakeEngine) { e.models = []string{"m"} })
	probe()
}

// TestProbeSkipsUnservableAdapters: an adapter whose id is not a model id
// (vLLM loads any lora_name at run time) and the adapters past
// fleet.MaxAdapters are left out of the status, which stays valid: the
// engine keeps serving its model and its other adapters.
func TestProbeSkipsUnservableAdapters(t *testing.T) {
	models := []string{"m", "tenant+v2@m", "sql@m"}
	for i := range fleet.MaxAdapters + 3 {
		models = append(models, fmt.Sprintf("a%d@m", i))
	}
	e := &fakeEngine{kind: KindVLLM, models: models, metrics: string(fixture(t, "vllm_v1.txt"))}
	cfg, _ := startEngine(t, e)
	res, err := New(cfg).ProbeDetail(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if verr := fleet.Validate(res.Status); verr != nil {
		t.Fatalf("status rejected: %v", verr)
	}
	got := res.Status.GetLoraAdapters()
	if len(got) != fleet.MaxAdapters || got[0] != "sql" || got[1] != "a0" {
		t.Fatalf("adapters %d, starting %v; want %d starting sql a0", len(got), got[:min(len(got), 2)], fleet.MaxAdapters)
	}
	want := []SkippedAdapter{{ID: "tenant+v2", Reason: SkipInvalidID}}
	for i := fleet.MaxAdapters - 1; i < fleet.MaxAdapters+3; i++ {
		want = append(want, SkippedAdapter{ID: fmt.Sprintf("a%d", i), Reason: SkipTooMany})
	}
	if !slices.Equal(res.SkippedAdapters, want) {
		t.Errorf("skipped %v, want %v", res.SkippedAdapters, want)
	}
}

// TestProbeReportsKVEvents: a configured engine's KV events sockets reach
// its status, and so the worker (a host-less endpoint on the engine's
// host).
func TestProbeReportsKVEvents(t *testing.T) {
	e := &fakeEngine{kind: KindVLLM, models: []string{"m"}, metrics: string(fixture(t, "vllm_v1.txt"))}
	cfg, _ := startEngine(t, e)
	cfg.KVEvents = fleet.KVEvents{Endpoint: "tcp://:5557", Replay: "tcp://:5558", Topic: "kv"}
	st, err := New(cfg).Probe(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := fleet.Validate(st); err != nil {
		t.Fatal(err)
	}
	host, _, _ := net.SplitHostPort(st.GetHttpAddress())
	w := fleet.FromStatus(st, time.Now(), time.Second, fleet.SourceProbe)
	if w.KVEvents != (fleet.KVEvents{Endpoint: "tcp://" + net.JoinHostPort(host, "5557"), Replay: "tcp://" + net.JoinHostPort(host, "5558"), Topic: "kv"}) {
		t.Errorf("worker's kv events %+v", w.KVEvents)
	}
}

// TestProbeRefusesWrongModel: a probe of an engine whose GET /v1/models
// does not list the configured model fails, saying what the engine serves
// and what was configured; once the engine serves it, the probe succeeds.
// A configured model is not checked when the list cannot be read.
func TestProbeRefusesWrongModel(t *testing.T) {
	for _, kind := range []Kind{KindVLLM, KindOpenAI} {
		t.Run(string(kind), func(t *testing.T) {
			e := &fakeEngine{kind: kind, models: []string{"llama", "sql@llama"}, metrics: string(fixture(t, "vllm_v1.txt"))}
			cfg, _ := startEngine(t, e)
			cfg.Model = "qwen"
			p := New(cfg)
			_, err := p.Probe(context.Background())
			if !errors.Is(err, ErrModelNotServed) || !strings.Contains(err.Error(), `"llama"`) || !strings.Contains(err.Error(), `"qwen"`) {
				t.Fatalf("probe of an engine serving llama, configured qwen: %v; want ErrModelNotServed naming both", err)
			}
			e.set(func(e *fakeEngine) { e.models = []string{"qwen"} })
			if st, err := p.Probe(context.Background()); err != nil || st.GetModel() != "qwen" {
				t.Fatalf("probe once qwen is served: %v, %v", st, err)
			}
		})
	}
	// vLLM's list unreadable (a 404 here): the configured model stands.
	e := &fakeEngine{kind: KindVLLM, models: []string{"llama"}, metrics: string(fixture(t, "vllm_v1.txt"))}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == modelsPath {
			http.NotFound(w, r)
			return
		}
		e.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	p := New(Config{ID: "w", HTTPAddress: strings.TrimPrefix(srv.URL, "http://"), Kind: KindVLLM, Model: "qwen", Client: srv.Client()})
	if st, err := p.Probe(context.Background()); err != nil || st.GetModel() != "qwen" {
		t.Fatalf("probe with no readable model list: %v, %v; want qwen unchecked", st, err)
	}
}
