package procs

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/tlgate/tlgate/internal/testkit/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

func TestParseStat(t *testing.T) {
	for _, tc := range []struct {
		in      string
		ticks   int64
		ppid    int
		wantErr bool
	}{
		{"1234 (nginx) S 1 1234 1234 0 -1 4194560 100 0 0 0 7 3 0 0 20 0 1 0 100 0 0", 10, 1, false},
		{"42 (a b) (c)) R 7 42 42 0 -1 0 0 0 0 0 120 30 5 5 20 0 1 0 100 0 0", 150, 7, false},
		{"42 nginx S 1", 0, 0, true},
		{"42 (x) S 1 2 3", 0, 0, true},
		{"42 (x) S one 1 1 0 -1 0 0 0 0 0 1 1 0 0 20 0 1 0 100 0 0", 0, 0, true},
	} {
		ticks, ppid, err := ParseStat([]byte(tc.in))
		if (err != nil) != tc.wantErr || ticks != tc.ticks || ppid != tc.ppid {
			t.Errorf("ParseStat(%q) = %d, %d, %v; want %d, %d, error %v", tc.in, ticks, ppid, err, tc.ticks, tc.ppid, tc.wantErr)
		}
	}
}

func TestParseSwitches(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    int64
		wantErr bool
	}{
		{"Name:\tgateway\nState:\tS (sleeping)\nvoluntary_ctxt_switches:\t120\nnonvoluntary_ctxt_switches:\t7\n", 127, false},
		{"voluntary_ctxt_switches:\t3\n", 0, true},
		{"voluntary_ctxt_switches:\tx\nnonvoluntary_ctxt_switches:\t7\n", 0, true},
		{"", 0, true},
	} {
		got, err := ParseSwitches([]byte(tc.in))
		if (err != nil) != tc.wantErr || got != tc.want {
			t.Errorf("ParseSwitches(%q) = %d, %v; want %d, error %v", tc.in, got, err, tc.want, tc.wantErr)
		}
	}
}

// TestSwitchesOfSelfGrow sleeps and checks /proc counts the switches.
func TestSwitchesOfSelfGrow(t *testing.T) {
	before, err := Switches(os.Getpid())
	if err != nil {
		t.Skip(err)
	}
	for range 5 {
		time.Sleep(time.Millisecond)
	}
	after, err := Switches(os.Getpid())
	if err != nil || after <= before {
		t.Fatalf("switches %d → %d (%v)", before, after, err)
	}
}

// TestCPUOfSelfGrows burns CPU and checks /proc accounts for it.
func TestCPUOfSelfGrows(t *testing.T) {
	before, err := SelfCPU()
	if err != nil {
		t.Skip(err)
	}
	x := 0
	for start := time.Now(); time.Since(start) < 100*time.Millisecond; {
		x++
	}
	after, err := SelfCPU()
	if err != nil || after <= before || x == 0 {
		t.Fatalf("CPU %v → %v (%v)", before, after, err)
	}
	if _, err := CPU(os.Getpid(), true); err != nil {
		t.Fatal(err)
	}
}

func TestStartStopAndChildrenCPU(t *testing.T) {
	sh := "/bin/sh"
	if _, err := os.Stat(sh); err != nil {
		t.Skip(sh)
	}
	// A shell whose child burns CPU: its own CPU is near zero, with its
	// children counted it grows.
	p, err := Start("burn", t.TempDir(), sh, []string{"-c", "sh -c 'while :; do :; done' & wait"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop(time.Second)
	deadline := time.Now().Add(10 * time.Second)
	for {
		with, err := CPU(p.Pid(), true)
		if err != nil {
			t.Fatal(err)
		}
		if with >= 50*time.Millisecond {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("children's CPU not counted: %v", with)
		}
		time.Sleep(20 * time.Millisecond)
	}
	err = p.WaitHTTP(context.Background(), "http://127.0.0.1:1/", 200, 50*time.Millisecond)
	if err == nil {
		t.Fatal("WaitHTTP on a closed port succeeded")
	}
}

func TestCounter(t *testing.T) {
	exp := []byte("# HELP go_gc_duration_seconds x\ngo_gc_duration_seconds_count 12\ngo_memstats_alloc_bytes_total 1.5e+06\nfoo{a=\"b\"} 3\n")
	if v, ok := Counter(exp, "go_memstats_alloc_bytes_total"); !ok || v != 1.5e6 {
		t.Fatalf("alloc = %v %v", v, ok)
	}
	if v, ok := Counter(exp, "go_gc_duration_seconds_count"); !ok || v != 12 {
		t.Fatalf("gc = %v %v", v, ok)
	}
	if _, ok := Counter(exp, "missing"); ok {
		t.Fatal("found a missing counter")
	}
}

func TestFreeAddrsDistinct(t *testing.T) {
	addrs, err := FreeAddrs(16)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, a := range addrs {
		if seen[a] {
			t.Fatalf("%s handed out twice in %v", a, addrs)
		}
		seen[a] = true
	}
}
