package router

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/tlgate/tlgate/internal/actorsys"
	"github.com/tlgate/tlgate/internal/fleet"
	"github.com/tlgate/tlgate/internal/policy"
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
