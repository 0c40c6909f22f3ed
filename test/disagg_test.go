package test

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/tlgate/tlgate/actors/request"
	"github.com/tlgate/tlgate/enginesim"
	enginev1 "github.com/tlgate/tlgate/protos/tl/engine/v1"
	kvv1 "github.com/tlgate/tlgate/protos/tl/kv/v1"
)

const pdRoutes = `
[[gateway.routes]]
model = "big-pd"
backends = [{ model = "big", weight = 1 }]
targets = ["disaggregated"]
`

// recorder wraps the gateway's engine calls and keeps what they carried.
type recorder struct {
	request.Engines
	mu       sync.Mutex
	prefills []*enginev1.PrefillRequest
	handles  []string // handles returned by Prefill
	releases []string // "kvAddr/handle"
	tokenize []string // "model@httpAddr"
	// hold, when set, holds each Release until it is closed (a D that
	// stopped answering).
	hold chan struct{}
}

func (r *recorder) Tokenize(ctx context.Context, httpAddr, model string, body []byte, chat bool) ([]uint32, error) {
	r.mu.Lock()
	r.tokenize = append(r.tokenize, model+"@"+httpAddr)
	r.mu.Unlock()
	return r.Engines.Tokenize(ctx, httpAddr, model, body, chat)
}

func (r *recorder) Prefill(ctx context.Context, addr string, req *enginev1.PrefillRequest) (*enginev1.PrefillResponse, error) {
	resp, err := r.Engines.Prefill(ctx, addr, req)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.prefills = append(r.prefills, proto.Clone(req).(*enginev1.PrefillRequest))
	if resp != nil {
		r.handles = append(r.handles, resp.GetHandleId())
	}
	return resp, err
}

func (r *recorder) Release(ctx context.Context, addr, handle string) (*kvv1.ReleaseResponse, error) {
	r.mu.Lock()
	r.releases = append(r.releases, addr+"/"+handle)
	hold := r.hold
	r.mu.Unlock()
	if hold != nil {
		<-hold
	}
	return r.Engines.Release(ctx, addr, handle)
}

func (r *recorder) snapshot() (prefills []*enginev1.PrefillRequest, handles, releases []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append(prefills, r.prefills...), append(handles, r.handles...), append(releases, r.releases...)
}

func newPDCluster(t *testing.T, decoders int, decodePerToken time.Duration) (*cluster, *recorder) {
	rec := &recorder{}
	engines := []enginesim.Config{
		{ID: "u", Model: "big", Confidence: 0.9},
		{ID: "p", Model: "big", Role: enginesim.RolePrefill, Confidence: 0.9},
	}
	for i := range decoders {
		engines = append(engines, enginesim.Config{ID: fmt.Sprintf("d%d", i+1), Model: "big", Role: enginesim.RoleDecode, Confidence: 0.9, DecodePerToken: decodePerToken})
	}
	c := newClusterDeps(t, pdRoutes, nil, func(d *request.Deps) {
		rec.Engines = d.Engines
		d.Engines = rec
	}, engines...)
	return c, rec
}

