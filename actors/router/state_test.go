package router

import (
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tlgate/tlgate/internal/routing/fleet"
	"github.com/tlgate/tlgate/internal/routing/policy"
	"github.com/tlgate/tlgate/internal/routing/prefixindex"
	"github.com/tlgate/tlgate/internal/routing/routes"
)

var now = time.Unix(1_000_000, 0)

func w(id, model string, role fleet.Role, queue, kvFormat int) fleet.Worker {
	return fleet.Worker{ID: id, Model: model, Role: role, QueueDepth: queue, KVFormat: uint32(kvFormat),
		KVTotalBlocks: 10, HTTPAddress: "127.0.0.1:1", LastHeartbeat: now, Deadline: now.Add(6 * time.Second)}
}

func state(t *testing.T, pol policy.Name, rs []routes.Route, ws ...fleet.Worker) *State {
	t.Helper()
	table, err := routes.NewTable(rs)
	if err != nil {
		t.Fatal(err)
	}
	s := NewState(Config{Policy: pol, LoadFactor: 1.25}, table, 1)
	for _, x := range ws {
		s.SetWorker(x)
	}
	return s
}

func TestPickCascadeSteps(t *testing.T) {
	s := state(t, policy.NameLeastOutstanding,
		[]routes.Route{{Model: "auto", Cascade: []routes.Step{{Model: "smol", AcceptIf: "mean_logprob > -1.2"}, {Model: "big"}}}},
		w("s1", "smol", fleet.RoleUnified, 0, 0), w("b1", "big", fleet.RoleUnified, 0, 0))
	cases := []struct {
		name     string
		req      Request
		worker   string
		step     int
		acceptIf string
	}{
		{"first step", Request{Model: "auto", RequestID: "1"}, "s1", 0, "mean_logprob > -1.2"},
		{"escalated", Request{Model: "auto", RequestID: "1", Step: 1}, "b1", 1, ""},
		{"stream goes to the last step", Request{Model: "auto", RequestID: "1", Stream: true}, "b1", 1, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tg, err := s.Pick(&tc.req, now)
			if err != nil {
				t.Fatal(err)
			}
			if tg.Worker.ID != tc.worker || tg.CascadeStep != tc.step || tg.CascadeSteps != 2 || tg.AcceptIf != tc.acceptIf || tg.Route != "auto" {
				t.Fatalf("target %+v", tg)
			}
		})
	}
}

func TestPickModelRewrittenForBackend(t *testing.T) {
	s := state(t, policy.NameLeastOutstanding,
		[]routes.Route{{Model: "smol", Aliases: []string{"smol-latest"}, Backends: []routes.Backend{{Model: "smol-v3", Weight: 1}}}},
		w("a", "smol-v3", fleet.RoleUnified, 0, 0))
	tg, err := s.Pick(&Request{Model: "smol-latest", RequestID: "x"}, now)
	if err != nil {
		t.Fatal(err)
	}
	if tg.ServedModel != "smol-v3" || tg.Route != "smol" {
		t.Fatalf("served %q route %q, want smol-v3 via smol", tg.ServedModel, tg.Route)
	}
}

// A canary backend with no routable worker does not turn its share of the
// traffic into 503s: the request is served by the other backend.
func TestPickCanaryFallsBack(t *testing.T) {
	s := state(t, policy.NameLeastOutstanding,
		[]routes.Route{{Model: "smol", Backends: []routes.Backend{{Model: "v3", Weight: 0.5}, {Model: "v4", Weight: 0.5}}}},
		w("a", "v3", fleet.RoleUnified, 0, 0))
	for i := range 50 {
		tg, err := s.Pick(&Request{Model: "smol", RequestID: string(rune('a' + i))}, now)
		if err != nil || tg.ServedModel != "v3" {
			t.Fatalf("request %d: %+v %v", i, tg, err)
		}
	}
}

