package metrics

import (
	"testing"
	"time"
)

// The per-request methods, on warm caches (the route and worker seen).

func BenchmarkRequestDone(b *testing.B) {
	m, _ := newTest(b)
	m.RequestDone("smol", OutcomeOK, time.Second)
	b.ReportAllocs()
	for b.Loop() {
		m.RequestDone("smol", OutcomeOK, 230*time.Millisecond)
	}
}

func BenchmarkRequestDoneParallel(b *testing.B) {
	m, _ := newTest(b)
	m.RequestDone("smol", OutcomeOK, time.Second)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			m.RequestDone("smol", OutcomeOK, 230*time.Millisecond)
		}
	})
}

func BenchmarkFirstByte(b *testing.B) {
	m, _ := newTest(b)
	m.FirstByte("smol", time.Millisecond)
	b.ReportAllocs()
	for b.Loop() {
		m.FirstByte("smol", 12*time.Millisecond)
	}
}

func BenchmarkAttempt(b *testing.B) {
	m, _ := newTest(b)
	m.Attempt("smol", "worker-17")
	b.ReportAllocs()
	for b.Loop() {
		m.Attempt("smol", "worker-17")
	}
}

func BenchmarkFailover(b *testing.B) {
	m, _ := newTest(b)
	m.Failover("smol", FailoverStatus503)
	b.ReportAllocs()
	for b.Loop() {
		m.Failover("smol", FailoverStatus503)
	}
}

func BenchmarkRouteDecision(b *testing.B) {
	m, _ := newTest(b)
	b.ReportAllocs()
	for b.Loop() {
		m.RouteDecision(DecisionLoad, 4*time.Microsecond)
	}
}

func BenchmarkCascade(b *testing.B) {
	m, _ := newTest(b)
	m.Cascade("auto", 1, true)
	b.ReportAllocs()
	for b.Loop() {
		m.Cascade("auto", 1, true)
	}
}

func BenchmarkSetInFlight(b *testing.B) {
	m, _ := newTest(b)
	m.SetInFlight("worker-17", 1)
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		n++
		m.SetInFlight("worker-17", n&7)
	}
}

// BenchmarkRequestPath is everything one routed, streamed request records:
// a decision, an attempt, two in-flight updates, its first byte and its end.
func BenchmarkRequestPath(b *testing.B) {
	m, _ := newTest(b)
	touchAll(m)
	b.ReportAllocs()
	for b.Loop() {
		m.RouteDecision(DecisionAffinity, 3*time.Microsecond)
		m.SetInFlight("w1", 1)
		m.Attempt("smol", "w1")
		m.FirstByte("smol", 20*time.Millisecond)
		m.SetInFlight("w1", 0)
		m.RequestDone("smol", OutcomeOK, 2*time.Second)
	}
}

// BenchmarkNil is the cost of the hooks when metrics are off.
func BenchmarkNil(b *testing.B) {
	var m *Metrics
	b.ReportAllocs()
	for b.Loop() {
		m.RequestDone("smol", OutcomeOK, time.Second)
		m.Attempt("smol", "w1")
	}
}

// BenchmarkWithLabelValuesBaseline is the uncached lookup the pre-curried
// series avoid: the same counter and histogram, found by label values on
// every call.
func BenchmarkWithLabelValuesBaseline(b *testing.B) {
	m, _ := newTest(b)
	b.ReportAllocs()
	for b.Loop() {
		m.requests.WithLabelValues("smol", OutcomeOK).Inc()
		m.duration.WithLabelValues("smol").Observe(.23)
	}
}
