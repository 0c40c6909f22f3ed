package probe

import (
	"fmt"
	"testing"
)

// TestProbeFlapThresholds feeds outcome sequences ('+' a good probe, '-' a
// failed one) and checks liveness after each ('L' live, '.' not) and where it
// changed ('^').
func TestProbeFlapThresholds(t *testing.T) {
	tests := []struct {
		name       string
		rise, fall int
		outcomes   string
		live       string
		changed    string
	}{
		{name: "starts not live", rise: 2, fall: 3, outcomes: "", live: "", changed: ""},
		{name: "one good probe is not enough", rise: 2, fall: 3, outcomes: "+", live: ".", changed: " "},
		{name: "two good probes make it live", rise: 2, fall: 3, outcomes: "++", live: ".L", changed: " ^"},
		{name: "a failure resets the rise", rise: 2, fall: 3, outcomes: "+-++", live: "...L", changed: "   ^"},
		{name: "one failure does not flap", rise: 2, fall: 3, outcomes: "++-+", live: ".LLL", changed: " ^  "},
		{name: "two failures do not flap", rise: 2, fall: 3, outcomes: "++--+", live: ".LLLL", changed: " ^   "},
		{name: "fall failures in a row stop it", rise: 2, fall: 3, outcomes: "++---", live: ".LLL.", changed: " ^  ^"},
		{name: "a success resets the fall", rise: 2, fall: 3, outcomes: "++--+---", live: ".LLLLLL.", changed: " ^     ^"},
		{name: "more failures change nothing", rise: 2, fall: 3, outcomes: "++-----", live: ".LLL...", changed: " ^  ^  "},
		{name: "it rises again", rise: 2, fall: 3, outcomes: "++---++", live: ".LLL..L", changed: " ^  ^ ^"},
		{name: "alternating never rises", rise: 2, fall: 3, outcomes: "+-+-+-", live: "......", changed: "      "},
		{name: "alternating never falls", rise: 2, fall: 3, outcomes: "++-+-+-", live: ".LLLLLL", changed: " ^     "},
		{name: "zero thresholds use the defaults", rise: 0, fall: 0, outcomes: "++---", live: ".LLL.", changed: " ^  ^"},
		{name: "rise 1 and fall 1 follow every outcome", rise: 1, fall: 1, outcomes: "+-+", live: "L.L", changed: "^^^"},
		{name: "heartbeat_miss_limit 5", rise: 3, fall: 5, outcomes: "+++-----", live: "..LLLLL.", changed: "  ^    ^"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := Tracker{Rise: tt.rise, Fall: tt.fall}
			var live, changed []byte
			for _, o := range tt.outcomes {
				l, c := tr.Observe(o == '+')
				live = append(live, map[bool]byte{true: 'L', false: '.'}[l])
				changed = append(changed, map[bool]byte{true: '^', false: ' '}[c])
				if tr.Live() != l {
					t.Fatalf("Live() = %v after Observe returned %v", tr.Live(), l)
				}
			}
			if string(live) != tt.live || string(changed) != tt.changed {
				t.Errorf("outcomes %q:\n live    %q want %q\n changed %q want %q", tt.outcomes, live, tt.live, changed, tt.changed)
			}
		})
	}
}

func ExampleTracker() {
	tr := Tracker{Rise: 2, Fall: 3}
	for _, ok := range []bool{true, true, false, true, false, false, false} {
		live, changed := tr.Observe(ok)
		fmt.Println(ok, live, changed)
	}
	// Output:
	// true false false
	// true true true
	// false true false
	// true true false
	// false true false
	// false true false
	// false false true
}