func TestPickDisaggregatedPair(t *testing.T) {
	rs := []routes.Route{{Model: "big-pd", Backends: []routes.Backend{{Model: "big", Weight: 1}}, Targets: []string{"disaggregated"}}}
	s := state(t, policy.NameLeastOutstanding, rs,
		w("d1", "big", fleet.RoleDecode, 0, 2), // no prefill of format 2
		w("d2", "big", fleet.RoleDecode, 1, 1),
		w("p1", "big", fleet.RolePrefill, 3, 1),
		w("p2", "big", fleet.RolePrefill, 0, 1),
		w("u1", "big", fleet.RoleUnified, 0, 1))
	tg, err := s.Pick(&Request{Model: "big-pd", RequestID: "x"}, now)
	if err != nil {
		t.Fatal(err)
	}
	if tg.Worker.ID != "d2" || tg.Prefill == nil || tg.Prefill.ID != "p2" {
		t.Fatalf("pair %s/%v, want d2 with p2 (same kv_format, least loaded)", tg.Worker.ID, tg.Prefill)
	}
	if s.InFlight("d2") != 1 || s.InFlight("p2") != 1 {
		t.Fatal("pair not counted in flight")
	}
	_, err = s.Pick(&Request{Model: "big-pd", RequestID: "y", Exclude: map[string]bool{"p1": true, "p2": true}}, now)
	if !errors.Is(err, ErrNoCapacity) {
		t.Fatalf("no prefill left: %v, want ErrNoCapacity", err)
	}
}

// probed is w as the probe manager reports it (a stock vLLM engine).
func probed(x fleet.Worker) fleet.Worker { return probedKind(x, "vllm") }

// probedKind is w as the probe manager reports an engine of kind.
func probedKind(x fleet.Worker, kind string) fleet.Worker {
	x.Source, x.Kind, x.KVFormat = fleet.SourceProbe, kind, 0
	return x
}

// A disaggregated route pairs workers that speak one protocol: probed
// vLLM engines with each other, probed SGLang engines with each other,
// heartbeating workers (tlgate's contract) with each other; never two of
// different kinds, and never probed engines of a kind that speaks none.
func TestPickDisaggregatedPairsByProtocol(t *testing.T) {
	rs := []routes.Route{{Model: "big-pd", Backends: []routes.Backend{{Model: "big", Weight: 1}}, Targets: []string{"disaggregated"}}}
	pairOf := func(t *testing.T, s *State) (string, error) {
		t.Helper()
		tg, err := s.Pick(&Request{Model: "big-pd", RequestID: "x", Prompt: "hello"}, now)
		if err != nil {
			return "", err
		}
		defer s.Release(tg.Worker.ID)
		defer s.Release(tg.Prefill.ID)
		return tg.Prefill.ID + "/" + tg.Worker.ID, nil
	}
	for _, pol := range []policy.Name{policy.NameLeastOutstanding, policy.NameCacheAware, policy.NameWeighted, policy.NameAffinity} {
		t.Run(string(pol), func(t *testing.T) {
			// The idlest prefill is vLLM's, the idlest decode SGLang's:
			// neither pairs with the other.
			s := state(t, pol, rs,
				probedKind(w("p-vllm", "big", fleet.RolePrefill, 0, 1), "vllm"),
				probedKind(w("d-vllm", "big", fleet.RoleDecode, 5, 1), "vllm"),
				probedKind(w("p-sgl", "big", fleet.RolePrefill, 5, 1), "sglang"),
				probedKind(w("d-sgl", "big", fleet.RoleDecode, 0, 1), "sglang"))
			for range 4 {
				pair, err := pairOf(t, s)
				if err != nil || (pair != "p-vllm/d-vllm" && pair != "p-sgl/d-sgl") {
					t.Fatalf("pair %q (%v): want two engines of one kind", pair, err)
				}
			}
			// A vLLM prefill engine with SGLang and heartbeating decode
			// workers only: no pair.
			s = state(t, pol, rs,
				probedKind(w("p-vllm", "big", fleet.RolePrefill, 0, 1), "vllm"),
				probedKind(w("d-sgl", "big", fleet.RoleDecode, 0, 1), "sglang"),
				w("d-tl", "big", fleet.RoleDecode, 0, 0))
			if pair, err := pairOf(t, s); !errors.Is(err, ErrNoCapacity) {
				t.Fatalf("kinds that differ paired: %q %v", pair, err)
			}
			// llama.cpp's server speaks no disaggregation protocol.
			s = state(t, pol, rs, probedKind(w("p", "big", fleet.RolePrefill, 0, 1), "llamacpp"),
				probedKind(w("d", "big", fleet.RoleDecode, 0, 1), "llamacpp"))
			if pair, err := pairOf(t, s); !errors.Is(err, ErrNoCapacity) {
				t.Fatalf("llama.cpp engines paired: %q %v", pair, err)
			}
		})
	}
	// A pooling request on that route still goes to a unified worker,
	// probed or not.
	s := state(t, policy.NameLeastOutstanding, rs, probed(w("u0", "big", fleet.RoleUnified, 0, 1)))
	if tg, err := s.Pick(&Request{Model: "big-pd", RequestID: "x", LeastLoaded: true}, now); err != nil || tg.Worker.ID != "u0" {
		t.Fatalf("pooling request: %+v %v, want u0", tg.Worker.ID, err)
	}
}