// TestDisaggregatedEqualsUnified: the disaggregated stream equals the
// unified one for the same seed, greedy and sampled, chat and completions;
// P got the prompt ids, the defaults and decode_target = D's KV address;
// the body D resumes carries P's seed, the client's or one the gateway drew.
func TestDisaggregatedEqualsUnified(t *testing.T) {
	c, rec := newPDCluster(t, 1, 0)
	cases := []struct {
		name string
		path string
		body map[string]any
	}{
		{"completions greedy", "/v1/completions", map[string]any{"prompt": "Once upon a time", "max_tokens": 12, "temperature": 0}},
		{"completions sampled", "/v1/completions", map[string]any{"prompt": "Once upon a time", "max_tokens": 12, "temperature": 1, "seed": 7}},
		{"chat sampled", "/v1/chat/completions", map[string]any{"messages": []map[string]string{{"role": "user", "content": "Tell me a story."}}, "max_tokens": 12, "temperature": 0.8, "top_p": 0.9, "seed": 11}},
		// P tokenizes the prompt D renders: the last message continued,
		// no generation prompt.
		{"chat continuing the final message", "/v1/chat/completions", map[string]any{"messages": []map[string]string{{"role": "user", "content": "Answer in JSON."}, {"role": "assistant", "content": `{"answer":`}},
			"continue_final_message": true, "add_generation_prompt": false, "max_tokens": 12, "temperature": 0.8, "seed": 5}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			texts := map[string]string{}
			for _, model := range []string{"big", "big-pd"} {
				b := map[string]any{"model": model, "stream": true}
				for k, v := range tc.body {
					b[k] = v
				}
				r := c.post(tc.path, "", b)
				if r.status != 200 || !strings.Contains(string(r.body), "data: [DONE]") {
					t.Fatalf("%s: %d %s", model, r.status, r.body)
				}
				texts[model] = completionText(t, r.body)
			}
			if texts["big"] == "" || texts["big"] != texts["big-pd"] {
				t.Fatalf("unified %q, disaggregated %q", texts["big"], texts["big-pd"])
			}
			// The body that reached D carried the seed P prefilled with.
			prefills, _, _ := rec.snapshot()
			want := prefills[len(prefills)-1].GetSampling().GetSeed()
			if s := c.engines["d1"].Stats(); s.LastResumeSeed != want || s.ResumesUnseeded != 0 {
				t.Fatalf("D resumed with seed %d (%d resumes without one), want the prefill's %d", s.LastResumeSeed, s.ResumesUnseeded, want)
			}
		})
	}
	prefills, _, _ := rec.snapshot()
	if len(prefills) != len(cases) {
		t.Fatalf("%d prefills for %d disaggregated requests", len(prefills), len(cases))
	}
	p := prefills[0]
	d := c.engines["d1"]
	if p.GetDecodeTarget() != d.KVAddr() || p.GetDecodeTarget() == d.HTTPAddr() {
		t.Fatalf("decode_target %q, want D's KV address %q", p.GetDecodeTarget(), d.KVAddr())
	}
	ids := tokenize(t, c, c.engines["p"], "Once upon a time")
	if fmt.Sprint(p.GetPromptIds()) != fmt.Sprint(ids) {
		t.Fatalf("prompt ids %v, want %v", p.GetPromptIds(), ids)
	}
	s := p.GetSampling()
	if s.GetTemperature() != 0 || s.GetTopP() != 1 || s.GetTopK() != 0 || s.GetMaxTokens() != 12 || len(s.GetStop()) != 0 ||
		s.GetPresencePenalty() != 0 || s.GetFrequencyPenalty() != 0 || s.GetLogprobs() || s.GetTopLogprobs() != 0 || s.GetSeed() == 0 {
		t.Fatalf("sampling %v: want the client's values and the contract's defaults, and a seed", s)
	}
	if p.GetModel() != "big" || p.GetKvFormat() != 1 || p.GetRequestId() == "" {
		t.Fatalf("prefill request %v", p)
	}

	// No client seed: the gateway draws one and it reaches D, so the
	// sampled stream equals the unified one for that seed.
	r := c.post("/v1/completions", "", map[string]any{"model": "big-pd", "prompt": "A seedless tale", "max_tokens": 12, "temperature": 1, "stream": true})
	if r.status != 200 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	prefills, _, _ = rec.snapshot()
	seed := prefills[len(prefills)-1].GetSampling().GetSeed()
	if got := d.Stats().LastResumeSeed; got != seed {
		t.Fatalf("the gateway drew seed %d for P, but D's body carried %d", seed, got)
	}
	u := c.post("/v1/completions", "", map[string]any{"model": "big", "prompt": "A seedless tale", "max_tokens": 12, "temperature": 1, "stream": true, "seed": seed})
	if got, want := completionText(t, r.body), completionText(t, u.body); got != want {
		t.Fatalf("generated seed %d: disaggregated %q, unified with that seed %q", seed, got, want)
	}
	eventually(t, 5*eventuallyUnit, func() bool { return d.Stats().HeldHandles == 0 }, "D holds no handles")
}

func tokenize(t *testing.T, c *cluster, e *enginesim.Engine, prompt string) []uint32 {
	t.Helper()
	var v struct {
		Tokens []uint32 `json:"tokens"`
	}
	b := c.postTo(e.URL()+"/v1/tokenize", map[string]any{"model": "big", "prompt": prompt})
	if err := jsonUnmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	return v.Tokens
}

// TestDisaggregatedReleaseOnAbort: D dies mid-stream, or the client goes
// away: Release is called with the handle and D holds no blocks after.
func TestDisaggregatedReleaseOnAbort(t *testing.T) {
	t.Run("decode worker dies", func(t *testing.T) {
		c, rec := newPDCluster(t, 1, 0)
		d := c.engines["d1"]
		if err := d.SetFaults(enginesim.Faults{Die: true, DieAfterTokens: 2}); err != nil {
			t.Fatal(err)
		}
		r := c.post("/v1/completions", "", map[string]any{"model": "big-pd", "prompt": "Once upon a time", "max_tokens": 16, "stream": true})
		if r.status != 200 || !strings.Contains(string(r.body), "upstream_failed") {
			t.Fatalf("%d %s", r.status, r.body)
		}
		checkReleased(t, rec, d)
	})
	t.Run("client disconnects", func(t *testing.T) {
		// D decodes slowly: the stream would last 50 s.
		c, rec := newPDCluster(t, 1, 100*time.Millisecond)
		d := c.engines["d1"]
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, c.url+"/v1/completions",
			strings.NewReader(`{"model":"big-pd","prompt":"Once upon a time","max_tokens":500,"stream":true}`))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if line, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil || !strings.HasPrefix(line, "data: ") {
			t.Fatalf("first line %q %v", line, err)
		}
		cancel()
		resp.Body.Close()
		checkReleased(t, rec, d)
	})
}

