package console

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tlgate/tlgate/internal/adapter/traffic"
	"github.com/tlgate/tlgate/internal/edge/console"
)

// TestConsoleShowsFleet: with fleet sync, the console shows the fleet,
// not the replica it asks: the Traffic page says how many replicas its
// figures sum and shows their sum, and the Fleet page shows each worker's
// requests from the other replicas (peer_in_flight) beside its own. With
// one replica the Traffic page says so.
func TestConsoleShowsFleet(t *testing.T) {
	path := chromium(t)
	// Three replicas' rings: this one's 2 requests of smol, the other
	// two's 3 and 4, merged as GET /admin/v1/traffic merges them.
	clock := time.Now()
	now := func() time.Time { return clock }
	rec := func(n int) *traffic.Recorder {
		r := traffic.New(traffic.Config{Now: now})
		for range n {
			r.Request("smol", "", 20*time.Millisecond, 5*time.Millisecond)
		}
		return r
	}
	own := rec(2)
	fleet, err := json.Marshal(own.SnapshotWith([]traffic.Raw{rec(3).Raw(), rec(4).Raw()}))
	if err != nil {
		t.Fatal(err)
	}
	alone, err := json.Marshal(own.Snapshot())
	if err != nil {
		t.Fatal(err)
	}
	var synced atomic.Bool
	synced.Store(true)
	beat := time.Now().UTC().Format(time.RFC3339Nano)
	mux := http.NewServeMux()
	console.Register(mux)
	mux.HandleFunc("GET /admin/v1/workers", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"epoch":1,"workers":[
			{"id":"w1","model":"smol","role":"unified","source":"heartbeat","state":"routable","routable":true,"in_flight":1,"peer_in_flight":3,"last_heartbeat":%[1]q}
		]}`, beat)
	})
	mux.HandleFunc("GET /admin/v1/traffic", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if synced.Load() {
			_, _ = w.Write(fleet)
		} else {
			_, _ = w.Write(alone)
		}
	})
	u := openFake(t, path, mux)

	u.waitJS("fleet row", `document.querySelector('tr[data-worker="w1"] td[data-peer-in-flight]') !== null`)
	if got := eval[string](u, `document.querySelector('tr[data-worker="w1"] td[data-peer-in-flight]').textContent`); got != "3" {
		t.Errorf("w1's requests from the other replicas shown as %q, want 3", got)
	}

	u.open("traffic")
	u.waitJS("traffic row", `document.querySelector('#traffic-models tr[data-model="smol"]') !== null`)
	summary := eval[string](u, `document.getElementById("traffic-summary").textContent`)
	if !strings.Contains(summary, "the fleet: 3 replicas") {
		t.Errorf("traffic summary %q, want it to say the fleet of 3 replicas", summary)
	}
	if got := eval[string](u, `document.querySelector('#traffic-models tr[data-model="smol"]').children[1].textContent`); got != "9" {
		t.Errorf("smol's requests shown as %q, want the fleet's 9", got)
	}

	synced.Store(false)
	u.waitJS("one replica's traffic", `document.getElementById("traffic-summary").dataset.replicas === "1"`)
	if summary := eval[string](u, `document.getElementById("traffic-summary").textContent`); !strings.Contains(summary, "this replica") {
		t.Errorf("traffic summary %q with one replica, want it to say this replica", summary)
	}
}