// The decode worker of a pair goes by load: the fewest running sequences,
// ties to the most free KV; one whose KV is nearly full is passed over
// while another has room. KeepPrefill keeps the prefill worker that holds
// the request's KV while it is a candidate.
func TestPickDisaggregatedDecodeByLoadAndKeep(t *testing.T) {
	rs := []routes.Route{{Model: "big-pd", Backends: []routes.Backend{{Model: "big", Weight: 1}}, Targets: []string{"disaggregated"}}}
	kv := func(x fleet.Worker, running, free, total int) fleet.Worker {
		x.Running, x.KVFreeBlocks, x.KVTotalBlocks = running, free, total
		return x
	}
	s := state(t, policy.NameLeastOutstanding, rs,
		w("p1", "big", fleet.RolePrefill, 0, 1), w("p2", "big", fleet.RolePrefill, 1, 1),
		kv(w("d1", "big", fleet.RoleDecode, 0, 1), 3, 900, 1000),
		kv(w("d2", "big", fleet.RoleDecode, 0, 1), 1, 10, 1000), // nearly full
		kv(w("d3", "big", fleet.RoleDecode, 0, 1), 3, 950, 1000))
	tg, err := s.Pick(&Request{Model: "big-pd", RequestID: "x"}, now)
	if err != nil {
		t.Fatal(err)
	}
	if tg.Worker.ID != "d3" || tg.DecodeReason != policy.ReasonDecodeKV || tg.Prefill.ID != "p1" || tg.PrefillReason != policy.ReasonLeastOutstanding {
		t.Fatalf("pair %s/%s (%s, %s), want p1/d3: d2 runs least but is full, d3 has more free KV than d1", tg.Prefill.ID, tg.Worker.ID, tg.PrefillReason, tg.DecodeReason)
	}
	kept, err := s.Pick(&Request{Model: "big-pd", RequestID: "y", KeepPrefill: "p2", Exclude: map[string]bool{"d3": true}}, now)
	if err != nil {
		t.Fatal(err)
	}
	if kept.Prefill.ID != "p2" || kept.PrefillReason != policy.ReasonKept || kept.Worker.ID != "d1" {
		t.Fatalf("kept pair %s/%s (%s), want p2 kept with d1", kept.Prefill.ID, kept.Worker.ID, kept.PrefillReason)
	}
	gone, err := s.Pick(&Request{Model: "big-pd", RequestID: "z", KeepPrefill: "p9"}, now)
	if err != nil || gone.PrefillReason == policy.ReasonKept {
		t.Fatalf("a kept prefill worker that is gone: %+v %v, want a pair picked as usual", gone.PrefillReason, err)
	}
}