// TestBrokenStreamEndsBeforeRelease: after a decode worker dies
// mid-stream, the client's answer (its error event) ends at once, though
// the Release of the handle it held has not returned; the Release still
// reaches D.
func TestBrokenStreamEndsBeforeRelease(t *testing.T) {
	c, rec := newPDCluster(t, 1, 0)
	hold := make(chan struct{})
	var once sync.Once
	unhold := func() { once.Do(func() { close(hold) }) }
	t.Cleanup(unhold) // before the cluster stops
	rec.mu.Lock()
	rec.hold = hold
	rec.mu.Unlock()
	d := c.engines["d1"]
	if err := d.SetFaults(enginesim.Faults{Die: true, DieAfterTokens: 2}); err != nil {
		t.Fatal(err)
	}
	answered := make(chan reply, 1)
	go func() {
		answered <- c.post("/v1/completions", "", map[string]any{"model": "big-pd", "prompt": "Once upon a time", "max_tokens": 16, "stream": true})
	}()
	select {
	case r := <-answered:
		if r.status != 200 || !strings.Contains(string(r.body), "upstream_failed") {
			t.Fatalf("%d %s", r.status, r.body)
		}
	case <-time.After(10 * eventuallyUnit):
		t.Fatal("the broken stream's answer did not end while its Release was held")
	}
	unhold()
	checkReleased(t, rec, d)
}

func checkReleased(t *testing.T, rec *recorder, d *enginesim.Engine) {
	t.Helper()
	eventually(t, 5*eventuallyUnit, func() bool { _, _, rel := rec.snapshot(); return len(rel) >= 1 }, "Release called")
	_, handles, releases := rec.snapshot()
	if len(handles) != 1 || releases[0] != d.KVAddr()+"/"+handles[0] {
		t.Fatalf("handles %v releases %v, want Release(%s) on %s", handles, releases, handles, d.KVAddr())
	}
	eventually(t, 5*eventuallyUnit, func() bool { s := d.Stats(); return s.HeldHandles == 0 && s.HeldBlocks == 0 }, "D holds no blocks")
}

// TestDisaggregatedFailoverBeforeCommit: a decode worker that fails before
// the first byte: its handle is released and the request completes on the
// other decode worker with the same output as a unified engine.
func TestDisaggregatedFailoverBeforeCommit(t *testing.T) {
	c, rec := newPDCluster(t, 2, 0)
	d1, d2 := c.engines["d1"], c.engines["d2"]
	if err := d1.SetFaults(enginesim.Faults{Die: true, DieAfterTokens: 0}); err != nil {
		t.Fatal(err)
	}
	body := map[string]any{"prompt": "Once upon a time", "max_tokens": 12, "seed": 5, "stream": true}
	body["model"] = "big-pd"
	r := c.post("/v1/completions", "", body)
	if r.status != 200 || !strings.Contains(string(r.body), "data: [DONE]") {
		t.Fatalf("%d %s", r.status, r.body)
	}
	routed, failovers, _ := c.hooks.snapshot()
	if strings.Join(routed, ",") != "d1,d2" || len(failovers) != 1 || !strings.HasPrefix(failovers[0], "d1:") {
		t.Fatalf("routed %v failovers %v, want d1 then d2", routed, failovers)
	}
	_, handles, releases := rec.snapshot()
	if len(handles) != 2 || len(releases) < 1 || releases[0] != d1.KVAddr()+"/"+handles[0] {
		t.Fatalf("handles %v releases %v: d1's handle not released", handles, releases)
	}
	body["model"] = "big"
	u := c.post("/v1/completions", "", body)
	if got, want := completionText(t, r.body), completionText(t, u.body); got != want {
		t.Fatalf("after failover %q, unified %q", got, want)
	}
	for _, e := range []*enginesim.Engine{d1, d2} {
		eventually(t, 5*eventuallyUnit, func() bool { s := e.Stats(); return s.HeldHandles == 0 && s.HeldBlocks == 0 }, "decode workers hold nothing")
	}
}

