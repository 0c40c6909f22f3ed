package router

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tlgate/tlgate/internal/routing/fleet"
	"github.com/tlgate/tlgate/internal/routing/policy"
	"github.com/tlgate/tlgate/internal/routing/routes"
)

// TestPickPinned: a pinned request reaches its worker or nobody.
func TestPickPinned(t *testing.T) {
	draining := w("d", "m", fleet.RoleUnified, 0, 0)
	draining.Draining = true
	dead := w("x", "m", fleet.RoleUnified, 0, 0)
	dead.Deadline = now.Add(-time.Second)
	cases := []struct {
		name string
		req  Request
		want string // worker id, or "" with err
		err  error
	}{
		{"its worker, though another is idle", Request{Model: "alias", Pin: "b"}, "b", nil},
		{"no model named (GET, DELETE)", Request{Pin: "a"}, "a", nil},
		{"a draining worker still takes it", Request{Model: "m", Pin: "d"}, "d", nil},
		{"a worker that left", Request{Model: "m", Pin: "gone"}, "", ErrPinnedGone},
		{"a worker past its deadline", Request{Model: "m", Pin: "x"}, "", ErrPinnedGone},
		{"excluded: not another worker", Request{Model: "m", Pin: "b", Exclude: map[string]bool{"b": true}}, "", ErrNoCapacity},
		{"unknown model", Request{Model: "nope", Pin: "a"}, "", ErrModelNotFound},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := state(t, policy.NameLeastOutstanding, []routes.Route{{Model: "alias", Backends: []routes.Backend{{Model: "m", Weight: 1}}}},
				w("a", "m", fleet.RoleUnified, 0, 0), w("b", "m", fleet.RoleUnified, 5, 0), draining, dead)
			tg, err := s.Pick(&tc.req, now)
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("err %v, want %v", err, tc.err)
				}
				return
			}
			if err != nil || tg.Worker.ID != tc.want || tg.ServedModel != "m" || tg.Reason != ReasonPinned {
				t.Fatalf("picked %q (%s, %s), %v; want %s", tg.Worker.ID, tg.ServedModel, tg.Reason, err, tc.want)
			}
			if s.InFlight(tc.want) != 1 {
				t.Fatalf("in flight %d, want 1", s.InFlight(tc.want))
			}
		})
	}
}

// TestPickPinnedEjected: a pinned request whose worker is ejected is
// refused with the ejection named, not sent elsewhere.
func TestPickPinnedEjected(t *testing.T) {
	s := NewState(Config{Policy: policy.NameLeastOutstanding, Ejection: testEjection}, nil, 1)
	for _, id := range []string{"a", "b"} {
		s.SetWorker(w(id, "m", fleet.RoleUnified, 0, 0))
	}
	s.AttemptFailed("b", FailureRefused, now)
	_, err := s.Pick(&Request{Pin: "b"}, now)
	var nc *NoCapacityError
	if !errors.As(err, &nc) || nc.Model != "m" || !strings.Contains(nc.Why, `worker "b", which stores it, is ejected until`) || !strings.Contains(nc.Why, "refused") {
		t.Fatalf("err %v, want no capacity naming b's ejection", err)
	}
	if s.InFlight("a") != 0 || s.InFlight("b") != 0 {
		t.Fatal("a pinned request to an ejected worker was counted in flight")
	}
}

// TestPinnedAdapterKeepsAdapter: a pinned follow-up that names a LoRA
// adapter (itself, or through a route to it) is sent to its worker as the
// adapter, not as the worker's base model; one that names the base, or
// nothing, goes as the base.
func TestPinnedAdapterKeepsAdapter(t *testing.T) {
	lora := w("a", "base", fleet.RoleUnified, 0, 0)
	lora.Adapters = []string{"sql-lora", "zz-lora"}
	cases := []struct{ model, want string }{
		{"sql-lora", "sql-lora"},
		{"sql", "sql-lora"}, // a route to the adapter
		{"base", "base"},
		{"", "base"}, // GET, DELETE
	}
	for _, tc := range cases {
		t.Run(tc.model, func(t *testing.T) {
			s := state(t, policy.NameLeastOutstanding, []routes.Route{{Model: "sql", Backends: []routes.Backend{{Model: "sql-lora", Weight: 1}}}}, lora)
			tg, err := s.Pick(&Request{Model: tc.model, Pin: "a", RequestID: "r1"}, now)
			if err != nil || tg.Worker.ID != "a" || tg.ServedModel != tc.want {
				t.Fatalf("picked %q serving %q, %v; want a serving %q", tg.Worker.ID, tg.ServedModel, err, tc.want)
			}
		})
	}
}