func TestReleaseIsHarmless(t *testing.T) {
	s := state(t, policy.NameLeastOutstanding, nil, w("a", "m", fleet.RoleUnified, 0, 0))
	if _, err := s.Pick(&Request{Model: "m", RequestID: "1"}, now); err != nil {
		t.Fatal(err)
	}
	s.RemoveWorker("a")
	s.Release("a")
	s.Release("a")
	s.Release("ghost")
	if s.InFlight("a") != 0 || s.InFlight("ghost") != 0 {
		t.Fatal("in-flight counts went wrong on extra releases")
	}
	s.SetWorker(w("a", "m", fleet.RoleUnified, 0, 0))
	if s.InFlight("a") != 0 {
		t.Fatal("returning worker credited with old requests")
	}
}

func TestPickSkipsExpiredBeforeEviction(t *testing.T) {
	s := state(t, policy.NameLeastOutstanding, nil, w("a", "m", fleet.RoleUnified, 5, 0), w("b", "m", fleet.RoleUnified, 0, 0))
	late := w("b", "m", fleet.RoleUnified, 0, 0)
	late.Deadline = now
	s.SetWorker(late)
	tg, err := s.Pick(&Request{Model: "m", RequestID: "1"}, now)
	if err != nil || tg.Worker.ID != "a" {
		t.Fatalf("picked %+v %v, want a (b's deadline is now)", tg.Worker.ID, err)
	}
}

// TestStepRequestKeepsTheRequest: a cascade step is routed with the
// client's request whole — its key (the queue's fair share), prompt
// (cache_aware), exclusions — only the model and step differ. Every field
// is checked by reflection, so a field added later is covered too.
func TestStepRequestKeepsTheRequest(t *testing.T) {
	req := &Request{Model: "auto", RequestID: "r1", PrefixKey: []byte("p"), Stream: true, Unjudged: true, Step: 0,
		Exclude: map[string]bool{"w1": true}, Prompt: "system\nhello\n", Key: "team-a",
		LeastLoaded: true, AnyRole: true, Pin: "w2", CacheSalt: "s", Hashes: &prefixindex.PromptHashes{},
		Tokens: map[string][]uint32{"smol": {1}}, NoTokens: map[string]bool{"big": true}, NoAsk: true, Partial: map[string]bool{"smol": true}, Keys: &TokenKeys{},
		KeepPrefill: "p1", Ask: Ask{FairnessID: "u1"}}
	got := stepRequest(req, routes.Route{Model: "smol", Cascade: []routes.Step{{Model: "a", AcceptIf: "mean_logprob > -1"}, {Model: "b"}}})
	if got.Model != "smol" || got.Step != 1 {
		t.Fatalf("model %q step %d, want smol and 1", got.Model, got.Step)
	}
	gv, rv := reflect.ValueOf(*got), reflect.ValueOf(*req)
	for i := range gv.NumField() {
		name := gv.Type().Field(i).Name
		if name == "Model" || name == "Step" {
			continue
		}
		if !reflect.DeepEqual(gv.Field(i).Interface(), rv.Field(i).Interface()) {
			t.Errorf("field %s = %v, want %v as the client's request had it", name, gv.Field(i), rv.Field(i))
		}
		if gv.Field(i).IsZero() {
			t.Errorf("field %s is zero in the test request: set it so the check means something", name)
		}
	}
}

