package kvsub_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/tlgate/tlgate/internal/adapter/kvsub"
	"github.com/tlgate/tlgate/internal/routing/kvindex"
	"github.com/tlgate/tlgate/internal/testkit/kvpub"
)

const bs = 4

func toks(from, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(from + i)
	}
	return out
}

// view is a Sink that applies updates to an exact index as the router
// does, and an Observer that counts what it hears.
type view struct {
	mu       sync.Mutex
	x        *kvindex.Index
	clears   int // updates with Clear
	restarts int // updates with Restarted
	updates  int
	problems map[string]int
	gaps     []bool
	replays  int
}

func newView() *view {
	return &view{x: kvindex.New(kvindex.Config{}), problems: map[string]int{}}
}

func (v *view) Send(u *kvsub.Update, done func()) {
	defer done()
	v.mu.Lock()
	defer v.mu.Unlock()
	v.updates++
	v.x.Watch(u.Worker)
	if u.Clear {
		v.clears++
	}
	if u.Restarted {
		v.restarts++
	}
	switch {
	case u.Restarted:
		v.x.ClearRestarted(u.Worker)
	case u.Clear:
		v.x.Clear(u.Worker)
	}
	for i := range u.Batches {
		if _, err := v.x.Apply(u.Worker, &u.Batches[i], time.Now()); err != nil {
			panic(err)
		}
	}
	v.x.SetState(u.Worker, u.State)
}

func (v *view) Received(string, int, bool) {}
func (v *view) Gap(_ string, _ uint64, recovered bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.gaps = append(v.gaps, recovered)
}
func (v *view) Replayed(string, int, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.replays++
}
func (v *view) Problem(_, p string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.problems[p]++
}
func (v *view) Connected(string, bool) {}

// blocks is how many blocks of tokens [0, n) the view holds, and its state.
func (v *view) blocks(n int) (int, kvindex.State) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.x.Holds("w", kvindex.Keys(nil, "", "", toks(0, n), bs)), v.x.State("w", time.Now())
}

// wait waits until the view holds want blocks of the first n tokens in
// state st.
func (v *view) wait(t *testing.T, n, want int, st kvindex.State) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, gst := v.blocks(n)
		if got == want && gst == st {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("view holds %d blocks in state %s, want %d in %s", got, gst, want, st)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (v *view) problem(p string) int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.problems[p]
}

// block is the Stored batch of block i of the token run (its hash i+1,
// its parent block i-1's).
func block(i int) kvpub.Batch {
	ev := kvpub.Stored{Hashes: []uint64{uint64(i + 1)}, Tokens: toks(i*bs, bs), BlockSize: bs}
	if i > 0 {
		ev.Parent = kvpub.Ptr(uint64(i))
	}
	return kvpub.Batch{TS: float64(i), Rank: kvpub.Ptr(0), Events: []any{ev}}
}

// subscribe runs a subscriber of p until the test ends.
func subscribe(t testing.TB, p *kvpub.Publisher, v *view, mod func(*kvsub.Config)) {
	t.Helper()
	cfg := kvsub.Config{Worker: "w", Endpoint: p.Endpoint(), Replay: p.ReplayEndpoint(), Sink: v, Observer: v,
		Logger: zerolog.Nop(), MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond}
	if mod != nil {
		mod(&cfg)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- kvsub.Run(ctx, cfg) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Run: %v", err)
		}
	})
}

func TestSubscriberFollowsBothEncodings(t *testing.T) {
	for _, enc := range []kvpub.Encoding{kvpub.Array, kvpub.Map} {
		t.Run(enc.String(), func(t *testing.T) {
			p := kvpub.NewPublisher(t, "kv@w", true)
			v := newView()
			subscribe(t, p, v, func(c *kvsub.Config) { c.Topic = "kv@w" })
			p.WaitSubscribers(1)
			o := kvpub.Options{Encoding: enc}
			for i := range 3 {
				p.Publish(block(i), o)
			}
			v.wait(t, 3*bs, 3, kvindex.Exact)
			p.Publish(kvpub.Batch{Rank: kvpub.Ptr(0), Events: []any{kvpub.Removed{Hashes: []uint64{2}}}}, o)
			v.wait(t, 3*bs, 1, kvindex.Exact)
			p.Publish(kvpub.Batch{Rank: kvpub.Ptr(0), Events: []any{kvpub.Cleared{}}}, o)
			v.wait(t, 3*bs, 0, kvindex.Exact)
		})
	}
}

