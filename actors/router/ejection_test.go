package router

import (
	"testing"
	"time"

	"github.com/tlgate/tlgate/internal/routing/fleet"
	"github.com/tlgate/tlgate/internal/routing/policy"
)

var testEjection = EjectionConfig{Failures: 3, Refused: 1, Base: 10 * time.Second, Max: 25 * time.Second, MaxPercent: 50}

func ejectState(t *testing.T, ec EjectionConfig, ids ...string) *State {
	t.Helper()
	s := state(t, policy.NameLeastOutstanding, nil)
	s.cfg.Ejection = ec
	for _, id := range ids {
		s.SetWorker(w(id, "m", fleet.RoleUnified, 0, 0))
	}
	return s
}

func TestEjectionThresholds(t *testing.T) {
	cases := []struct {
		name    string
		reasons []string
		ejected bool
	}{
		{"one refused ejects", []string{"refused"}, true},
		{"two resets do not", []string{"reset", "reset"}, false},
		{"three failures of any kind do", []string{"reset", "status_5xx", "timeout"}, true},
		{"a refused after two others", []string{"eof", "status_503", "refused"}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := ejectState(t, testEjection, "a", "b")
			var e Ejection
			for _, r := range tc.reasons {
				e = s.AttemptFailed("a", r, now)
			}
			if e.Ejected != tc.ejected || s.ejected("a", now) != tc.ejected {
				t.Fatalf("ejected %v (state %v), want %v", e.Ejected, s.ejected("a", now), tc.ejected)
			}
			if tc.ejected && (!e.Until.Equal(now.Add(10*time.Second)) || e.Reason != tc.reasons[len(tc.reasons)-1]) {
				t.Fatalf("ejection %+v", e)
			}
		})
	}
}

func TestEjectionSuccessResetsCount(t *testing.T) {
	s := ejectState(t, testEjection, "a", "b")
	s.AttemptFailed("a", "reset", now)
	s.AttemptFailed("a", "reset", now)
	s.AttemptSucceeded("a")
	if e := s.AttemptFailed("a", "reset", now); e.Ejected {
		t.Fatal("ejected after a success broke the run")
	}
}

// TestEjectionCappedAtHalf: every worker of a pool of four refuses; only
// two (50%) are ejected, the others stay routable; when an ejection ends,
// room is made for the next.
func TestEjectionCappedAtHalf(t *testing.T) {
	s := ejectState(t, testEjection, "a", "b", "c", "d")
	var ejected, capped []string
	for _, id := range []string{"a", "b", "c", "d"} {
		e := s.AttemptFailed(id, "refused", now)
		if e.Ejected {
			ejected = append(ejected, id)
		}
		if e.Capped {
			capped = append(capped, id)
		}
	}
	if len(ejected) != 2 || len(capped) != 2 {
		t.Fatalf("ejected %v, capped %v: want two of each", ejected, capped)
	}
	for range 8 {
		tg, err := s.Pick(&Request{Model: "m", RequestID: "x"}, now)
		if err != nil {
			t.Fatal(err)
		}
		if s.ejected(tg.Worker.ID, now) {
			t.Fatalf("picked ejected %s", tg.Worker.ID)
		}
		s.Release(tg.Worker.ID)
	}
	// Ejections end after 10 s; c fails again and is ejected now.
	later := now.Add(10 * time.Second)
	if e := s.AttemptFailed("c", "refused", later); !e.Ejected {
		t.Fatalf("c not ejected once room was made: %+v", e)
	}
	// A single worker is never ejected (⌊1 × 50%⌋ = 0).
	one := ejectState(t, testEjection, "solo")
	if e := one.AttemptFailed("solo", "refused", now); e.Ejected || !e.Capped {
		t.Fatalf("single worker: %+v", e)
	}
	// max_percent 0 turns ejection off.
	off := ejectState(t, EjectionConfig{Failures: 1, Refused: 1, Base: time.Second, Max: time.Second}, "a", "b")
	if e := off.AttemptFailed("a", "refused", now); e.Ejected {
		t.Fatal("ejected with max_percent 0")
	}
}

func TestEjectionTime(t *testing.T) {
	for k, want := range map[int]time.Duration{1: 10 * time.Second, 2: 20 * time.Second, 3: 25 * time.Second, 100: 25 * time.Second} {
		if got := EjectionTime(testEjection, k); got != want {
			t.Errorf("EjectionTime(%d) = %v, want %v", k, got, want)
		}
	}
}