// A pooling request (embeddings, rerank, tokenize) goes to the least
// loaded worker whatever the policy, is not indexed, takes a cascade's
// last step, and a tokenizer request takes a worker of any role.
func TestPickLeastLoadedAndAnyRole(t *testing.T) {
	s := state(t, policy.NameCacheAware,
		[]routes.Route{
			{Model: "auto", Cascade: []routes.Step{{Model: "e", AcceptIf: "mean_logprob > -1.2"}, {Model: "big"}}},
			{Model: "pd", Targets: []string{routes.TargetDisaggregated}},
		},
		w("e1", "e", fleet.RoleUnified, 3, 0), w("e2", "e", fleet.RoleUnified, 1, 0),
		w("b1", "big", fleet.RoleUnified, 0, 0),
		w("p1", "pd", fleet.RolePrefill, 2, 1), w("d1", "pd", fleet.RoleDecode, 0, 1))
	cases := []struct {
		name   string
		req    Request
		worker string
		err    error
	}{
		{"least loaded", Request{Model: "e", RequestID: "1", Prompt: words("x", 200), LeastLoaded: true}, "e2", nil},
		{"cascade: its last step", Request{Model: "auto", RequestID: "1", LeastLoaded: true}, "b1", nil},
		{"disaggregated: no unified worker", Request{Model: "pd", RequestID: "1", LeastLoaded: true}, "", ErrNoCapacity},
		{"any role: the least loaded", Request{Model: "pd", RequestID: "1", LeastLoaded: true, AnyRole: true, CacheSalt: "s"}, "d1", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tg, err := s.Pick(&tc.req, now)
			if !errors.Is(err, tc.err) || err == nil && tg.Worker.ID != tc.worker {
				t.Fatalf("Pick = %s, %v; want %s, %v", tg.Worker.ID, err, tc.worker, tc.err)
			}
			if err == nil {
				if tg.Policy != string(policy.NameLeastOutstanding) || tg.CascadeStep != tg.CascadeSteps-1 {
					t.Fatalf("policy %q step %d of %d", tg.Policy, tg.CascadeStep, tg.CascadeSteps)
				}
				s.Release(tg.Worker.ID)
			}
		})
	}
	if n := s.prefix.index.Len("e"); n != 0 {
		t.Fatalf("a pooling request was indexed: %d chunks", n)
	}
}

