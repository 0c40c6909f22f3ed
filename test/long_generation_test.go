package test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/runtime/gateway"
)

// TestLongGenerationDoesNotEject: a non-streamed request whose engines
// generate past first_byte_timeout (a fake that answers "long" prompts
// only when the gateway gives up) tries two workers, not every one, and
// is answered 504 upstream_timeout; no worker is ejected or suspect, with
// ejection at its strictest, and the other requests go on everywhere. The
// engine work is charged to the key: the prompt and max_tokens of each
// abandoned attempt, marked estimated.
func TestLongGenerationDoesNotEject(t *testing.T) {
	logs := &lockedBuffer{}
	c := newClusterGateway(t, "", []clusterOpt{keys(), drillGateway(func(g *config.Gateway) {
		g.Ejection.ConsecutiveFailures, g.Ejection.MaxPercent = 1, 100
		g.FirstByteTimeout = config.D(300 * time.Millisecond)
	})}, nil, func(o *gateway.Options) { o.Logger = zerolog.New(logs) })
	var calls atomic.Int64
	engine := func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if strings.Contains(string(b), "long") {
			calls.Add(1)
			<-r.Context().Done() // generating until the gateway gives up
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"c1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"ok","finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
	}
	ids := []string{"g1", "g2", "g3"}
	for _, id := range ids {
		c.addFake(id, "m", engine)
	}
	for i := range 4 {
		before := calls.Load()
		id := fmt.Sprintf("long-%d", i)
		o := c.drillSend(t.Context(), "/v1/completions", drillKey, id, map[string]any{"model": "m", "prompt": "a long story", "max_tokens": 40})
		if o.status != http.StatusGatewayTimeout || o.errCode != "upstream_timeout" {
			t.Fatalf("long request %d: %v, want 504 upstream_timeout", i, o)
		}
		if n := calls.Load() - before; n != 2 {
			t.Fatalf("long request %d reached %d engines, want 2", i, n)
		}
		var line map[string]any
		eventually(t, 10*time.Second, func() bool { line = logs.line(id); return line != nil }, "access log of %s", id)
		// "a long story" is 12 bytes: 3 prompt tokens an attempt.
		if line["prompt_tokens"] != 6.0 || line["completion_tokens"] != 80.0 || line["usage_estimated"] != true || line["abandoned_attempts"] != 2.0 {
			t.Fatalf("long request %d logged %v, want 6 prompt and 80 completion tokens, estimated, 2 abandoned attempts", i, line)
		}
	}
	for _, id := range ids {
		if w, _ := c.drillWorker(id); !w.Routable || !w.EjectedUntil.IsZero() || w.ConsecutiveFailures != 0 || w.Ejections != 0 {
			t.Errorf("%s after the long requests: routable %v ejected until %v, %d failures, %d ejections",
				id, w.Routable, w.EjectedUntil, w.ConsecutiveFailures, w.Ejections)
		}
	}
	for i := range 30 {
		o := c.drillSend(t.Context(), "/v1/completions", drillKey, fmt.Sprintf("short-%d", i), map[string]any{"model": "m", "prompt": "hi", "max_tokens": 1})
		if !o.finishedOK(false) {
			t.Fatalf("short request %d: %v", i, o)
		}
	}
}
