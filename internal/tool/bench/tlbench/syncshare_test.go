package tlbench

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/internal/tool/bench/loadgen"
	"github.com/tlgate/tlgate/internal/wire/openai"
)

// fakeSyncer records what a mirror peer tells the fleet.
type fakeSyncer struct {
	mu       sync.Mutex
	calls    []string
	hashes   []uint64
	released []string
}

func (f *fakeSyncer) Picked(model, worker string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "pick "+model+" "+worker)
}

func (f *fakeSyncer) Indexed(model, worker string, hashes []uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "index "+model+" "+worker)
	f.hashes = hashes
}

func (f *fakeSyncer) Released(worker string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "release "+worker)
	f.released = append(f.released, worker)
}

func (f *fakeSyncer) Load([]router.WorkerLoad) {}

func (f *fakeSyncer) seen() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

// countingTransport stands for the fleet's replicas.
type countingTransport struct{ hosts []string }

func (c *countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	c.hosts = append(c.hosts, req.URL.Host)
	return &http.Response{StatusCode: http.StatusTeapot, Body: http.NoBody, Request: req}, nil
}

// TestMirrorPeerTellsWhatARouterWould: a request sent to a mirror peer is
// answered with a stream the load generator reads, and the peer reports
// the pick with the prompt's chunk hashes at once and the release when
// the answer is closed; other hosts go on to the fleet, counted.
func TestMirrorPeerTellsWhatARouterWould(t *testing.T) {
	c := smallest("")
	sessions, err := openSessions(c, loadgen.RAG, 50, 1)
	if err != nil {
		t.Fatal(err)
	}
	req := sessions[0].Turns[0]
	engines := costEngines(c)
	fake := &fakeSyncer{}
	p := newMirrorPeer(0, c.Model, engines, fake)
	next := &countingTransport{}
	tr := &mirrorTransport{next: next, peers: map[string]*mirrorPeer{p.host: p}}
	client := &http.Client{Transport: tr}

	_, ttft, err := loadgen.Do(t.Context(), client, tr.urls()[0], req)
	if err != nil || ttft <= 0 {
		t.Fatalf("mirror answer: ttft %v, %v", ttft, err)
	}
	parsed, err := openai.ParseRequest(req.Body, true)
	if err != nil {
		t.Fatal(err)
	}
	want := p.hasher.Hashes(nil, parsed.Prompt)
	calls := fake.seen()
	if len(calls) != 3 || !strings.HasPrefix(calls[0], "pick "+c.Model+" engine-") || !strings.HasPrefix(calls[1], "index "+c.Model+" engine-") {
		t.Fatalf("calls %q, want a pick, an index and a release", calls)
	}
	w := strings.TrimPrefix(calls[0], "pick "+c.Model+" ")
	if calls[2] != "release "+w || calls[1] != "index "+c.Model+" "+w {
		t.Errorf("calls %q: not all on worker %s", calls, w)
	}
	if len(want) == 0 || !slices.Equal(fake.hashes, want) {
		t.Errorf("indexed %d hashes, want the prompt's %d", len(fake.hashes), len(want))
	}
	if l := p.loads(); len(l) != 0 {
		t.Errorf("in flight after the answer: %v", l)
	}

	// An answer still open counts in flight and is released once.
	r, _ := http.NewRequest(http.MethodPost, tr.urls()[0]+loadgen.ChatPath, strings.NewReader(string(req.Body)))
	resp, err := tr.RoundTrip(r)
	if err != nil {
		t.Fatal(err)
	}
	if l := p.loads(); len(l) != 1 || l[0].N != 1 {
		t.Errorf("in flight with an answer open: %v", l)
	}
	resp.Body.Close()
	resp.Body.Close()
	if got := len(fake.released); got != 2 {
		t.Errorf("%d releases after two requests, one closed twice; want 2", got)
	}

	if _, _, err := loadgen.Do(t.Context(), client, "http://127.0.0.1:1", req); err == nil {
		t.Error("the fleet's 418 came back as a success")
	}
	if tr.own.Load() != 1 || !slices.Equal(next.hosts, []string{"127.0.0.1:1"}) {
		t.Errorf("passed on %v, counted %d; want the one request to the fleet", next.hosts, tr.own.Load())
	}

	bad, _ := http.NewRequest(http.MethodPost, tr.urls()[0]+loadgen.ChatPath, strings.NewReader("{"))
	if _, err := tr.RoundTrip(bad); err == nil || !strings.Contains(err.Error(), "mirror peer") {
		t.Errorf("malformed request: %v, want an error naming the mirror peer", err)
	}
}