// TestPickSaysWhyNoCapacity: a refused pick names what the route needs and
// what of it the fleet has, by role and state; a cascade step with no
// routable worker is skipped, naming why.
func TestPickSaysWhyNoCapacity(t *testing.T) {
	stale := w("stale", "big", fleet.RoleDecode, 0, 0)
	stale.Deadline = now.Add(-time.Second)
	draining := w("dr", "big", fleet.RoleDecode, 0, 0)
	draining.Draining = true
	rs := []routes.Route{
		{Model: "big-pd", Backends: []routes.Backend{{Model: "big", Weight: 1}}, Targets: []string{routes.TargetDisaggregated}},
		{Model: "auto", Cascade: []routes.Step{{Model: "smol", AcceptIf: "mean_logprob > -1"}, {Model: "big"}}},
	}
	cases := []struct {
		name    string
		workers []fleet.Worker
		model   string
		exclude map[string]bool
		want    string
	}{
		{"no worker", nil, "big-pd", nil, "route big-pd needs prefill and decode workers of big; no worker of big is registered"},
		{"only unified", []fleet.Worker{w("u", "big", fleet.RoleUnified, 0, 0)}, "big-pd", nil,
			"route big-pd needs prefill and decode workers of big; 1 unified worker is routable"},
		{"decode workers down", []fleet.Worker{w("p", "big", fleet.RolePrefill, 0, 0), stale, draining}, "big-pd", nil,
			"route big-pd needs prefill and decode workers of big; 1 prefill worker is routable; 2 decode workers: 1 is draining, 1 missed its heartbeats"},
		{"kv formats differ", []fleet.Worker{w("p", "big", fleet.RolePrefill, 0, 1), w("d", "big", fleet.RoleDecode, 0, 2)}, "big-pd", nil,
			"route big-pd needs prefill and decode workers of big; 1 prefill worker is routable; 1 decode worker is routable; no routable prefill worker shares a kv_format with a routable decode worker"},
		{"failed this request", []fleet.Worker{w("a", "m", fleet.RoleUnified, 0, 0), w("b", "m", fleet.RoleUnified, 0, 0)}, "m", map[string]bool{"a": true, "b": true},
			"model m needs unified workers of m; 2 unified workers failed this request"},
		{"cascade: both steps empty", nil, "auto", nil, "model big needs unified workers of big; no worker of big is registered"},
		{"probed llama.cpp prefill and decode", []fleet.Worker{probedKind(w("p", "big", fleet.RolePrefill, 0, 0), "llamacpp"), probedKind(w("d1", "big", fleet.RoleDecode, 0, 0), "openai"), probedKind(w("d2", "big", fleet.RoleDecode, 0, 0), "llamacpp")}, "big-pd", nil,
			"route big-pd needs prefill and decode workers of big; 1 prefill worker is a probed engine of a kind that speaks no disaggregation protocol (vllm and sglang do); 2 decode workers are probed engines of a kind that speaks no disaggregation protocol (vllm and sglang do)"},
		{"probed decode beside a heartbeat prefill", []fleet.Worker{w("p", "big", fleet.RolePrefill, 0, 0), probed(w("d", "big", fleet.RoleDecode, 0, 0))}, "big-pd", nil,
			"route big-pd needs prefill and decode workers of big; 1 prefill worker is routable; 1 decode worker is routable; no routable prefill worker speaks the protocol of a routable decode worker (a probed engine pairs only with engines of its kind, a heartbeating worker only with heartbeating workers of its kv_format)"},
		{"vllm prefill, sglang decode", []fleet.Worker{probed(w("p", "big", fleet.RolePrefill, 0, 0)), probedKind(w("d", "big", fleet.RoleDecode, 0, 0), "sglang")}, "big-pd", nil,
			"route big-pd needs prefill and decode workers of big; 1 prefill worker is routable; 1 decode worker is routable; no routable prefill worker speaks the protocol of a routable decode worker (a probed engine pairs only with engines of its kind, a heartbeating worker only with heartbeating workers of its kv_format)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := state(t, policy.NameLeastOutstanding, rs, tc.workers...)
			_, err := s.Pick(&Request{Model: tc.model, RequestID: "r", Exclude: tc.exclude}, now)
			var nc *NoCapacityError
			if !errors.As(err, &nc) || !errors.Is(err, ErrNoCapacity) {
				t.Fatalf("error %v, want a NoCapacityError", err)
			}
			if nc.Why != tc.want {
				t.Fatalf("why\n %q\nwant\n %q", nc.Why, tc.want)
			}
		})
	}

	// A cascade whose first step has no worker is answered by the next.
	s := state(t, policy.NameLeastOutstanding, rs, w("b1", "big", fleet.RoleUnified, 0, 0))
	tg, err := s.Pick(&Request{Model: "auto", RequestID: "r"}, now)
	if err != nil || tg.Worker.ID != "b1" || tg.CascadeStep != 1 {
		t.Fatalf("cascade with an empty first step: %+v %v", tg, err)
	}
	want := []Skip{{Step: 0, Model: "smol", Why: "model smol needs unified workers of smol; no worker of smol is registered"}}
	if !reflect.DeepEqual(tg.Skipped, want) {
		t.Fatalf("skipped %+v, want %+v", tg.Skipped, want)
	}
}

