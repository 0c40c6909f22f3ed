package test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/tlgate/tlgate/actors/request"
	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/runtime/gateway"
)

// The reference engine as the engines operators run: it sends no
// heartbeats, the gateway probes it as kind vllm or sglang, and a
// disaggregated route drives its prefill and decode engines over their own
// protocol (vLLM's kv_transfer_params, SGLang's bootstrap rooms).

// pdEngine is one probed reference engine of a pdFleet, behind a front
// that records the inference bodies it is sent.
type pdEngine struct {
	id    string
	role  string
	kind  string
	e     *enginesim.Engine
	front *front
}

// front is a reverse proxy in front of an engine that keeps every
// inference request's body and X-Request-Id: what the gateway sent. Its
// mode fails inference requests (health, metrics and models still pass,
// so the probes keep the engine live): "503" answers 503, "drop" closes
// the connection unanswered, "stall" answers nothing until the caller
// gives up.
type front struct {
	srv  *httptest.Server
	mu   sync.Mutex
	got  []frontRequest
	mode string
}

func (f *front) setMode(m string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.mode = m
}

type frontRequest struct {
	path, requestID string
	body            map[string]any
}

func newFront(t *testing.T, target string) *front {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.FlushInterval = -1
	rp.ErrorLog = log.New(io.Discard, "", 0)
	f := &front{}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && strings.HasPrefix(r.URL.Path, "/v1/") && !strings.Contains(r.URL.Path, "tokenize") {
			b, _ := io.ReadAll(r.Body)
			dec := json.NewDecoder(bytes.NewReader(b))
			dec.UseNumber()
			var m map[string]any
			_ = dec.Decode(&m)
			f.mu.Lock()
			f.got = append(f.got, frontRequest{path: r.URL.Path, requestID: r.Header.Get("X-Request-Id"), body: m})
			mode := f.mode
			f.mu.Unlock()
			switch mode {
			case "503":
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusServiceUnavailable)
				_, _ = w.Write([]byte(`{"error":{"message":"front: unavailable","type":"server_error","param":null,"code":"unavailable"}}`))
				return
			case "drop":
				panic(http.ErrAbortHandler)
			case "stall":
				<-r.Context().Done()
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(b))
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *front) addr() string { return f.srv.Listener.Addr().String() }

func (f *front) requests() []frontRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]frontRequest(nil), f.got...)
}

// pdFleet is a gateway with probed reference engines.
type pdFleet struct {
	*cluster
	byID map[string]*pdEngine
}

// pdSpec is one engine of a pdFleet: id, kind (vllm, sglang, or "heartbeat"
// for an engine that heartbeats, speaking tlgate's contract) and role.
type pdSpec struct {
	id, kind, role string
	cfg            enginesim.Config // ID, Model, Role are set from the spec, BootstrapAddr when it has none
	direct         bool             // probed at its own address, not its front's
}

const pdRoutesEngines = `
[[gateway.routes]]
model = "big-pd"
backends = [{ model = "big", weight = 1 }]
targets = ["disaggregated"]
`

// pdOpts are a pdFleet's options beside its engines.
type pdOpts struct {
	extra string              // more configuration (routes)
	cfg   []clusterOpt        // changes to the configuration
	deps  func(*request.Deps) // the request actors' dependencies
	probe string              // the engines' probe_interval (default 50ms)
	gw    func(*gateway.Options)
}

