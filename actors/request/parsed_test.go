package request

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/internal/routing/cascade"
	"github.com/tlgate/tlgate/internal/routing/fleet"
	"github.com/tlgate/tlgate/internal/runtime/actorsys"
	"github.com/tlgate/tlgate/internal/wire/dialect"
	"github.com/tlgate/tlgate/internal/wire/openai"
	"github.com/tlgate/tlgate/internal/wire/proxy"
)

// engines are httptest engines by name, each recording the bodies it was
// sent and answering with its own status and body.
type engines struct {
	mu     sync.Mutex
	bodies map[string][]string
	addrs  map[string]string
}

func newEngines(t *testing.T, answers map[string]func(w http.ResponseWriter)) *engines {
	t.Helper()
	e := &engines{bodies: map[string][]string{}, addrs: map[string]string{}}
	for name, answer := range answers {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			e.mu.Lock()
			e.bodies[name] = append(e.bodies[name], string(b))
			e.mu.Unlock()
			answer(w)
		}))
		t.Cleanup(srv.Close)
		e.addrs[name] = strings.TrimPrefix(srv.URL, "http://")
	}
	return e
}

func (e *engines) sent(name string) []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.bodies[name]...)
}

// failoverCascadeEngines are the engines of cascadeRouter's cascade:
// worker a answers 503, b an answer below the acceptance rule, c one the
// last step returns.
func failoverCascadeEngines(t *testing.T) *engines {
	t.Helper()
	return newEngines(t, map[string]func(http.ResponseWriter){
		"a": func(w http.ResponseWriter) { w.WriteHeader(http.StatusServiceUnavailable) },
		"b": answerJSON(unsureAnswer),
		"c": answerJSON(sureAnswer),
	})
}

// unsureAnswer is below cascadeRouter's acceptance rule; sureAnswer is
// the last step's.
const (
	unsureAnswer = `{"choices":[{"index":0,"message":{"role":"assistant","content":"hm"},"logprobs":{"content":[{"token":"hm","logprob":-3}]}}],"usage":{"prompt_tokens":5,"completion_tokens":1}}`
	sureAnswer   = `{"choices":[{"index":0,"message":{"role":"assistant","content":"yes"}}],"usage":{"prompt_tokens":5,"completion_tokens":1}}`
)

// answerJSON answers 200 with body.
func answerJSON(body string) func(w http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, body)
	}
}

// cascadeRouter is a fake router for a two-step cascade "auto": step 0
// on "small" (worker a first, then b), step 1 on "big" (worker c); it
// records the Routes it was asked.
func cascadeRouter(e *engines, routes *[]router.Request, mu *sync.Mutex) func(ctx actor.Context) {
	rule := cascade.Accept{Stat: cascade.MeanLogprob, Op: cascade.Greater, Threshold: -1}
	return func(ctx actor.Context) {
		m, ok := ctx.Message().(*router.Route)
		if !ok {
			return // Release, AttemptFailed, AttemptAnswered...
		}
		mu.Lock()
		*routes = append(*routes, m.Request)
		mu.Unlock()
		t := router.Target{Route: "auto", CascadeSteps: 2, Rule: rule, CascadeStep: min(m.Request.Step, 1)}
		switch {
		case t.CascadeStep == 0 && !m.Request.Exclude["a"]:
			t.Worker, t.ServedModel = fleet.Worker{ID: "a", HTTPAddress: e.addrs["a"]}, "small-v1"
		case t.CascadeStep == 0:
			t.Worker, t.ServedModel = fleet.Worker{ID: "b", HTTPAddress: e.addrs["b"]}, "small-v1"
		default:
			t.Worker, t.ServedModel = fleet.Worker{ID: "c", HTTPAddress: e.addrs["c"]}, "big-v1"
		}
		ctx.Respond(&router.RouteResult{Target: t})
	}
}