// TestDisaggregatedAnsweredNeedsNoRelease: a decode worker that answered a
// non-streamed request (or ended a stream) freed the pushed blocks itself:
// the gateway calls no Release, so the answer does not wait for one, and D
// holds nothing after.
func TestDisaggregatedAnsweredNeedsNoRelease(t *testing.T) {
	c, rec := newPDCluster(t, 1, 0)
	d := c.engines["d1"]
	for _, stream := range []bool{false, true} {
		r := c.post("/v1/completions", "", map[string]any{"model": "big-pd", "prompt": "Once upon a time", "max_tokens": 4, "seed": 3, "stream": stream})
		if r.status != http.StatusOK {
			t.Fatalf("stream %v: %d %s", stream, r.status, r.body)
		}
	}
	eventually(t, 5*eventuallyUnit, func() bool { s := d.Stats(); return s.HeldHandles == 0 && s.HeldBlocks == 0 }, "D holds no blocks")
	if _, handles, releases := rec.snapshot(); len(handles) != 2 || len(releases) != 0 {
		t.Fatalf("handles %v releases %v, want two handles and no Release", handles, releases)
	}
}

// TestCascadeStepsTokenizeForTheirModel: a cascade whose steps are two
// models, each served disaggregated under tlgate's contract, tokenizes the
// prompt anew for the later step's model (whose tokenizer may differ), on
// that step's prefill worker: step 0's ids are not prefilled for step 1.
func TestCascadeStepsTokenizeForTheirModel(t *testing.T) {
	rec := &recorder{}
	c := newClusterDeps(t, pdRoutes+`
[[gateway.routes]]
model = "huge-pd"
backends = [{ model = "huge", weight = 1 }]
targets = ["disaggregated"]

[[gateway.routes]]
model = "auto"
cascade = [{ model = "big-pd", accept_if = "min_logprob > 0" }, { model = "huge-pd" }]
`, nil, func(d *request.Deps) {
		rec.Engines = d.Engines
		d.Engines = rec
	},
		enginesim.Config{ID: "p", Model: "big", Role: enginesim.RolePrefill},
		enginesim.Config{ID: "d", Model: "big", Role: enginesim.RoleDecode},
		enginesim.Config{ID: "hp", Model: "huge", Role: enginesim.RolePrefill},
		enginesim.Config{ID: "hd", Model: "huge", Role: enginesim.RoleDecode})
	r := c.post("/v1/completions", "", map[string]any{"model": "auto", "prompt": "Escalate this one.", "max_tokens": 6, "seed": 3})
	if r.status != http.StatusOK {
		t.Fatalf("%d %s", r.status, r.body)
	}
	rec.mu.Lock()
	got := strings.Join(rec.tokenize, " ")
	rec.mu.Unlock()
	if want := "big@" + c.engines["p"].HTTPAddr() + " huge@" + c.engines["hp"].HTTPAddr(); got != want {
		t.Fatalf("tokenized %s, want %s: once per step, for its model", got, want)
	}
}

// TestDisaggregatedPromptShapesAnswerAsUnified: under tlgate's contract,
// every prompt shape a unified engine serves (token ids, a one-element
// array) is served disaggregated with the same text, and one it refuses
// (no tokens, a batch) is refused 400 at once: the request's fault, not
// the pair's, so no worker is blamed and nothing is retried.
func TestDisaggregatedPromptShapesAnswerAsUnified(t *testing.T) {
	c, _ := newPDCluster(t, 1, 0)
	cases := []struct {
		name   string
		prompt any
		status int
	}{
		{"token ids", []int{5, 6, 7, 8}, http.StatusOK},
		{"one array of token ids", [][]int{{5, 6, 7, 8}}, http.StatusOK},
		{"one text in an array", []string{"Once upon a time"}, http.StatusOK},
		{"no text", "", http.StatusBadRequest},
		{"a batch", []string{"Once", "upon"}, http.StatusBadRequest},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			texts := map[string]string{}
			for _, model := range []string{"big", "big-pd"} {
				r := c.post("/v1/completions", "", map[string]any{"model": model, "prompt": tc.prompt, "max_tokens": 6, "temperature": 0})
				if r.status != tc.status {
					t.Fatalf("%s: %d %s, want %d", model, r.status, r.body, tc.status)
				}
				if r.status != http.StatusOK {
					if errorCode(t, r.body) != "invalid_request" {
						t.Fatalf("%s: %s, want invalid_request", model, r.body)
					}
					continue
				}
				texts[model] = completionText(t, r.body)
			}
			if texts["big"] != texts["big-pd"] {
				t.Fatalf("unified %q, disaggregated %q", texts["big"], texts["big-pd"])
			}
		})
	}
	if _, failovers, _ := c.hooks.snapshot(); len(failovers) != 0 {
		t.Fatalf("failovers %v, want none", failovers)
	}
}
