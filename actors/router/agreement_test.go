package router

import (
	"errors"
	"fmt"
	"testing"

	"github.com/tlgate/tlgate/internal/routing/kvindex"
)

// agreementState has two workers whose views are exact and empty, and
// checks agreement at share, sampling one request in sample.
func agreementState(t *testing.T, share float64, sample int) (*State, *[]bool) {
	t.Helper()
	var seen []bool
	cfg := Config{IndexAgreement: share, AgreementSample: sample}
	cfg.Observe.OnAgreement = func(model string, agreed bool) {
		if model != "m" {
			t.Errorf("agreement observed for model %q", model)
		}
		seen = append(seen, agreed)
	}
	s := exactState(t, cfg, "a", "b")
	events(t, s, "a", kvindex.Exact)
	events(t, s, "b", kvindex.Exact)
	return s, &seen
}

// shared is the document every request of pickWith begins with, in
// text for the prefix index and in tokens for the exact view.
var shared, sharedTokens = words("shared document", 1024), etoks(900_000, 16*ebs)

// pickWith picks a request of the shared document and n's question with
// its tokens, and records it as begun (Indexed): from the second on, the
// index and the view (its speculation) hold the document on the same
// worker, and both pick it alike.
func pickWith(t *testing.T, s *State, n int, keys *TokenKeys) Target {
	t.Helper()
	req := &Request{Model: "m", RequestID: fmt.Sprint("r", n), Prompt: shared + words(fmt.Sprint("p", n), 400),
		Tokens: map[string][]uint32{"m": append(append([]uint32{}, sharedTokens...), etoks(n*1000, 4*ebs)...)}, Keys: keys}
	tg, err := s.Pick(req, now)
	if err != nil {
		t.Fatalf("pick %d with tokens: %v", n, err)
	}
	s.Indexed(tg.Indexing, now)
	s.Release(tg.Worker.ID)
	return tg
}

// pickWithout picks a request that brings no tokens and reports whether
// it was asked for them.
func pickWithout(t *testing.T, s *State, n int, keys *TokenKeys) (Target, bool) {
	t.Helper()
	req := &Request{Model: "m", RequestID: fmt.Sprint("q", n), Prompt: words(fmt.Sprint("q", n), 400), Keys: keys}
	tg, err := s.Pick(req, now)
	if errors.Is(err, ErrNeedTokens) {
		return Target{}, true
	}
	if err != nil {
		t.Fatalf("pick %d without tokens: %v", n, err)
	}
	s.Release(tg.Worker.ID)
	return tg, false
}

// TestAgreementSkipsTokenizing: once the prefix index made the same pick
// as the events for the share of a model's latest checks, its requests
// route on the index untokenized, but the sample; a request decides once.
func TestAgreementSkipsTokenizing(t *testing.T) {
	s, seen := agreementState(t, 0.9, 4)
	pickWith(t, s, -1, &TokenKeys{}) // nothing cached yet: no check
	if len(*seen) != 0 {
		t.Fatalf("a prompt neither view holds any of was checked: %v", *seen)
	}
	for n := range AgreementChecks - 1 {
		pickWith(t, s, n, &TokenKeys{})
		if _, asked := pickWithout(t, s, 1000+n, &TokenKeys{}); !asked {
			t.Fatalf("routed untokenized after %d checks of %d", n+1, AgreementChecks)
		}
	}
	// A request routed again (a failover, a dispatch scan) is checked once.
	keys := &TokenKeys{}
	pickWith(t, s, 63, keys)
	pickWith(t, s, 63, keys)
	if len(*seen) != AgreementChecks {
		t.Fatalf("%d checks observed, want %d", len(*seen), AgreementChecks)
	}
	for i, ok := range *seen {
		if !ok {
			t.Fatalf("check %d disagreed: both views knew nothing", i)
		}
	}
	var asked []int
	for n := range 12 {
		keys := &TokenKeys{}
		tg, ask := pickWithout(t, s, 2000+n, keys)
		if ask {
			asked = append(asked, n)
			continue
		}
		if tg.CacheView != ViewAgreed || tg.Indexing.Exact.Expect {
			t.Fatalf("untokenized pick %d: view %q, expects events %v", n, tg.CacheView, tg.Indexing.Exact.Expect)
		}
		// Its next Route decides alike and leaves the sample's count.
		if _, again := pickWithout(t, s, 2000+n, keys); again {
			t.Fatalf("request %d asked for tokens on its second route", n)
		}
	}
	if fmt.Sprint(asked) != "[3 7 11]" {
		t.Fatalf("asked for tokens at %v, want one in 4: [3 7 11]", asked)
	}
}