func TestEjectionFailuresWhileEjectedIgnored(t *testing.T) {
	s := ejectState(t, testEjection, "a", "b")
	s.AttemptFailed("a", "refused", now)
	// Attempts sent before the ejection fail later: no extension.
	if e := s.AttemptFailed("a", "refused", now.Add(time.Second)); e.Ejected {
		t.Fatal("an ejected worker's late failure extended the ejection")
	}
	if v := s.Workers(now)[0]; v.EjectedUntil != now.Add(10*time.Second) || v.EjectionReason != "refused" || v.Ejections != 1 {
		t.Fatalf("view %+v", v)
	}
	// Heartbeats do not end it.
	s.SetWorker(w("a", "m", fleet.RoleUnified, 0, 0))
	if !s.ejected("a", now.Add(9*time.Second)) {
		t.Fatal("a heartbeat ended the ejection")
	}
	// A long quiet spell resets the multiplier.
	far := now.Add(10*time.Second + 25*time.Second)
	if e := s.AttemptFailed("a", "refused", far); !e.Ejected || !e.Until.Equal(far.Add(10*time.Second)) {
		t.Fatalf("after a quiet spell: %+v, want one base", e)
	}
}

func TestEjectionForgottenForNewProcess(t *testing.T) {
	s := ejectState(t, testEjection, "a", "b")
	s.AttemptFailed("a", "refused", now)
	moved := w("a", "m", fleet.RoleUnified, 0, 0)
	moved.HTTPAddress = "127.0.0.1:2"
	s.SetWorker(moved)
	if s.ejected("a", now) {
		t.Fatal("a restarted at a new address is still ejected")
	}
	s.AttemptFailed("a", "refused", now)
	restarted := moved
	restarted.StartedAt = now
	s.SetWorker(restarted)
	if s.ejected("a", now) {
		t.Fatal("a with a new start time is still ejected")
	}
}

func TestCountsForEjection(t *testing.T) {
	for reason, want := range map[string]bool{
		"refused": true, "reset": true, "timeout": true, "eof": true, "transport": true, "status_503": true, "status_500": true,
		"status_5xx": true, "bad_answer": true, "truncated": true,
		"canceled": false, "too_large": false, "invalid": false, "error": false, "": false,
	} {
		if got := CountsForEjection(reason); got != want {
			t.Errorf("CountsForEjection(%q) = %v, want %v", reason, got, want)
		}
	}
}

// TestEjectionIgnoresTheClientsFailures: failures that are not the
// engine's (the client leaving, a body too large) never count.
func TestEjectionIgnoresTheClientsFailures(t *testing.T) {
	s := ejectState(t, testEjection, "a", "b")
	for range 5 {
		for _, r := range []string{"canceled", "too_large", "invalid"} {
			if e := s.AttemptFailed("a", r, now); e.Ejected || e.Capped {
				t.Fatalf("ejected on %q: %+v", r, e)
			}
		}
	}
	if e := s.AttemptFailed("a", "refused", now); !e.Ejected {
		t.Fatalf("a refused connection after the client's failures did not eject: %+v", e)
	}
}

// TestSuspectWorkerGetsOneTrialAtATime: a worker whose last attempt failed
// (below the ejection threshold) takes one request at a time until an
// attempt on it has an outcome: an engine that died costs one more failed
// attempt, not one for every request routed before the failure is known.
// Suspicion never refuses a request, and an answer ends it.
func TestSuspectWorkerGetsOneTrialAtATime(t *testing.T) {
	pick := func(s *State) string {
		t.Helper()
		tg, err := s.Pick(&Request{Model: "m", RequestID: "x"}, now)
		if err != nil {
			t.Fatal(err)
		}
		return tg.Worker.ID
	}
	load := func(s *State, id string, n int) {
		for range n {
			s.sent(id)
		}
	}

	t.Run("one trial, then ejected", func(t *testing.T) {
		s := ejectState(t, testEjection, "a", "b")
		load(s, "b", 3)
		s.AttemptFailed("a", "reset", now) // an attempt in flight when a died
		if v := s.Workers(now)[0]; v.ConsecutiveFailures != 1 {
			t.Fatalf("view of suspect a: %d consecutive failures, want 1", v.ConsecutiveFailures)
		}
		if got := pick(s); got != "a" {
			t.Fatalf("first pick %s, want the trial on a (least loaded)", got)
		}
		for i := range 3 {
			if got := pick(s); got != "b" {
				t.Fatalf("pick %d with a's trial in flight: %s, want b", i, got)
			}
		}
		if e := s.AttemptFailed("a", "refused", now); !e.Ejected {
			t.Fatalf("the trial's refusal did not eject a: %+v", e)
		}
		if v := s.Workers(now)[0]; v.ConsecutiveFailures != 0 {
			t.Fatalf("view of ejected a: %d consecutive failures, want 0", v.ConsecutiveFailures)
		}
	})

	t.Run("an answer ends suspicion", func(t *testing.T) {
		s := ejectState(t, testEjection, "a", "b")
		load(s, "b", 3)
		s.AttemptFailed("a", "reset", now)
		pick(s) // the trial on a
		s.AttemptSucceeded("a")
		if got := pick(s); got != "a" {
			t.Fatalf("pick after a answered: %s, want a (least loaded, no longer suspect)", got)
		}
		if got := pick(s); got != "a" {
			t.Fatalf("second pick after a answered: %s, want a again", got)
		}
	})

	t.Run("a trial that ends without an outcome frees the turn", func(t *testing.T) {
		s := ejectState(t, testEjection, "a", "b")
		load(s, "b", 3)
		s.AttemptFailed("a", "reset", now)
		pick(s)
		s.Release("a") // the client left before the attempt's outcome
		if got := pick(s); got != "a" {
			t.Fatalf("pick after the trial was released: %s, want another trial on a", got)
		}
	})

	t.Run("never refuses", func(t *testing.T) {
		s := ejectState(t, testEjection, "a")
		s.AttemptFailed("a", "reset", now)
		for i := range 3 {
			if got := pick(s); got != "a" {
				t.Fatalf("pick %d: %s, want a, the only worker", i, got)
			}
		}
	})
}