// newPDFleet starts the engines of specs and a gateway probing them (and
// taking the heartbeats of the "heartbeat" ones), with the big-pd route.
func newPDFleet(t *testing.T, o pdOpts, specs ...pdSpec) *pdFleet {
	t.Helper()
	if o.probe == "" {
		o.probe = "100ms"
	}
	// A probed worker is evicted k × heartbeat_interval after its last
	// probe: 3 s here, so that a machine too busy to probe for a while
	// does not lose it.
	o.cfg = append([]clusterOpt{func(c *config.Config) { c.Gateway.HeartbeatInterval = config.D(time.Second) }}, o.cfg...)
	f := &pdFleet{byID: map[string]*pdEngine{}}
	var toml strings.Builder
	var heartbeats []enginesim.Config
	for _, s := range specs {
		c := s.cfg
		c.ID, c.Model, c.Logger = s.id, "big", zerolog.Nop()
		if c.Confidence == 0 {
			c.Confidence = 0.9
		}
		switch s.role {
		case "prefill":
			c.Role = enginesim.RolePrefill
		case "decode":
			c.Role = enginesim.RoleDecode
		default:
			c.Role = enginesim.RoleUnified
		}
		if s.kind == "heartbeat" {
			heartbeats = append(heartbeats, c)
			continue
		}
		if s.kind == "sglang" && s.role == "prefill" && c.BootstrapAddr == "" {
			c.BootstrapAddr = "127.0.0.1:0"
		}
		e, err := enginesim.Start(context.Background(), c)
		if err != nil {
			t.Fatalf("engine %s: %v", s.id, err)
		}
		t.Cleanup(func() { e.Kill() })
		pe := &pdEngine{id: s.id, role: s.role, kind: s.kind, e: e, front: newFront(t, e.URL())}
		f.byID[s.id] = pe
		addr := pe.front.addr()
		if s.direct {
			addr = e.HTTPAddr()
		}
		fmt.Fprintf(&toml, "\n[[gateway.engines]]\nid = %q\nhttp_address = %q\nkind = %q\nprobe_interval = %q\n", s.id, addr, s.kind, o.probe)
		if s.role != "" && s.role != "unified" {
			fmt.Fprintf(&toml, "role = %q\n", s.role)
		}
		if c.BootstrapAddr != "" {
			_, port, _ := net.SplitHostPort(e.BootstrapAddr())
			fmt.Fprintf(&toml, "bootstrap_port = %s\n", port)
		}
	}
	f.cluster = newClusterGateway(t, pdRoutesEngines+o.extra+toml.String(), o.cfg, o.deps, o.gw, heartbeats...)
	ids := make([]string, 0, len(specs))
	for _, s := range specs {
		ids = append(ids, s.id)
	}
	f.waitRoutable(ids...)
	return f
}

// engine returns the engine of id, probed or heartbeating.
func (f *pdFleet) engine(id string) *enginesim.Engine {
	if pe, ok := f.byID[id]; ok {
		return pe.e
	}
	return f.engines[id]
}

// generation is what a client reads of a completion, streamed or not: the
// text, each token's logprob, the finish reason and the usage.
type generation struct {
	Text     string
	Logprobs []float64
	Finish   string
	Prompt   int
	Output   int
}

