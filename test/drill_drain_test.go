package test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/edge/adminhttp"
)

// A route split over two served models, two workers each: the drill drains
// and resumes one served model at a time while the route keeps serving.
const drillCanaryRoutes = `
[[gateway.routes]]
model = "m"
backends = [{ model = "m1", weight = 1 }, { model = "m2", weight = 1 }]
`

// drillAdmin posts a drain or resume with the admin key and decodes the
// 202 body.
func (c *cluster) drillAdmin(t *testing.T, model, action string) adminhttp.DrainBody {
	t.Helper()
	r := c.post("/admin/v1/models/"+model+":"+action, "key-admin", "")
	if r.status != http.StatusAccepted {
		t.Fatalf("%s %s: %d %s", action, model, r.status, r.body)
	}
	var b adminhttp.DrainBody
	if err := json.Unmarshal(r.body, &b); err != nil {
		t.Fatal(err)
	}
	return b
}

// drillStream is a stream whose first event arrived.
type drillStream struct {
	resp *http.Response
	br   *bufio.Reader
	id   string
}

// rest reads the stream to its end and reports whether it ended with
// data: [DONE].
func (s drillStream) rest() (bool, error) {
	defer s.resp.Body.Close()
	b, err := io.ReadAll(s.br)
	if err != nil {
		return false, err
	}
	ev := sseEvents(b)
	return len(ev) > 0 && ev[len(ev)-1] == "[DONE]", nil
}

// TestDrillRollingDrainResume drains and resumes the route's served models
// one after the other with streams in flight on them: the streams finish,
// no new request reaches a drained worker (the engines' request counters
// do not move) while the route keeps answering from the other model, the
// engines drain themselves on their acks, and a resume makes them stop
// draining and the workers routable and used again.
func TestDrillRollingDrainResume(t *testing.T) {
	const perToken = 10 * time.Millisecond
	c := newCluster(t, drillCanaryRoutes, []clusterOpt{keys()},
		enginesim.Config{ID: "a1", Model: "m1", DecodePerToken: perToken},
		enginesim.Config{ID: "a2", Model: "m1", DecodePerToken: perToken},
		enginesim.Config{ID: "b1", Model: "m2", DecodePerToken: perToken},
		enginesim.Config{ID: "b2", Model: "m2", DecodePerToken: perToken},
	)
	workersOf := map[string][]string{"m1": {"a1", "a2"}, "m2": {"b1", "b2"}}
	other := map[string]string{"m1": "m2", "m2": "m1"}
	requests := func(ids []string) (n uint64) {
		for _, id := range ids {
			n += c.engines[id].Stats().Requests
		}
		return n
	}

	for _, model := range []string{"m1", "m2"} {
		drained := workersOf[model]
		// Long streams in flight on the model's workers: the canary draws
		// on the gateway's own request id, so streams are opened until four
		// landed on this model; one that the draw sent to the other model
		// is read to its end at once.
		var streams []drillStream
		for i := 0; len(streams) < 4; i++ {
			if i == 200 {
				t.Fatalf("200 streams opened, %d of them on %s", len(streams), model)
			}
			id := fmt.Sprintf("long-%s-%d", model, i)
			o, br, err := c.drillOpenStream(context.Background(), drillKey, id, drillBody("m", 60, true))
			if err != nil {
				t.Fatal(err)
			}
			s := drillStream{o, br, id}
			if w := o.Header.Get("X-TL-Route"); !slices.Contains(drained, w) {
				if !slices.Contains(workersOf[other[model]], w) {
					t.Fatalf("stream %s went to %s, a worker of neither model", id, w)
				}
				if done, err := s.rest(); err != nil || !done {
					t.Fatalf("stream %s on %s: done %v, %v", id, w, done, err)
				}
				continue
			}
			streams = append(streams, s)
		}
		before := requests(drained)

		body := c.drillAdmin(t, model, "drain")
		if !slices.Equal(body.Drained, []string{model}) || body.Workers != 2 {
			t.Fatalf("drain %s: %+v", model, body)
		}
		// While drained: every request is answered by the other model.
		for i := range 12 {
			o := c.drillSend(context.Background(), "/v1/completions", drillKey, fmt.Sprintf("during-%s-%d", model, i), drillBody("m", 2, i%2 == 0))
			if !o.finishedOK(i%2 == 0) || !slices.Contains(workersOf[other[model]], o.route) {
				t.Fatalf("while %s is drained: %v", model, o)
			}
		}
		if got := requests(drained); got != before {
			t.Fatalf("%d new requests reached the drained workers %v", got-before, drained)
		}
		// The streams in flight on the drained workers finish.
		for _, s := range streams {
			if done, err := s.rest(); !done || err != nil {
				t.Fatalf("in-flight stream %s on a drained worker: done %v err %v", s.id, done, err)
			}
		}
		for _, id := range drained {
			if w, _ := c.drillWorker(id); w.Routable || !w.Drained {
				t.Fatalf("drained worker %s: routable %v drained %v", id, w.Routable, w.Drained)
			}
		}

		// The engines obeyed their drain acks: they report draining.
		eventually(t, 5*time.Second, func() bool {
			for _, id := range drained {
				if w, _ := c.drillWorker(id); !w.Draining || !c.engines[id].Draining() {
					return false
				}
			}
			return true
		}, "the drained engines draining themselves")

		body = c.drillAdmin(t, model, "resume")
		if !slices.Equal(body.Resumed, []string{model}) || body.Workers != 2 {
			t.Fatalf("resume %s: %+v", model, body)
		}
		// The gateway routes to them again at once (their drain was its
		// own doing), without waiting for them to report draining: false.
		for _, id := range drained {
			if w, _ := c.drillWorker(id); w.Drained || !w.Routable {
				t.Fatalf("worker %s not routable right after the resume: drained %v routable %v", id, w.Drained, w.Routable)
			}
		}
		// The engines hear of it on their next ack and stop refusing.
		eventually(t, 5*time.Second, func() bool {
			for _, id := range drained {
				if c.engines[id].Draining() {
					return false
				}
			}
			return true
		}, "the resumed engines no longer draining")
		// Routing is restored: requests the canary draws for this model
		// reach its workers again.
		sent := 0
		for i := 0; sent < 4; i++ {
			if i == 200 {
				t.Fatalf("after resuming %s: 200 requests sent, %d of them reached it", model, sent)
			}
			id := fmt.Sprintf("after-%s-%d", model, i)
			stream := i%2 == 0
			o := c.drillSend(context.Background(), "/v1/completions", drillKey, id, drillBody("m", 2, stream))
			if !o.finishedOK(stream) || !slices.Contains(drained, o.route) && !slices.Contains(workersOf[other[model]], o.route) {
				t.Fatalf("after resuming %s: %v", model, o)
			}
			if slices.Contains(drained, o.route) {
				sent++
			}
		}
		if got := requests(drained); got == before {
			t.Fatalf("the resumed workers %v got no request", drained)
		}
		t.Logf("%s: drained with %d streams in flight, all finished; 12 requests meanwhile on %s; served again after the resume",
			model, len(streams), other[model])
	}
	c.drillWaitIdle()
}