func TestSubscriberCatchesUpOnFirstConnection(t *testing.T) {
	p := kvpub.NewPublisher(t, "", true)
	for i := range 3 {
		p.Publish(block(i), kvpub.Options{}) // nobody listens yet
	}
	v := newView()
	subscribe(t, p, v, nil)
	v.wait(t, 3*bs, 3, kvindex.Exact)
	p.WaitSubscribers(1)
	p.Publish(block(3), kvpub.Options{})
	v.wait(t, 4*bs, 4, kvindex.Exact)
}

func TestSubscriberGaps(t *testing.T) {
	tests := []struct {
		name      string
		replay    bool
		wrap      bool // the replay buffer lost the batches
		recovered bool
	}{
		{"replayed", true, false, true},
		{"no replay socket", false, false, false},
		{"replay buffer wrapped", true, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := kvpub.NewPublisher(t, "", tt.replay)
			v := newView()
			subscribe(t, p, v, nil)
			p.WaitSubscribers(1)
			p.Publish(block(0), kvpub.Options{})
			v.wait(t, 4*bs, 1, kvindex.Exact)
			p.Lose(block(1), kvpub.Options{})
			p.Lose(kvpub.Batch{Rank: kvpub.Ptr(0), Events: []any{kvpub.Removed{Hashes: []uint64{1}}}}, kvpub.Options{})
			p.Lose(block(0), kvpub.Options{})
			if tt.wrap {
				p.ForgetReplay(true)
			}
			p.Publish(block(2), kvpub.Options{})
			if tt.recovered {
				// Replayed: block 0 removed and stored again, 1 and 2.
				v.wait(t, 3*bs, 3, kvindex.Exact)
			} else {
				// Cleared, block 2's parent unknown: stale until the next.
				v.wait(t, 3*bs, 0, kvindex.Stale)
				p.Publish(kvpub.Batch{Rank: kvpub.Ptr(0)}, kvpub.Options{})
				v.wait(t, 3*bs, 0, kvindex.Exact)
				if v.problem(kvsub.ProblemUnrecovered) == 0 {
					t.Error("no unrecovered gap counted")
				}
			}
			v.mu.Lock()
			defer v.mu.Unlock()
			if len(v.gaps) != 1 || v.gaps[0] != tt.recovered {
				t.Errorf("gaps %v, want one recovered=%v", v.gaps, tt.recovered)
			}
		})
	}
}

func TestSubscriberRestartsAndBadBatches(t *testing.T) {
	tests := []struct {
		name    string
		act     func(p *kvpub.Publisher)
		problem string
		st      kvindex.State
	}{
		{"restart", func(p *kvpub.Publisher) { p.Restart(); p.Publish(kvpub.Batch{Rank: kvpub.Ptr(0)}, kvpub.Options{}) }, kvsub.ProblemRestart, kvindex.Exact},
		{"backwards", func(p *kvpub.Publisher) { p.SetSeq(1); p.Publish(kvpub.Batch{Rank: kvpub.Ptr(0)}, kvpub.Options{}) }, kvsub.ProblemBackwards, kvindex.Stale},
		{"garbage payload", func(p *kvpub.Publisher) { p.PublishPayload([]byte("not msgpack")) }, kvsub.ProblemMalformed, kvindex.Stale},
		{"two frames", func(p *kvpub.Publisher) { p.Send([]byte("x"), []byte("y")) }, kvsub.ProblemMalformed, kvindex.Stale},
		{"a million hashes", func(p *kvpub.Publisher) {
			hs := make([]uint64, 1<<20)
			p.Publish(kvpub.Batch{Rank: kvpub.Ptr(0), Events: []any{kvpub.Removed{Hashes: hs}}}, kvpub.Options{})
		}, kvsub.ProblemOversized, kvindex.Stale},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := kvpub.NewPublisher(t, "", false)
			v := newView()
			subscribe(t, p, v, nil)
			p.WaitSubscribers(1)
			for i := range 3 {
				p.Publish(block(i), kvpub.Options{})
			}
			v.wait(t, 3*bs, 3, kvindex.Exact)
			tt.act(p)
			v.wait(t, 3*bs, 0, tt.st)
			if v.problem(tt.problem) == 0 {
				t.Errorf("no %s counted: %v", tt.problem, v.problems)
			}
			// Events flow again: exact.
			p.Publish(block(0), kvpub.Options{})
			v.wait(t, 3*bs, 1, kvindex.Exact)
		})
	}
}

