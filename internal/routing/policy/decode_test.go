package policy

import "testing"

func TestDecodeByLoad(t *testing.T) {
	d := func(id string, running, free, total int) DecodeCandidate {
		return DecodeCandidate{Candidate: Candidate{ID: id}, Running: running, FreeKV: free, TotalKV: total}
	}
	cases := []struct {
		name   string
		cs     []DecodeCandidate
		want   string
		reason string
	}{
		{"none", nil, "", ""},
		{"fewest running", []DecodeCandidate{d("a", 3, 500, 1000), d("b", 1, 100, 1000), d("c", 2, 900, 1000)}, "b", ReasonDecodeLoad},
		{"ties to the most free KV", []DecodeCandidate{d("a", 2, 500, 1000), d("b", 2, 800, 1000)}, "b", ReasonDecodeLoad},
		{"ties to the smallest id", []DecodeCandidate{d("b", 2, 500, 1000), d("a", 2, 500, 1000)}, "a", ReasonDecodeLoad},
		{"a full one passed over", []DecodeCandidate{d("a", 0, 40, 1000), d("b", 5, 600, 1000)}, "b", ReasonDecodeKV},
		{"all full: the most free KV", []DecodeCandidate{d("a", 0, 10, 1000), d("b", 7, 40, 1000)}, "b", ReasonDecodeKV},
		{"unknown KV counts as room", []DecodeCandidate{d("a", 1, 0, 0), d("b", 2, 900, 1000)}, "a", ReasonDecodeLoad},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			i, reason := DecodeByLoad(tc.cs)
			got := ""
			if i >= 0 {
				got = tc.cs[i].ID
			}
			if got != tc.want || reason != tc.reason {
				t.Fatalf("picked %q (%s), want %q (%s)", got, reason, tc.want, tc.reason)
			}
		})
	}
	// Tie orders equal candidates before their id.
	cs := []DecodeCandidate{d("a", 1, 5, 10), d("b", 1, 5, 10)}
	cs[0].Tie, cs[1].Tie = 9, 2
	if i, _ := DecodeByLoad(cs); cs[i].ID != "b" {
		t.Fatalf("tie rank ignored: %s", cs[i].ID)
	}
}