// runExchange runs one request actor for ex over the fake router and
// waits for its outcome; it returns the actor.
func runExchange(t *testing.T, fake func(actor.Context), d *Deps, ex *Exchange) (*requestActor, Outcome) {
	t.Helper()
	sys := actorsys.New(zerolog.Nop())
	t.Cleanup(sys.Shutdown)
	rt := sys.Root.Spawn(actor.PropsFromFunc(fake))
	t.Cleanup(func() { _ = sys.Root.StopFuture(rt).Wait() })
	d.Router, d.Proxy = rt, proxy.New(proxy.Options{})
	t.Cleanup(d.Proxy.Close)
	var a *requestActor
	props := actor.PropsFromProducer(func() actor.Actor { a = &requestActor{d: d, ex: ex}; return a }, actor.WithGuardian(Guardian))
	sys.Root.Spawn(props)
	var o Outcome
	select {
	case o = <-ex.Done:
	case <-time.After(10 * time.Second):
		t.Fatal("the request did not end")
	}
	ex.Wait()
	return a, o
}

// TestRequestParsedOnce: a chat request that fails over (worker a
// answers 503) and escalates (worker b's answer is not confident enough)
// before the cascade's last step answers is parsed once, at the edge; each
// of its three attempts sends a body rewritten from that parse in one copy
// (the served model, logprobs forced on below the last step, nothing
// else), and nothing parses the body again, whatever the attempt.
func TestRequestParsedOnce(t *testing.T) {
	e := failoverCascadeEngines(t)
	body := `{"model":"auto", "messages":[{"role":"user","content":"is it?"}], "temperature":0.5}`
	req, err := openai.ParseRequest([]byte(body), true)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu     sync.Mutex
		routes []router.Request
		parses []int // the body's parses when each attempt was routed
	)
	d := &Deps{MaxAttempts: 3, OnRouted: func(ex *Exchange, _ router.Target, _ time.Duration) {
		mu.Lock()
		parses = append(parses, ex.Req.Parses())
		mu.Unlock()
	}}
	ex := NewExchange(context.Background(), httptest.NewRecorder(), req, "/v1/chat/completions", "req-1")
	a, o := runExchange(t, cascadeRouter(e, &routes, &mu), d, ex)
	if o.Status != http.StatusOK || string(o.Body) != sureAnswer {
		t.Fatalf("outcome %d %s %q, want the big model's answer", o.Status, o.Code, o.Body)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(routes) != 3 || len(parses) != 3 {
		t.Fatalf("%d routes, %d attempts; want 3: a (503), b (escalated), c", len(routes), len(parses))
	}
	for i, n := range parses {
		if n != 1 {
			t.Fatalf("attempt %d: the body was parsed %d times, want once (at the edge)", i, n)
		}
	}
	if n := ex.Req.Parses(); n != 1 || a.rewrites != 3 {
		t.Fatalf("%d parses and %d rewrites of the body, want 1 and one per attempt (3)", n, a.rewrites)
	}
	step0 := `{"model":"small-v1", "messages":[{"role":"user","content":"is it?"}], "temperature":0.5,"logprobs":true}`
	step1 := `{"model":"big-v1", "messages":[{"role":"user","content":"is it?"}], "temperature":0.5}`
	for name, want := range map[string]string{"a": step0, "b": step0, "c": step1} {
		if got := e.sent(name); len(got) != 1 || got[0] != want {
			t.Errorf("worker %s was sent %q, want %q", name, got, want)
		}
	}
}