// A LoRA adapter is a model id of its own: a request for it goes only to
// workers that have it loaded, an unknown one is not found, and the
// prefix index keeps each adapter's prompts (and each cache salt's) apart
// from the base model's and from each other's.
func TestPickAdapters(t *testing.T) {
	a, c := w("a", "base", fleet.RoleUnified, 0, 0), w("c", "base", fleet.RoleUnified, 0, 0)
	a.Adapters, c.Adapters = []string{"l1"}, []string{"l2"}
	s := state(t, policy.NameCacheAware, nil, a, c)
	prompt := words("system", 1024)
	for _, tc := range []struct {
		model, salt, worker string
		matched             bool
	}{
		{"l1", "", "a", false}, {"l2", "", "c", false}, {"l1", "", "a", true},
		{"base", "", "", false}, // the base model: neither adapter's entries count
		{"l1", "tenant", "a", false}, {"l1", "tenant", "a", true},
	} {
		tg, err := s.Pick(&Request{Model: tc.model, RequestID: "r", Prompt: prompt, CacheSalt: tc.salt}, now)
		if err != nil || tc.worker != "" && tg.Worker.ID != tc.worker || (tg.MatchedTokens > 0) != tc.matched {
			t.Fatalf("%s salt %q: %s matched %d, %v; want %s matched %v", tc.model, tc.salt, tg.Worker.ID, tg.MatchedTokens, err, tc.worker, tc.matched)
		}
		answered(s, tg)
		s.Release(tg.Worker.ID)
	}
	if _, err := s.Pick(&Request{Model: "l3", RequestID: "r"}, now); !errors.Is(err, ErrModelNotFound) {
		t.Fatalf("unknown adapter: %v", err)
	}
	if got := s.Adapters(); !reflect.DeepEqual(got, map[string]string{"l1": "base", "l2": "base"}) {
		t.Fatalf("Adapters = %v", got)
	}
	// Unloading an adapter takes the worker out of its pool.
	a.Adapters = nil
	s.SetWorker(a)
	if _, err := s.Pick(&Request{Model: "l1", RequestID: "r"}, now); !errors.Is(err, ErrModelNotFound) {
		t.Fatalf("unloaded adapter: %v", err)
	}
	if !slices.Contains(s.Models(now), "l2") || slices.Contains(s.Models(now), "l1") {
		t.Fatalf("Models = %v", s.Models(now))
	}
}

// TestKnownModels: a model is known (no_capacity, never model_not_found)
// while a route, a worker, the configuration or a down engine names it,
// and for the recent window after its last worker left, by that worker's
// last heartbeat; a window below zero forgets it at once.
func TestKnownModels(t *testing.T) {
	s := state(t, policy.NameLeastOutstanding, []routes.Route{{Model: "r"}}, w("a", "served", fleet.RoleUnified, 0, 0))
	s.SetConfigured([]string{"configured", ""})
	s.SetDown([]fleet.Down{{ID: "d", Model: "downmodel", Role: fleet.RoleUnified, LastError: "refused"}})
	for _, m := range []string{"r", "served", "configured", "downmodel"} {
		if !s.Known(m, now) {
			t.Errorf("%s not known", m)
		}
	}
	if s.Known("", now) || s.Known("other", now) {
		t.Error("an unnamed model is known")
	}
	s.RemoveWorker("a")
	if !s.Known("served", now.Add(DefaultRecentModels-time.Second)) || s.Known("served", now.Add(DefaultRecentModels)) {
		t.Error("a model left by its last worker is not known for exactly the window")
	}
	if !slices.Contains(s.Models(now), "served") || !slices.Contains(s.Models(now), "downmodel") || !slices.Contains(s.Models(now), "configured") {
		t.Errorf("Models = %v", s.Models(now))
	}
	_, err := s.Pick(&Request{Model: "downmodel", RequestID: "x"}, now)
	var nc *NoCapacityError
	if !errors.As(err, &nc) || !strings.Contains(nc.Why, "1 unified worker is down (its probes fail)") {
		t.Fatalf("pick of a down engine's model: %v", err)
	}
	if v := s.Workers(now); len(v) != 1 || v[0].ID != "d" || v[0].State != StateDown || v[0].Routable || v[0].LastError != "refused" {
		t.Fatalf("Workers = %+v, want the down engine", v)
	}
	s.SetDown(nil)
	s.SetConfigured(nil)
	if s.Known("downmodel", now) || s.Known("configured", now) {
		t.Error("a model no longer configured nor down is still known")
	}

	off := NewState(Config{RecentModels: -1}, nil, 1)
	off.SetWorker(w("a", "served", fleet.RoleUnified, 0, 0))
	off.RemoveWorker("a")
	if off.Known("served", now) {
		t.Error("with the window off, a model left by its last worker is still known")
	}
}