func TestSubscriberBoundsWhatEnginesSend(t *testing.T) {
	p := kvpub.NewPublisher(t, "", true)
	v := newView()
	subscribe(t, p, v, func(c *kvsub.Config) { c.Bounds = kvsub.Bounds{MaxMessage: 1 << 16, MaxFrames: 4} })
	p.WaitSubscribers(1)
	p.Publish(block(0), kvpub.Options{})
	v.wait(t, bs, 1, kvindex.Exact)
	// A frame over the bound closes the connection before it is read; the
	// subscriber reconnects and catches up from the replay socket.
	p.Send(nil, make([]byte, 8), make([]byte, 1<<17))
	p.WaitSubscribers(1)
	deadline := time.Now().Add(10 * time.Second)
	for v.problem(kvsub.ProblemOversized) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no oversized message counted: %v", v.problems)
		}
		time.Sleep(5 * time.Millisecond)
	}
	p.WaitSubscribers(1)
	p.Publish(block(1), kvpub.Options{})
	v.wait(t, 2*bs, 2, kvindex.Exact)
	// A flood over the byte budget is dropped, and counted.
	flood := newView()
	q := kvpub.NewPublisher(t, "", false)
	subscribe(t, q, flood, func(c *kvsub.Config) { c.BytesPerSecond = 1 << 10 })
	q.WaitSubscribers(1)
	big := kvpub.Batch{Rank: kvpub.Ptr(0), Events: []any{kvpub.Stored{Hashes: []uint64{1}, Tokens: toks(0, 1<<10), BlockSize: 1 << 10}}}
	for range 4 {
		q.Publish(big, kvpub.Options{})
	}
	deadline = time.Now().Add(10 * time.Second)
	for flood.problem(kvsub.ProblemFlood) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no flood counted: %v", flood.problems)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestSubscriberReconnects(t *testing.T) {
	for _, restarted := range []bool{false, true} {
		t.Run(fmt.Sprintf("restarted=%v", restarted), func(t *testing.T) {
			p := kvpub.NewPublisher(t, "", true)
			v := newView()
			subscribe(t, p, v, nil)
			p.WaitSubscribers(1)
			for i := range 3 {
				p.Publish(block(i), kvpub.Options{})
			}
			v.wait(t, 4*bs, 3, kvindex.Exact)
			p.Kick()
			if restarted {
				// A new engine process behind the same sockets: its
				// numbers start again, and pass the last one seen.
				p.Restart()
				for range 4 {
					p.Lose(kvpub.Batch{Rank: kvpub.Ptr(0)}, kvpub.Options{})
				}
				p.Lose(block(0), kvpub.Options{})
				v.wait(t, 4*bs, 1, kvindex.Exact)
				return
			}
			p.Lose(block(3), kvpub.Options{})
			v.wait(t, 4*bs, 4, kvindex.Exact)
			v.mu.Lock()
			defer v.mu.Unlock()
			if v.clears != 0 {
				t.Errorf("a reconnection that lost nothing cleared the view %d times", v.clears)
			}
		})
	}
}

func TestTracker(t *testing.T) {
	var tr kvsub.Tracker
	for i, c := range []struct {
		seq  uint64
		want kvsub.Verdict
	}{{5, kvsub.First}, {6, kvsub.InOrder}, {9, kvsub.Gap}, {10, kvsub.InOrder}, {10, kvsub.Backwards}, {3, kvsub.Backwards}, {0, kvsub.Restart}, {0, kvsub.Restart}, {1, kvsub.InOrder}} {
		if got := tr.Next(c.seq); got != c.want {
			t.Errorf("step %d: seq %d: %s, want %s", i, c.seq, got, c.want)
		}
	}
}

// heldSink applies updates at once but holds the first one's slot until
// release: the decoder waits on it and the reader's queue overflows.
type heldSink struct {
	*view
	mu      sync.Mutex
	held    func()
	holding bool
}