// TestDisagreementTokenizesAgain: picks on the events that the prefix
// index would not have made (a worker holds a document the gateway never
// sent it) end the trust; every request is tokenized again.
func TestDisagreementTokenizesAgain(t *testing.T) {
	s, seen := agreementState(t, 0.9, 1<<20) // no sample asks here
	for n := range AgreementChecks + 1 {
		pickWith(t, s, n, &TokenKeys{})
	}
	if _, asked := pickWithout(t, s, 1000, &TokenKeys{}); asked {
		t.Fatal("asked for tokens although the index agreed on every check")
	}
	doc := etoks(500_000, 16*ebs)
	events(t, s, "b", kvindex.Exact, storedBatch(doc, 0))
	// The index picks a (the lower id, both idle); the events b.
	disagree := 0
	for n := 0; ; n++ {
		req := &Request{Model: "m", RequestID: "d", Prompt: words(fmt.Sprint("d", n), 400),
			Tokens: map[string][]uint32{"m": append(append([]uint32{}, doc...), etoks(600_000+n*100, 20)...)}, Keys: &TokenKeys{}}
		tg, err := s.Pick(req, now)
		if err != nil || tg.Worker.ID != "b" || tg.CacheView != "exact" {
			t.Fatalf("pick on the events: %s %s %v", tg.Worker.ID, tg.CacheView, err)
		}
		s.Release("b")
		disagree++
		if _, asked := pickWithout(t, s, 3000+n, &TokenKeys{}); asked {
			break
		}
		if disagree > AgreementChecks {
			t.Fatal("still untokenized after a window of disagreements")
		}
	}
	// 0.9 of 64 is 57.6: the seventh disagreement leaves 57 agreeing.
	if disagree != 7 {
		t.Fatalf("tokenized again after %d disagreements, want 7", disagree)
	}
	if (*seen)[len(*seen)-1] {
		t.Fatal("the last check was observed as agreeing")
	}
	for n := range 3 {
		if _, asked := pickWithout(t, s, 4000+n, &TokenKeys{}); !asked {
			t.Fatalf("request %d after the disagreements routed untokenized", n)
		}
	}
}

// TestAgreementOff: with IndexAgreement 0 every request is tokenized,
// however often the index agreed.
func TestAgreementOff(t *testing.T) {
	s, seen := agreementState(t, 0, 8)
	for n := range 2 * AgreementChecks {
		pickWith(t, s, n, &TokenKeys{})
	}
	if _, asked := pickWithout(t, s, 1000, &TokenKeys{}); !asked {
		t.Fatal("routed untokenized with index_agreement 0")
	}
	if len(*seen) != 0 {
		t.Fatalf("%d checks made with index_agreement 0", len(*seen))
	}
}

// TestAgreementChecksWholePrompts: a pick on a conversation's earlier
// turn's tokens alone (Partial) is no check: it is not exact itself.
func TestAgreementChecksWholePrompts(t *testing.T) {
	s, seen := agreementState(t, 0.9, 8)
	req := &Request{Model: "m", RequestID: "r", Prompt: words("p", 400), Tokens: map[string][]uint32{"m": etoks(0, 4*ebs)},
		Partial: map[string]bool{"m": true}, Keys: &TokenKeys{}}
	tg, err := s.Pick(req, now)
	if err != nil || tg.CacheView != "exact" {
		t.Fatalf("pick on an earlier turn's tokens: %+v %v", tg, err)
	}
	if len(*seen) != 0 {
		t.Fatalf("%d checks of a pick on partial tokens", len(*seen))
	}
}