// TestAnswerParsedOnce: each whole answer is parsed once, by the proxy;
// the cascade's judgement, the usage, the stripping of the logprobs the
// client did not ask for, and a Responses answer's stored id all take
// what they need from that one read.
func TestAnswerParsedOnce(t *testing.T) {
	t.Run("a cascade step's answer", func(t *testing.T) {
		confident := `{"choices":[{"index":0,"message":{"role":"assistant","content":"yes"},"logprobs":{"content":[{"token":"yes","logprob":-0.1}]}}],"usage":{"prompt_tokens":5,"completion_tokens":1}}`
		e := newEngines(t, map[string]func(http.ResponseWriter){
			"a": answerJSON(confident), "b": answerJSON(confident), "c": answerJSON(confident),
		})
		req, err := openai.ParseRequest([]byte(`{"model":"auto","messages":[{"role":"user","content":"q"}]}`), true)
		if err != nil {
			t.Fatal(err)
		}
		var (
			mu      sync.Mutex
			routes  []router.Request
			answers []*proxy.Response
		)
		d := &Deps{MaxAttempts: 3, OnAnswered: func(_ *Exchange, r *proxy.Response) {
			mu.Lock()
			answers = append(answers, r)
			mu.Unlock()
		}}
		ex := NewExchange(context.Background(), httptest.NewRecorder(), req, "/v1/chat/completions", "req-1")
		_, o := runExchange(t, cascadeRouter(e, &routes, &mu), d, ex)
		want := strings.Replace(confident, `"logprobs":{"content":[{"token":"yes","logprob":-0.1}]}`, `"logprobs":null`, 1)
		if o.Status != http.StatusOK || string(o.Body) != want || o.Log.Usage.Total() != 6 || o.Log.Usage.Estimated {
			t.Fatalf("outcome %d %q usage %+v, want step 0's answer with its logprobs stripped and its usage", o.Status, o.Body, o.Log.Usage)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(answers) != 1 {
			t.Fatalf("%d answers, want step 0's, accepted", len(answers))
		}
		if n := answers[0].Answer.Reads(); n != 1 {
			t.Fatalf("the answer was parsed %d times, want once", n)
		}
	})
	t.Run("a stored response", func(t *testing.T) {
		e := newEngines(t, map[string]func(http.ResponseWriter){
			"w": answerJSON(`{"id":"resp_1","object":"response","output":[{"type":"message","content":[{"type":"output_text","text":"hi"}]}],"usage":{"input_tokens":3,"output_tokens":1}}`),
		})
		req, err := openai.ParseResponses([]byte(`{"model":"m","input":"hello"}`))
		if err != nil {
			t.Fatal(err)
		}
		stored := &storedSpy{}
		var answers []*proxy.Response
		var mu sync.Mutex
		d := &Deps{MaxAttempts: 1, Stored: stored, OnAnswered: func(_ *Exchange, r *proxy.Response) {
			mu.Lock()
			answers = append(answers, r)
			mu.Unlock()
		}}
		fake := func(ctx actor.Context) {
			if _, ok := ctx.Message().(*router.Route); ok {
				ctx.Respond(&router.RouteResult{Target: router.Target{Worker: fleet.Worker{ID: "w", HTTPAddress: e.addrs["w"]}, ServedModel: "m", CascadeSteps: 1}})
			}
		}
		ex := NewExchange(context.Background(), httptest.NewRecorder(), req, dialect.PathResponses, "req-1")
		ex.KeyName = "k"
		_, o := runExchange(t, fake, d, ex)
		if o.Status != http.StatusOK || o.Log.Usage.Total() != 4 || stored.put != "resp_1@w" {
			t.Fatalf("outcome %d usage %+v stored %q, want 200, the usage and resp_1 on w", o.Status, o.Log.Usage, stored.put)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(answers) != 1 {
			t.Fatalf("%d answers, want one", len(answers))
		}
		if n := answers[0].Answer.Reads(); n != 1 {
			t.Fatalf("the answer was parsed %d times, want once", n)
		}
	})
}

// storedSpy records the stored responses put.
type storedSpy struct {
	mu  sync.Mutex
	put string
}

func (s *storedSpy) Put(id, worker, _ string, _ time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.put = id + "@" + worker
}

func (s *storedSpy) Worker(string, string, time.Time) (string, bool) { return "", false }
func (s *storedSpy) Forget(string)                                   {}