func (h *heldSink) Send(u *kvsub.Update, done func()) {
	h.view.Send(u, func() {})
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.holding && h.held == nil {
		h.held = done
		return
	}
	done()
}

func (h *heldSink) release() {
	h.mu.Lock()
	h.holding = false
	done := h.held
	h.held = nil
	h.mu.Unlock()
	if done != nil {
		done()
	}
}

// TestSubscriberRecoversDroppedMessages: batches the reader had no room
// for are given back by the replay even when no later batch comes to show
// the gap (an engine that goes quiet after a burst).
func TestSubscriberRecoversDroppedMessages(t *testing.T) {
	p := kvpub.NewPublisher(t, "", true)
	v := newView()
	h := &heldSink{view: v, holding: true}
	subscribe(t, p, v, func(c *kvsub.Config) { c.Sink, c.QueueLen, c.MaxPending, c.MaxCoalesce = h, 1, 1, 1 })
	p.WaitSubscribers(1)
	p.Publish(block(0), kvpub.Options{})
	v.wait(t, bs, 1, kvindex.Exact)
	for i := 1; i < 6; i++ {
		p.Publish(block(i), kvpub.Options{})
	}
	deadline := time.Now().Add(10 * time.Second)
	for v.problem(kvsub.ProblemQueueFull) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no message dropped: the test did not fill the queue")
		}
		time.Sleep(time.Millisecond)
	}
	h.release()
	v.wait(t, 6*bs, 6, kvindex.Exact)
}

// TestSubscriberKnowsEmptyCaches: the view is marked restarted, and then
// knows every block the engine holds, only where the engine's cache is
// known empty: at its first batch, live or replayed, and at a restart.
// An engine seen naming two blocks with one hash (rank 1) has its blocks
// after a parent resolved only on a rank the view knows whole (rank 0):
// blocks 0 and 1 are held both, or block 1 is left out.
func TestSubscriberKnowsEmptyCaches(t *testing.T) {
	unchain := kvpub.Batch{Rank: kvpub.Ptr(1), Events: []any{
		kvpub.Stored{Hashes: []uint64{1000}, Tokens: toks(500, bs), BlockSize: bs},
		kvpub.Stored{Hashes: []uint64{1000}, Tokens: toks(600, bs), BlockSize: bs},
	}}
	empty := kvpub.Batch{Rank: kvpub.Ptr(0)}
	tests := []struct {
		name     string
		replay   bool
		before   int                    // batches published before the subscriber connects
		act      func(*kvpub.Publisher) // after the view saw the collision
		blocks   int
		restarts int
	}{
		{"live from the engine's first batch", false, 0, nil, 2, 1},
		{"replayed from the engine's first batch", true, 2, nil, 2, 1},
		{"joined mid-stream", false, 2, nil, 1, 0},
		{"engine restarted", false, 2, func(p *kvpub.Publisher) { p.Restart() }, 2, 1},
		{"batches lost", false, 0, func(p *kvpub.Publisher) { p.Lose(empty, kvpub.Options{}) }, 1, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := kvpub.NewPublisher(t, "", tt.replay)
			for range tt.before {
				p.Publish(empty, kvpub.Options{}) // nobody listens
			}
			v := newView()
			subscribe(t, p, v, nil)
			p.WaitSubscribers(1)
			p.Publish(unchain, kvpub.Options{})
			deadline := time.Now().Add(10 * time.Second)
			for {
				v.mu.Lock()
				st, _ := v.x.Stats("w", time.Now())
				v.mu.Unlock()
				if st.Applied.Stored == 2 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the collision was not applied: %+v", st)
				}
				time.Sleep(5 * time.Millisecond)
			}
			if tt.act != nil {
				tt.act(p)
			}
			p.Publish(kvpub.Batch{Rank: kvpub.Ptr(0), Events: append(block(0).Events, block(1).Events...)}, kvpub.Options{})
			p.Publish(empty, kvpub.Options{}) // exact again after a loss
			v.wait(t, 2*bs, tt.blocks, kvindex.Exact)
			v.mu.Lock()
			defer v.mu.Unlock()
			if v.restarts != tt.restarts {
				t.Errorf("%d updates marked restarted, want %d", v.restarts, tt.restarts)
			}
		})
	}
}