// TestAgreementTolerance: the index's pick of another worker still agrees
// when, on the exact views, it costs at most a request's load and a block
// more than the exact pick; beyond that it disagrees.
func TestAgreementTolerance(t *testing.T) {
	doc := etoks(700_000, 32*ebs)
	for _, tc := range []struct {
		name   string
		aHolds int // blocks of doc a holds; b holds them all
		agreed bool
	}{
		{"a block short", 31, true},
		{"five blocks short", 27, true}, // 80 tokens: a request's load (64) and a block
		{"six blocks short", 26, false},
		{"ten blocks short", 22, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, seen := agreementState(t, 0.9, 8)
			events(t, s, "a", kvindex.Exact, storedBatch(doc[:tc.aHolds*ebs], 0))
			events(t, s, "b", kvindex.Exact, storedBatch(doc, 1000))
			text := words("tolerance document", 2048)
			// The index believes both hold the whole document: it picks a,
			// the lower id.
			for _, id := range []string{"a", "b"} {
				other := map[string]bool{"a": id == "b", "b": id == "a"}
				tg, err := s.Pick(&Request{Model: "m", RequestID: "i", Prompt: text, NoAsk: true, Exclude: other}, now)
				if err != nil || tg.Worker.ID != id {
					t.Fatalf("recording the document on %s: picked %s, %v", id, tg.Worker.ID, err)
				}
				s.Indexed(tg.Indexing, now)
				s.Release(id)
			}
			if s.indexChunks("a") == 0 || s.indexChunks("b") == 0 {
				t.Fatalf("the index holds %d chunks on a, %d on b; want the document on both", s.indexChunks("a"), s.indexChunks("b"))
			}
			req := &Request{Model: "m", RequestID: "r", Prompt: text + "question",
				Tokens: map[string][]uint32{"m": append(append([]uint32{}, doc...), etoks(800_000, 8)...)}, Keys: &TokenKeys{}}
			tg, err := s.Pick(req, now)
			if err != nil || tg.Worker.ID != "b" {
				t.Fatalf("exact pick %s, %v; want b, which holds the whole document", tg.Worker.ID, err)
			}
			if len(*seen) != 1 || (*seen)[0] != tc.agreed {
				t.Fatalf("checks %v, want one, agreed %v", *seen, tc.agreed)
			}
		})
	}
}

// TestAgreementIndexClaimingEvicted: where the prefix index believes a
// document cached on a worker whose events say it holds none of it, the
// index's pick disagrees, although on the events every worker is as good
// and the exact pick may be the index's own.
func TestAgreementIndexClaimingEvicted(t *testing.T) {
	doc := etoks(600_000, 32*ebs)
	for _, tc := range []struct {
		name   string
		aHolds int // blocks of doc a's events say it holds; b holds none
		agreed bool
	}{
		{"the engine holds it", 32, true},
		{"the engine holds nearly all", 28, true}, // 64 tokens short: within a request's load and a block
		{"the engine evicted half", 16, false},
		{"the engine evicted it", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, seen := agreementState(t, 0.9, 8)
			if tc.aHolds > 0 {
				events(t, s, "a", kvindex.Exact, storedBatch(doc[:tc.aHolds*ebs], 0))
			}
			text := words("evicted document", 2048)
			tg, err := s.Pick(&Request{Model: "m", RequestID: "i", Prompt: text, NoAsk: true, Exclude: map[string]bool{"b": true}}, now)
			if err != nil || tg.Worker.ID != "a" {
				t.Fatalf("recording the document on a: picked %s, %v", tg.Worker.ID, err)
			}
			s.Indexed(tg.Indexing, now)
			s.Release("a")
			if s.indexChunks("a") == 0 || s.indexChunks("b") != 0 {
				t.Fatalf("the index holds %d chunks on a, %d on b; want the document on a alone", s.indexChunks("a"), s.indexChunks("b"))
			}
			req := &Request{Model: "m", RequestID: "r", Prompt: text + "question",
				Tokens: map[string][]uint32{"m": append(append([]uint32{}, doc...), etoks(800_000, 8)...)}, Keys: &TokenKeys{}}
			if _, err := s.Pick(req, now); err != nil {
				t.Fatalf("exact pick: %v", err)
			}
			if len(*seen) != 1 || (*seen)[0] != tc.agreed {
				t.Fatalf("checks %v, want one, agreed %v", *seen, tc.agreed)
			}
		})
	}
}