// TestEvictedWorkerForgetsEjection: an ejected worker is listed not
// routable; once evicted (or gone from the probe list) its record is
// forgotten with it, so the same id coming back at the same address and
// with no start time (a restarted llama-server) is routable at once with
// a clean record, and its next ejection is a first one.
func TestEvictedWorkerForgetsEjection(t *testing.T) {
	s := ejectState(t, testEjection, "a", "b")
	if e := s.AttemptFailed("a", "refused", now); !e.Ejected {
		t.Fatal("not ejected")
	}
	view := func(id string) WorkerView {
		for _, v := range s.Workers(now) {
			if v.ID == id {
				return v
			}
		}
		t.Fatalf("%s not listed", id)
		return WorkerView{}
	}
	if v := view("a"); v.Routable || v.EjectedUntil.IsZero() {
		t.Fatalf("ejected worker listed %+v, want routable false with its ejection", v)
	}
	s.RemoveWorker("a")
	s.SetWorker(w("a", "m", fleet.RoleUnified, 0, 0))
	if s.ejected("a", now) {
		t.Fatal("the ejection outlived the worker's eviction")
	}
	if v := view("a"); !v.Routable || !v.EjectedUntil.IsZero() || v.Ejections != 0 || v.ConsecutiveFailures != 0 {
		t.Fatalf("worker back after its eviction listed %+v, want a clean record", v)
	}
	picked := map[string]bool{}
	for range 4 {
		tg, err := s.Pick(&Request{Model: "m", RequestID: "x"}, now)
		if err != nil {
			t.Fatal(err)
		}
		picked[tg.Worker.ID] = true
		s.Release(tg.Worker.ID)
	}
	if !picked["a"] {
		t.Fatalf("picks %v never chose a after it came back", picked)
	}
	if e := s.AttemptFailed("a", "refused", now); !e.Ejected || !e.Until.Equal(now.Add(testEjection.Base)) {
		t.Fatalf("next ejection %+v, want a first one (one Base)", e)
	}
}

// TestEjectionBackoffBetweenBaseAndMax: a failure that comes after an
// ejection ended but before Max has passed since makes the next ejection
// the second one, 2 × Base; only a quiet spell of Max starts again at one
// Base.
func TestEjectionBackoffBetweenBaseAndMax(t *testing.T) {
	ended := now.Add(testEjection.Base)
	for _, after := range []time.Duration{testEjection.Base, testEjection.Max - time.Second} {
		s := ejectState(t, testEjection, "a", "b")
		if e := s.AttemptFailed("a", "refused", now); !e.Ejected {
			t.Fatal("not ejected")
		}
		at := ended.Add(after)
		if e := s.AttemptFailed("a", "refused", at); !e.Ejected || !e.Until.Equal(at.Add(2*testEjection.Base)) {
			t.Fatalf("failure %v after the ejection ended: %+v, want ejected for 2 × Base", after, e)
		}
	}
}

// TestPeerLiftNeedsAListedReplica: with the fleet listed, a lift of an
// ejection this replica made on its own evidence is taken from a listed
// replica (an operator's lift it relays), never from one the list does
// not name.
func TestPeerLiftNeedsAListedReplica(t *testing.T) {
	s, _ := syncState(t, policy.NameLeastOutstanding, SyncConfig{Listed: []string{"p1", "p2"}}, "a", "b")
	if e := s.AttemptFailed("a", "refused", now); !e.Ejected {
		t.Fatalf("a not ejected: %+v", e)
	}
	lift := func(replica string) PeerApplied {
		return s.ApplyPeer(&PeerBatch{Replica: replica, Sent: now, Events: []PeerEvent{{Kind: PeerLift, Worker: "a"}}}, now)
	}
	if r := lift("x"); r.Dropped[PeerDrop{PeerLift, DropUnlisted}] != 1 || !s.ejected("a", now) {
		t.Fatalf("an unlisted replica's lift: %+v, ejected %v", r, s.ejected("a", now))
	}
	if lift("p1"); s.ejected("a", now) {
		t.Fatal("a listed replica's lift left the worker ejected")
	}
}