func TestCostTable(t *testing.T) {
	run := func(on bool, cpu time.Duration, switches float64) costRun {
		return costRun{sync: on, r: openRun{cpuPerRequest: cpu, switchesPerRequest: switches, syncMsgsPerRequest: 1, syncRecvPerRequest: 2}}
	}
	runs := []costRun{run(false, 1000*time.Microsecond, 10), run(true, 1100*time.Microsecond, 14), run(false, 900*time.Microsecond, 10), run(true, 1080*time.Microsecond, 12)}
	for _, share := range []bool{false, true} {
		tab, verdict := costTable(runs, share)
		if !strings.Contains(verdict, "+14.7%") || !strings.Contains(verdict, "MISSED") || !strings.Contains(verdict, "adds 3.0 context switches per request, 47 µs of CPU for each") {
			t.Errorf("share %v: verdict %q", share, verdict)
		}
		if len(tab.rows) != 2 || tab.rows[0][2] != "950 (900–1000)" || tab.rows[1][3] != "13.0 (12.0–14.0)" {
			t.Errorf("share %v: rows %q", share, tab.rows)
		}
		hasTTFT := slices.Contains(tab.header, "TTFT p50 ms")
		if hasTTFT == share || len(tab.rows[0]) != len(tab.header) {
			t.Errorf("share %v: header %q, rows of %d cells", share, tab.header, len(tab.rows[0]))
		}
	}
	if _, verdict := costTable(runs[:1], false); verdict != "not measured" {
		t.Errorf("sync off alone: %q", verdict)
	}
}

func TestWakeCost(t *testing.T) {
	d, err := wakeCost(t.Context(), 20)
	if err != nil || d <= 0 {
		t.Errorf("wakeCost = %v, %v; want a positive CPU time", d, err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := wakeCost(ctx, 20); err == nil {
		t.Error("wakeCost after its context ended: no error")
	}
}

// TestSyncCostRun runs the sync cost experiment at its smallest, with a
// real nats-server and gateway processes: nothing fails, and with sync on
// the lone gateway receives the mirror peers' batches.
func TestSyncCostRun(t *testing.T) {
	out := t.TempDir()
	c := smallest(out)
	c.Timeout = 3 * time.Minute
	c.Only = []string{ExpSyncCost}
	// A recorded window of 2s: room for a 1s profile.
	c.OpenRepeats, c.OpenDuration, c.OpenWarmup = 1, 2500*time.Millisecond, 500*time.Millisecond
	c.ShareProfile = true
	var report, log strings.Builder
	if err := Run(t.Context(), c, &report, &log); err != nil {
		t.Fatalf("run: %v\n%s", err, log.String())
	}
	md := report.String()
	var tables [][][]string // the section's tables, their rows' cells
	inTable := false
	for _, line := range strings.Split(md[strings.Index(md, "## Fleet sync cost"):], "\n") {
		if !strings.HasPrefix(line, "| ") {
			inTable = false
			continue
		}
		if !inTable {
			tables = append(tables, nil)
			inTable = true
		}
		tables[len(tables)-1] = append(tables[len(tables)-1], strings.Split(strings.Trim(line, "| "), " | "))
	}
	if len(tables) != 3 {
		t.Fatalf("%d tables, want the whole fleet's, one replica's share and its profile:\n%s", len(tables), md)
	}
	prof := tables[2]
	if len(prof) != len(profileBuckets)+3 {
		t.Fatalf("profile table: %d rows, want a bucket each and the total:\n%q", len(prof)-2, prof)
	}
	// The profiles hold the gateway's samples, with sync off and on.
	if total := prof[len(prof)-1]; total[0] != "all of the profile" || total[1] == "0.0" || total[3] == "0.0" {
		t.Errorf("profile table's total: %q", total)
	}
	for _, name := range []string{"synccost-share-1-sync-off.pprof", "synccost-share-2-sync-on.pprof"} {
		data, err := os.ReadFile(filepath.Join(out, name))
		if err != nil {
			t.Fatalf("the run's profile: %v", err)
		}
		if _, err := classify(data); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	for i, tab := range tables[:2] {
		header := tab[0]
		col := func(name string) int {
			j := slices.Index(header, name)
			if j < 0 {
				t.Fatalf("table %d has no column %q: %q", i, name, header)
			}
			return j
		}
		if len(tab) != 4 || tab[2][0] != "off" || tab[3][0] != "on" {
			t.Fatalf("table %d: rows %q, want off and on", i, tab)
		}
		for _, row := range tab[2:] {
			if row[col("failed")] != "0" {
				t.Errorf("table %d, sync %s: failed requests: %q", i, row[0], row)
			}
		}
		if recv := tab[3][col("NATS messages received/req")]; strings.HasPrefix(recv, "0.00") {
			t.Errorf("table %d, sync on: no batch received from a peer: %q", i, tab[3])
		}
	}
	for _, want := range []string{"one replica's share", "What a wakeup costs here"} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
}
