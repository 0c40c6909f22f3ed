package router

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/tlgate/tlgate/internal/routing/fleet"
	"github.com/tlgate/tlgate/internal/routing/policy"
	"github.com/tlgate/tlgate/internal/routing/routes"
	"github.com/tlgate/tlgate/internal/runtime/actorsys"
)

func benchState(b *testing.B, pol policy.Name, n int) (*State, time.Time) {
	b.Helper()
	now := time.Now()
	s := NewState(Config{Policy: pol, LoadFactor: 1.25}, nil, 1)
	for i := range n {
		s.SetWorker(fleet.Worker{ID: fmt.Sprintf("w%04d", i), Model: "m", Role: fleet.RoleUnified, QueueDepth: i % 5,
			KVTotalBlocks: 100 + i%7, HTTPAddress: "127.0.0.1:1", LastHeartbeat: now, Deadline: now.Add(time.Hour)})
	}
	return s, now
}

var policies = []policy.Name{policy.NameLeastOutstanding, policy.NameWeighted, policy.NameAffinity}

// BenchmarkPick is one routing decision (pick and release) by the router's
// pure State, at 4, 64 and 1024 workers of one model.
func BenchmarkPick(b *testing.B) {
	for _, pol := range policies {
		for _, n := range []int{4, 64, 1024} {
			b.Run(fmt.Sprintf("%s/%d", pol, n), func(b *testing.B) {
				s, now := benchState(b, pol, n)
				keys := make([][]byte, 256)
				for i := range keys {
					keys[i] = []byte("system prompt " + strconv.Itoa(i%16) + " and the user's question")
				}
				req := &Request{Model: "m", RequestID: "r"}
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					req.PrefixKey = keys[i%len(keys)]
					t, err := s.Pick(req, now)
					if err != nil {
						b.Fatal(err)
					}
					s.Release(t.Worker.ID)
				}
			})
		}
	}
}

// BenchmarkRouteActor is the same decision as a round trip through the
// router actor (Route request, RouteResult answer, Release).
func BenchmarkRouteActor(b *testing.B) {
	for _, pol := range policies {
		for _, n := range []int{4, 64, 1024} {
			b.Run(fmt.Sprintf("%s/%d", pol, n), func(b *testing.B) {
				s, _ := benchState(b, pol, n)
				sys := actorsys.New(zerolog.Nop())
				defer sys.Shutdown()
				pid := sys.Root.Spawn(Props(s, nil))
				defer func() { _ = sys.Root.StopFuture(pid).Wait() }()
				msg := &Route{Request: Request{Model: "m", RequestID: "r", PrefixKey: []byte("a shared system prompt")}}
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					res, err := sys.Root.RequestFuture(pid, msg, time.Second).Result()
					if err != nil {
						b.Fatal(err)
					}
					sys.Root.Send(pid, &Release{WorkerID: res.(*RouteResult).Target.Worker.ID})
				}
			})
		}
	}
}

// BenchmarkPickCacheAware is one cache_aware decision (lookup, cost,
// record and release) by the pure State for a 2,000-token prompt (8,000
// bytes at the default 4 bytes a token) at 64 workers: 16 system prompts
// of 6,000 bytes, each warm on 4 workers, then a question of its own.
func BenchmarkPickCacheAware(b *testing.B) {
	s, now := benchState(b, policy.NameCacheAware, 64)
	for _, w := range s.workers { // 4,096 blocks of 16 tokens: 4,096 chunks each
		x := *w
		x.KVTotalBlocks, x.KVBlockTokens = 4096, 16
		s.SetWorker(x)
	}
	systems := make([]string, 16)
	for i := range systems {
		systems[i] = fmt.Sprintf("%06d", i) + strings.Repeat("shared system prompt words ", 6000/27+1)[:5994]
	}
	prompts := make([]string, 256)
	for i := range prompts {
		prompts[i] = systems[i%16] + fmt.Sprintf("%06d", i) + strings.Repeat("the question of its own ", 2000/24+1)[:1994]
	}
	req := &Request{Model: "m", RequestID: "r"}
	for i := range 64 { // warm: each system prompt on 4 workers
		req.Prompt = prompts[i%16]
		t, err := s.Pick(req, now)
		if err != nil {
			b.Fatal(err)
		}
		_ = t
	}
	for id := range s.inflight {
		for s.InFlight(id) > 0 {
			s.Release(id)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		req.Prompt = prompts[i%len(prompts)]
		t, err := s.Pick(req, now)
		if err != nil {
			b.Fatal(err)
		}
		s.Release(t.Worker.ID)
	}
}

// BenchmarkAdmitBehindFullCanary: a canary route whose canary backend is
// full holds 1023 of its waiters (50 keys); each op is a request drawn
// for the other backend, whose worker has room: admitted, released, and
// the queue dispatched as the router actor does on a release.
func BenchmarkAdmitBehindFullCanary(b *testing.B) {
	table, err := routes.NewTable([]routes.Route{{Model: "smol", Backends: []routes.Backend{{Model: "v3", Weight: 0.9}, {Model: "v4", Weight: 0.1}}}})
	if err != nil {
		b.Fatal(err)
	}
	s := NewState(Config{Policy: policy.NameLeastOutstanding, LoadFactor: 1.25}, table, 1)
	s.cfg.Admission = AdmissionConfig{Enabled: true, Worker: 1, QueueSize: 2048, QueueTimeout: time.Hour}
	for _, x := range []fleet.Worker{
		{ID: "a", Model: "v3", Role: fleet.RoleUnified, KVTotalBlocks: 10, HTTPAddress: "127.0.0.1:1", LastHeartbeat: now, Deadline: now.Add(time.Hour)},
		{ID: "b", Model: "v4", Role: fleet.RoleUnified, KVTotalBlocks: 10, HTTPAddress: "127.0.0.1:2", LastHeartbeat: now, Deadline: now.Add(time.Hour)},
	} {
		s.SetWorker(x)
	}
	r := table.Resolve("smol")
	var canary, stable []string
	for i := 0; len(canary) < 1024 || len(stable) < 1024; i++ {
		id := fmt.Sprint("r", i)
		if routes.PickBackend(r, id) == "v4" {
			canary = append(canary, id)
		} else {
			stable = append(stable, id)
		}
	}
	for i, id := range canary[:1024] {
		ad := s.Admit(&Request{Model: "smol", RequestID: id}, fmt.Sprint("k", i%50), pid(id), now)
		if ad.Err != nil || i > 0 && ad.Queued == nil {
			b.Fatalf("canary %d: %+v", i, ad)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		id := stable[i%len(stable)]
		ad := s.Admit(&Request{Model: "smol", RequestID: id}, "k0", pid(id), now)
		if ad.Queued == nil && ad.Err == nil {
			s.Release(ad.Target.Worker.ID)
		}
		for _, d := range s.Dispatch(now) {
			if d.Err == nil {
				s.Release(d.Target.Worker.ID)
			}
		}
	}
}
