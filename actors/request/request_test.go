package request

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/internal/routing/fleet"
	"github.com/tlgate/tlgate/internal/testkit/leakcheck"
	"github.com/tlgate/tlgate/internal/wire/openai"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

func TestSamplingDefaults(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	i := func(v int) *int { return &v }
	cases := []struct {
		name string
		req  openai.Request
		want string
	}{
		{"completions defaults", openai.Request{}, "temp=1 top_p=1 top_k=0 max=16 seed=9 stop=[] pres=0 freq=0 lp=false top_lp=0"},
		{"chat defaults", openai.Request{Chat: true}, "temp=1 top_p=1 top_k=0 max=256 seed=9 stop=[] pres=0 freq=0 lp=false top_lp=0"},
		{"client values", openai.Request{Temperature: f(0), TopP: f(0.5), TopK: i(40), MaxTokens: i(7), Stop: []string{"\n"},
			PresencePenalty: f(0.25), FrequencyPenalty: f(-0.5), Logprobs: true, TopLogprobs: i(3)},
			"temp=0 top_p=0.5 top_k=40 max=7 seed=9 stop=[\n] pres=0.25 freq=-0.5 lp=true top_lp=3"},
		{"top_k -1 means off", openai.Request{TopK: i(-1)}, "temp=1 top_p=1 top_k=0 max=16 seed=9 stop=[] pres=0 freq=0 lp=false top_lp=0"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := Sampling(tc.req, 9)
			got := fmtSampling(s.Temperature, s.TopP, s.TopK, s.MaxTokens, s.Seed, s.Stop, s.PresencePenalty, s.FrequencyPenalty, s.Logprobs, s.TopLogprobs)
			if got != tc.want {
				t.Fatalf("got  %s\nwant %s", got, tc.want)
			}
		})
	}
}

func TestExcludeAfter(t *testing.T) {
	d := fleet.Worker{ID: "d"}
	p := &fleet.Worker{ID: "p"}
	pair := router.Target{Worker: d, Prefill: p}
	cases := []struct {
		name   string
		t      router.Target
		phase  string
		failed []string
		want   string
	}{
		{"unified attempt", router.Target{Worker: fleet.Worker{ID: "u"}}, "attempt", nil, "u"},
		{"tokenize blames P", pair, PhaseTokenize, nil, "p"},
		{"first prefill failure blames D", pair, PhasePrefill, nil, "d"},
		{"second prefill failure of P blames P", pair, PhasePrefill, []string{"p"}, "p"},
		{"decode blames D", pair, PhaseDecode, []string{"p"}, "d"},
	}
	for _, tc := range cases {
		if got := ExcludeAfter(tc.t, tc.phase, tc.failed); got != tc.want {
			t.Errorf("%s: excluded %s, want %s", tc.name, got, tc.want)
		}
	}
}

func fmtSampling(temp, topP float32, topK, max uint32, seed uint64, stop []string, pres, freq float32, lp bool, topLP uint32) string {
	if stop == nil {
		stop = []string{}
	}
	return fmt.Sprintf("temp=%g top_p=%g top_k=%d max=%d seed=%d stop=%v pres=%g freq=%g lp=%v top_lp=%d", temp, topP, topK, max, seed, stop, pres, freq, lp, topLP)
}

// An answer tells the router the attempt succeeded; only a 2xx hands back
// the pick's prefix-index record (the engine computed the prompt's KV),
// so a prompt an engine refused is never indexed.
func TestReportAnswerIndexesOnlyA2xx(t *testing.T) {
	tg := router.Target{Worker: fleet.Worker{ID: "w"}, Indexing: router.Indexing{Worker: "w", Model: "m", Hashes: []uint64{1, 2}}}
	for _, tc := range []struct {
		status  int
		indexed bool
	}{{200, true}, {201, true}, {400, false}, {404, false}, {413, false}, {429, false}} {
		var got []any
		reportAnswer(func(_ *actor.PID, m any) { got = append(got, m) }, nil, tg, tc.status, time.Second)
		m, ok := got[0].(*router.AttemptSucceeded)
		if len(got) != 1 || !ok || m.WorkerID != "w" {
			t.Fatalf("status %d: sent %+v, want one AttemptSucceeded for w", tc.status, got)
		}
		if indexed := len(m.Indexing.Hashes) > 0; indexed != tc.indexed {
			t.Errorf("status %d: indexing %+v, want indexed %v", tc.status, m.Indexing, tc.indexed)
		}
		if timed := m.FirstByte > 0; timed != tc.indexed {
			t.Errorf("status %d: first byte %s, want it reported %v", tc.status, m.FirstByte, tc.indexed)
		}
	}
}

// Admission control's refusals are OpenAI-shaped errors with Retry-After:
// 503 overloaded, 429 objective_unreachable and 429 saturated, each saying
// why.
func TestRefusalAnswers(t *testing.T) {
	for _, tc := range []struct {
		err    error
		retry  time.Duration
		status int
		code   string
		after  string
		says   string
	}{
		{fmt.Errorf("x: %w", router.ErrOverloaded), 2500 * time.Millisecond, 503, openai.CodeOverloaded, "3", `model "m" is at its concurrency limit`},
		{&router.ObjectiveError{Model: "m", Objective: 500 * time.Millisecond, Wait: 400 * time.Millisecond, TTFT: 200 * time.Millisecond, Ahead: 3},
			400 * time.Millisecond, 429, openai.CodeObjectiveUnreachable, "1", "objective of 500ms for model \"m\" cannot be met: the gateway estimates 600ms"},
		{&router.SaturatedError{Model: "m", Priority: -1, Why: "w0: 6 queued"}, time.Second, 429, openai.CodeSaturated, "1", "saturated (w0: 6 queued)"},
	} {
		o, ok := refusal(&router.RouteResult{Err: tc.err, RetryAfter: tc.retry}, "m")
		if !ok || o.Status != tc.status || o.Code != tc.code || o.Header.Get("Retry-After") != tc.after || !strings.Contains(o.Message, tc.says) {
			t.Errorf("%v: %+v", tc.err, o)
		}
	}
	if _, ok := refusal(&router.RouteResult{Err: router.ErrNoCapacity}, "m"); ok {
		t.Error("no_capacity taken for an admission refusal")
	}
}
