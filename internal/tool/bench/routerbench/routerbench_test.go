package routerbench

import (
	"context"
	"fmt"
	"testing"

	"github.com/tlgate/tlgate/internal/routing/fleet"
	"github.com/tlgate/tlgate/internal/routing/policy"
	"github.com/tlgate/tlgate/internal/testkit/leakcheck"
)

func TestMain(m *testing.M) {
	leakcheck.VerifyTestMain(m)
}

func TestMeasure(t *testing.T) {
	for _, p := range []policy.Name{policy.NameLeastOutstanding, policy.NameWeighted, policy.NameAffinity} {
		for _, n := range []int{1, 5} {
			t.Run(fmt.Sprintf("%s/%d", p, n), func(t *testing.T) {
				r, err := Measure(context.Background(), Config{Workers: n, Policy: p, Budget: 1, MinOps: 200})
				if err != nil {
					t.Fatal(err)
				}
				if r.Workers != n || r.Policy != p || r.ActorOps < 200 || r.PickOps < 200 {
					t.Errorf("result %+v", r)
				}
				if r.ActorNsPerOp <= 0 || r.PickNsPerOp <= 0 || r.InActorNsPerOp < 0 {
					t.Errorf("timings %+v", r)
				}
			})
		}
	}
	if _, err := Measure(context.Background(), Config{Workers: 0, Policy: policy.NameAffinity}); err == nil {
		t.Error("Measure with no workers succeeded")
	}
}

func TestStatusIsValid(t *testing.T) {
	seen := map[string]bool{}
	for i := range 1100 {
		s := Status(i)
		if err := fleet.Validate(s); err != nil {
			t.Fatalf("Status(%d): %v", i, err)
		}
		if seen[s.GetWorkerId()] {
			t.Fatalf("Status(%d) repeats id %s", i, s.GetWorkerId())
		}
		seen[s.GetWorkerId()] = true
	}
}

func TestRequests(t *testing.T) {
	reqs := requests(64)
	keys := map[string]bool{}
	for _, r := range reqs {
		if r.Model != Model || len(r.PrefixKey) == 0 || len(r.PrefixKey) > 64 {
			t.Fatalf("request %+v", r)
		}
		keys[string(r.PrefixKey)] = true
	}
	if len(keys) != 64 {
		t.Errorf("%d distinct prefix keys, want 64", len(keys))
	}
}