// generationOf parses a completions or chat answer, streamed or not.
func generationOf(t *testing.T, b []byte) generation {
	t.Helper()
	type choice struct {
		Text    string `json:"text"`
		Message struct {
			Content string `json:"content"`
		} `json:"message"`
		Delta struct {
			Content string `json:"content"`
		} `json:"delta"`
		Logprobs *struct {
			TokenLogprobs []float64 `json:"token_logprobs"`
			Content       []struct {
				Logprob float64 `json:"logprob"`
			} `json:"content"`
		} `json:"logprobs"`
		FinishReason *string `json:"finish_reason"`
	}
	var g generation
	add := func(p string) {
		var v struct {
			Choices []choice `json:"choices"`
			Usage   *struct {
				Prompt     int `json:"prompt_tokens"`
				Completion int `json:"completion_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal([]byte(p), &v); err != nil {
			t.Fatalf("bad answer %q: %v", p, err)
		}
		for _, c := range v.Choices {
			g.Text += c.Text + c.Message.Content + c.Delta.Content
			if c.Logprobs != nil {
				g.Logprobs = append(g.Logprobs, c.Logprobs.TokenLogprobs...)
				for _, x := range c.Logprobs.Content {
					g.Logprobs = append(g.Logprobs, x.Logprob)
				}
			}
			if c.FinishReason != nil && *c.FinishReason != "" {
				g.Finish = *c.FinishReason
			}
		}
		if v.Usage != nil {
			g.Prompt, g.Output = v.Usage.Prompt, v.Usage.Completion
		}
	}
	if bytes.HasPrefix(bytes.TrimSpace(b), []byte("data:")) {
		if !bytes.Contains(b, []byte("data: [DONE]")) {
			t.Fatalf("a stream without [DONE]: %s", b)
		}
		for _, p := range sseEvents(b) {
			if p != "[DONE]" {
				add(p)
			}
		}
	} else {
		add(string(b))
	}
	return g
}

// pdBody is a request body of the test prompt: chat or completions,
// streamed or not, seeded and sampled, with logprobs.
func pdBody(model string, chat, stream bool, seed int) (string, map[string]any) {
	prompt := "The gateway sends the prompt to a prefill engine and streams the answer from a decode engine."
	b := map[string]any{"model": model, "max_tokens": 12, "temperature": 0.8, "seed": seed, "stream": stream}
	if stream {
		b["stream_options"] = map[string]any{"include_usage": true}
	}
	if chat {
		b["messages"] = []map[string]string{{"role": "system", "content": "You are terse."}, {"role": "user", "content": prompt}}
		b["logprobs"], b["top_logprobs"] = true, 2
		return "/v1/chat/completions", b
	}
	b["prompt"], b["logprobs"] = prompt, 2
	return "/v1/completions", b
}

// equalsUnified checks, for one protocol's fleet, that every disaggregated
// answer (chat and completions, streamed and not) equals the unified
// engine's for the same body and seed.
func equalsUnified(t *testing.T, f *pdFleet) {
	t.Helper()
	for _, chat := range []bool{false, true} {
		for _, stream := range []bool{false, true} {
			name := fmt.Sprintf("chat=%v stream=%v", chat, stream)
			path, ub := pdBody("big", chat, stream, 11)
			_, db := pdBody("big-pd", chat, stream, 11)
			u := f.post(path, "", ub)
			d := f.post(path, "", db, "X-Request-Id", strings.ReplaceAll(name, " ", "-"))
			if u.status != 200 || d.status != 200 {
				t.Fatalf("%s: unified %d %s, disaggregated %d %s", name, u.status, u.body, d.status, d.body)
			}
			gu, gd := generationOf(t, u.body), generationOf(t, d.body)
			if gu.Text == "" || len(gu.Logprobs) == 0 || !reflect.DeepEqual(gu, gd) {
				t.Fatalf("%s:\nunified        %+v\ndisaggregated  %+v", name, gu, gd)
			}
		}
	}
}

// pairLog records the pairs the gateway routed (prefill/decode ids).
type pairLog struct {
	mu    sync.Mutex
	pairs []string
	why   []pairReason
}

func (p *pairLog) hook(d *request.Deps) {
	prev := d.OnRouted
	d.OnRouted = func(ex *request.Exchange, tg router.Target, took time.Duration) {
		if prev != nil {
			prev(ex, tg, took)
		}
		if tg.Prefill != nil {
			p.mu.Lock()
			p.pairs = append(p.pairs, tg.Prefill.ID+"/"+tg.Worker.ID)
			p.why = append(p.why, pairReason{tg.Prefill.ID, tg.Worker.ID, tg.PrefillReason, tg.DecodeReason})
			p.mu.Unlock()
		}
	}
}

func (p *pairLog) snapshot() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.pairs...)
}

// pdReports records the reports of disaggregated requests (what the
// tlgate_disagg_* metrics are made of).
type pdReports struct {
	mu   sync.Mutex
	reps []request.PDReport
}

func (p *pdReports) hook(d *request.Deps) {
	prev := d.OnPD
	d.OnPD = func(ex *request.Exchange, r request.PDReport) {
		if prev != nil {
			prev(ex, r)
		}
		p.mu.Lock()
		p.reps = append(p.reps, r)
		p.mu.Unlock()
	}
}

// wantProtocol checks that n requests were reported, each under protocol.
func (p *pdReports) wantProtocol(t *testing.T, protocol string, n int) {
	t.Helper()
	eventually(t, 5*eventuallyUnit, func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.reps) >= n
	}, "%d disaggregated requests reported", n)
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, r := range p.reps {
		if string(r.Protocol) != protocol || r.Pairs != 1 {
			t.Errorf("a disaggregated request reported protocol %q and %d pairs, want %s and 1: %+v", r.Protocol, r.Pairs, protocol, r)
		}
	}
}

func TestVLLMDisaggregatedEqualsUnified(t *testing.T) {
	var reps pdReports
	f := newPDFleet(t, pdOpts{deps: reps.hook},
		pdSpec{id: "u", kind: "vllm"}, pdSpec{id: "p", kind: "vllm", role: "prefill"}, pdSpec{id: "d", kind: "vllm", role: "decode"})
	equalsUnified(t, f)
	reps.wantProtocol(t, "vllm", 4)
	p, d := f.byID["p"].e, f.byID["d"].e
	eventually(t, 5*eventuallyUnit, func() bool {
		ps, ds := p.Stats(), d.Stats()
		return ps.HeldHandles == 0 && ps.Running == 0 && ds.Running == 0 && ds.HeldHandles == 0
	}, "the prefill engine holds nothing once every decode pulled its KV")
}

func TestSGLangDisaggregatedEqualsUnified(t *testing.T) {
	var reps pdReports
	f := newPDFleet(t, pdOpts{deps: reps.hook},
		pdSpec{id: "u", kind: "sglang"}, pdSpec{id: "p", kind: "sglang", role: "prefill"}, pdSpec{id: "d", kind: "sglang", role: "decode"})
	equalsUnified(t, f)
	reps.wantProtocol(t, "sglang", 4)
	p, d := f.byID["p"].e, f.byID["d"].e
	eventually(t, 5*eventuallyUnit, func() bool {
		ps, ds := p.Stats(), d.Stats()
		return ps.Running == 0 && ds.Running == 0 && ds.HeldHandles == 0 && ps.FreeBlocks == ps.TotalBlocks
	}, "neither engine holds KV once the requests ended")
}
