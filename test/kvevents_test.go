package test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tlgate/tlgate/actors/request"
	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/enginesim/kvevents"
	"github.com/tlgate/tlgate/internal/adapter/config"
	testcluster "github.com/tlgate/tlgate/internal/testkit/cluster"
)

// kvCluster is a gateway routing cache_aware over reference engines that
// publish their KV cache events, with the targets of its picks.
type kvCluster struct {
	*cluster
	mu    sync.Mutex
	picks []router.Target
}

// kvEngine is an engine publishing its KV events (replay when replay),
// encoded as enc.
func kvEngine(id string, replay bool, enc kvevents.Encoder) enginesim.Config {
	c := enginesim.Config{ID: id, Model: "m"}
	c.KVEvents.Endpoint, c.KVEvents.Encoder = "tcp://127.0.0.1:0", enc
	if replay {
		c.KVEvents.ReplayEndpoint = "tcp://127.0.0.1:0"
	}
	return c
}

func newKVCluster(t *testing.T, opts []clusterOpt, engines ...enginesim.Config) *kvCluster {
	t.Helper()
	kc := &kvCluster{}
	opts = append([]clusterOpt{keys(), func(cfg *config.Config) {
		cfg.Gateway.RoutePolicy = config.PolicyCacheAware
		cfg.Gateway.Tokenizer.Timeout = config.D(5 * time.Second) // a busy machine: no fallback unless a test asks
	}}, opts...)
	kc.cluster = newClusterDeps(t, "", opts, func(d *request.Deps) {
		logged := d.OnRouted
		d.OnRouted = func(ex *request.Exchange, tg router.Target, took time.Duration) {
			logged(ex, tg, took)
			kc.mu.Lock()
			kc.picks = append(kc.picks, tg)
			kc.mu.Unlock()
		}
	}, engines...)
	return kc
}

// last is the target of the last pick.
func (kc *kvCluster) last() router.Target {
	kc.mu.Lock()
	defer kc.mu.Unlock()
	if len(kc.picks) == 0 {
		kc.t.Fatal("no pick yet")
	}
	return kc.picks[len(kc.picks)-1]
}

// view is the router's view of worker id.
func (kc *kvCluster) view(id string) router.WorkerView {
	for _, w := range kc.workers() {
		if w.ID == id {
			return w
		}
	}
	kc.t.Fatalf("no worker %s", id)
	return router.WorkerView{}
}

// waitView waits until worker id's cache view is want and ok holds of
// its blocks.
func (kc *kvCluster) waitView(id, want string, ok func(gpu int) bool, what string) {
	kc.t.Helper()
	eventually(kc.t, 10*time.Second, func() bool {
		v := kc.view(id)
		return v.CacheView == want && ok(v.KVBlocks["gpu"])
	}, "%s: cache view %s with %s", id, want, what)
}

func anyBlocks(int) bool { return true }

// jsonText is v as JSON text.
func jsonText(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// direct sends a chat request straight to engine id, past the gateway.
func (kc *kvCluster) direct(id string, msgs []map[string]string, maxTokens int) {
	kc.t.Helper()
	kc.postTo(kc.engines[id].URL()+"/v1/chat/completions", map[string]any{"model": "m", "messages": msgs, "max_tokens": maxTokens})
}

// warm makes every engine publish a batch, so that its view is exact.
func (kc *kvCluster) warm(ids ...string) {
	kc.t.Helper()
	for _, id := range ids { // a batch before the subscription is lost to it, as on any PUB socket
		pub := kc.engines[id].KVEventsPublisher()
		eventually(kc.t, 10*time.Second, func() bool { return pub.Subscribed(pub.Topic()) }, "%s's subscriber", id)
	}
	for _, id := range ids {
		kc.direct(id, short("warm up "+id), 1)
	}
	for _, id := range ids {
		kc.waitView(id, "exact", anyBlocks, "a batch")
	}
}

// ask sends msgs through the gateway and returns the pick.
func (kc *kvCluster) ask(model, salt string, msgs []map[string]string) router.Target {
	kc.t.Helper()
	body := map[string]any{"model": model, "messages": msgs, "max_tokens": 1}
	if salt != "" {
		body["cache_salt"] = salt
	}
	if r := kc.post("/v1/chat/completions", "key-plain", body); r.status != http.StatusOK {
		kc.t.Fatalf("request: %d %s", r.status, r.body)
	}
	return kc.last()
}

// doc is a long system prompt, distinct per seed (about 80 blocks).
func doc(seed string) []map[string]string {
	return []map[string]string{{"role": "system", "content": strings.Repeat("Document "+seed+" says the gateway routes every request to the engine that holds its prefix. ", 40)}}
}

// short is a prompt of a few blocks, distinct per text.
func short(text string) []map[string]string {
	return []map[string]string{{"role": "user", "content": strings.Repeat(text+", a prompt of a few blocks. ", 6)}}
}

func withQuestion(msgs []map[string]string, q string) []map[string]string {
	return append(append([]map[string]string{}, msgs...), map[string]string{"role": "user", "content": q})
}

// TestKVEventsRouteToHolder: blocks an engine stored for a request the
// gateway never sent there (sent straight to the engine) draw the next
// request with that prefix to it, on its exact view.
func TestKVEventsRouteToHolder(t *testing.T) {
	kc := newKVCluster(t, nil, kvEngine("w1", true, kvevents.Encoder{}), kvEngine("w2", true, kvevents.Encoder{}), kvEngine("w3", true, kvevents.Encoder{}))
	kc.warm("w1", "w2", "w3")
	d := doc("A")
	kc.direct("w3", withQuestion(d, "first question"), 1)
	kc.waitView("w3", "exact", func(n int) bool { return n >= 60 }, "the document's blocks")
	hits := kc.engines["w3"].Stats().PrefixHits
	tg := kc.ask("m", "", withQuestion(d, "second question"))
	if tg.Worker.ID != "w3" || tg.CacheView != "exact" || tg.MatchedTokens < 60*16 {
		t.Fatalf("routed to %s (%s), matched %d of %d tokens; the document is on w3", tg.Worker.ID, tg.CacheView, tg.MatchedTokens, tg.PromptTokens)
	}
	if kc.engines["w3"].Stats().PrefixHits == hits {
		t.Fatal("w3 answered without a prefix cache hit")
	}
}

// TestKVEventsForgetEvicted: once the engine evicts a prompt's blocks,
// the gateway no longer counts them, though it sent the prompt there
// itself (the prefix index would still).
func TestKVEventsForgetEvicted(t *testing.T) {
	small := func(id string) enginesim.Config {
		c := kvEngine(id, true, kvevents.Encoder{})
		c.KVBlocks = 200
		return c
	}
	kc := newKVCluster(t, nil, small("w1"), small("w2"))
	kc.warm("w1", "w2")
	d := doc("B")
	first := kc.ask("m", "", withQuestion(d, "q1"))
	home := first.Worker.ID
	if again := kc.ask("m", "", withQuestion(d, "q2")); again.Worker.ID != home || again.MatchedTokens < 60*16 {
		t.Fatalf("the document's second request: %s matched %d (first on %s)", again.Worker.ID, again.MatchedTokens, home)
	}
	// Other documents fill home's cache, evicting the first one's blocks.
	for i := range 6 {
		kc.direct(home, withQuestion(doc(fmt.Sprintf("filler-%d", i)), "q"), 1)
	}
	eventually(t, 10*time.Second, func() bool {
		return kc.view(home).KVBlocks["gpu"] <= 200 && kc.engines[home].Stats().TotalBlocks > 0
	}, "home's view within its cache")
	tg := kc.ask("m", "", withQuestion(d, "q3"))
	if tg.MatchedTokens != 0 || tg.CacheView != "exact" {
		t.Fatalf("after eviction: %s (%s) matched %d tokens of an evicted prompt", tg.Worker.ID, tg.CacheView, tg.MatchedTokens)
	}
}

// TestKVEventsAllBlocksCleared: vLLM's POST /reset_prefix_cache empties
// the engine's cache, and its AllBlocksCleared event the gateway's view.
func TestKVEventsAllBlocksCleared(t *testing.T) {
	kc := newKVCluster(t, nil, kvEngine("w1", true, kvevents.Encoder{}), kvEngine("w2", true, kvevents.Encoder{}))
	kc.warm("w1", "w2")
	d := doc("C")
	home := kc.ask("m", "", withQuestion(d, "q1")).Worker.ID
	kc.waitView(home, "exact", func(n int) bool { return n >= 60 }, "the document's blocks")
	kc.postTo(kc.engines[home].URL()+"/reset_prefix_cache", map[string]any{})
	kc.waitView(home, "exact", func(n int) bool { return n == 0 }, "no block")
	if tg := kc.ask("m", "", withQuestion(d, "q2")); tg.MatchedTokens != 0 {
		t.Fatalf("after the reset: %s matched %d tokens", tg.Worker.ID, tg.MatchedTokens)
	}
}

// TestKVEventsGapReplays: batches the engine numbered but never sent (a
// PUB socket's high-water mark) are asked for again from its replay
// socket once the next batch shows the gap; the view stays exact.
func TestKVEventsGapReplays(t *testing.T) {
	kc := newKVCluster(t, nil, kvEngine("w1", true, kvevents.Encoder{}), kvEngine("w2", true, kvevents.Encoder{}))
	kc.warm("w1", "w2")
	pub := kc.engines["w2"].KVEventsPublisher()
	pub.SetFaults(kvevents.Faults{Drop: true})
	d := doc("D")
	kc.direct("w2", withQuestion(d, "q1"), 1)
	eventually(t, 10*time.Second, func() bool { return pub.Stats().Dropped > 0 && pub.Stats().Queued == 0 }, "batches dropped")
	if n := kc.view("w2").KVBlocks["gpu"]; n >= 60 {
		t.Fatalf("w2's view holds %d blocks before the replay", n)
	}
	pub.SetFaults(kvevents.Faults{})
	kc.direct("w2", short("the next batch shows the gap"), 1)
	kc.waitView("w2", "exact", func(n int) bool { return n >= 60 }, "the dropped blocks, replayed")
	if pub.Stats().Replays == 0 {
		t.Fatal("no replay was asked for")
	}
	if tg := kc.ask("m", "", withQuestion(d, "q2")); tg.Worker.ID != "w2" || tg.MatchedTokens < 60*16 {
		t.Fatalf("routed to %s, matched %d: the replayed blocks are on w2", tg.Worker.ID, tg.MatchedTokens)
	}
}

// TestKVEventsEngineRestartClearsView: a sequence back at 0 is a new
// engine process: the view starts again from its events.
func TestKVEventsEngineRestartClearsView(t *testing.T) {
	kc := newKVCluster(t, nil, kvEngine("w1", true, kvevents.Encoder{}), kvEngine("w2", true, kvevents.Encoder{}))
	kc.warm("w1", "w2")
	d := doc("E")
	kc.direct("w2", withQuestion(d, "q1"), 1)
	kc.waitView("w2", "exact", func(n int) bool { return n >= 60 }, "the document's blocks")
	pub := kc.engines["w2"].KVEventsPublisher()
	pub.RestartSequence()
	kc.direct("w2", short("the first batch of the new sequence"), 1)
	kc.waitView("w2", "exact", func(n int) bool { return n > 0 && n < 10 }, "only the new sequence's blocks")
	if tg := kc.ask("m", "", withQuestion(d, "q2")); tg.MatchedTokens != 0 {
		t.Fatalf("after the restart: %s matched %d tokens", tg.Worker.ID, tg.MatchedTokens)
	}
}

// TestKVEventsStaleFallsBackToApproximate: a worker whose events were
// lost (no replay socket) is stale and routed on the prefix index until
// its events flow again; one whose events are late (an answer's blocks
// unpublished past event_timeout) likewise.
func TestKVEventsStaleFallsBackToApproximate(t *testing.T) {
	kc := newKVCluster(t, []clusterOpt{func(cfg *config.Config) { cfg.Gateway.KVEvents.EventTimeout = config.D(300 * time.Millisecond) }},
		kvEngine("w1", false, kvevents.Encoder{}), kvEngine("w2", false, kvevents.Encoder{}))
	kc.warm("w1", "w2")
	d := doc("F")
	home := kc.ask("m", "", withQuestion(d, "q1")).Worker.ID
	kc.waitView(home, "exact", func(n int) bool { return n >= 60 }, "the document's blocks")
	pub := kc.engines[home].KVEventsPublisher()
	pub.SetFaults(kvevents.Faults{Drop: true})
	kc.direct(home, withQuestion(doc("lost"), "q"), 1)
	eventually(t, 10*time.Second, func() bool { return pub.Stats().Dropped > 0 && pub.Stats().Queued == 0 }, "a batch lost")
	pub.SetFaults(kvevents.Faults{})
	kc.direct(home, short("this batch shows the loss"), 1)
	kc.waitView(home, "stale", anyBlocks, "stale after an unrecoverable gap")
	// Stale: routed on the prefix index, which recorded the document on
	// home when the gateway sent it there.
	tg := kc.ask("m", "", withQuestion(d, "q2"))
	if tg.Worker.ID != home || tg.MatchedTokens == 0 {
		t.Fatalf("while stale: %s (%s) matched %d; the prefix index holds the document on %s", tg.Worker.ID, tg.CacheView, tg.MatchedTokens, home)
	}
	if tg.CacheView != "approximate" {
		t.Fatalf("a stale worker was scored on %s", tg.CacheView)
	}
	kc.direct(home, short("events flow again"), 1)
	kc.waitView(home, "exact", anyBlocks, "exact once events flow")

	// Late events: an answer whose blocks are not published within
	// event_timeout makes the view stale, without losing it.
	for _, e := range kc.engines {
		e.KVEventsPublisher().SetFaults(kvevents.Faults{Drop: true})
	}
	tg = kc.ask("m", "", withQuestion(doc("G"), "q"))
	if tg.CacheView != "exact" {
		t.Fatalf("picked on %s", tg.CacheView)
	}
	kc.waitView(tg.Worker.ID, "stale", anyBlocks, "stale when events are late")
	for _, e := range kc.engines {
		e.KVEventsPublisher().SetFaults(kvevents.Faults{})
	}
}

// TestKVEventsBothEncodings: engines publishing events as tagged arrays
// or maps, with block hashes as integers or digests, are all followed.
func TestKVEventsBothEncodings(t *testing.T) {
	encs := map[string]kvevents.Encoder{
		"map-int":     {Encoding: kvevents.EncodingMap, Hashes: kvevents.HashInt},
		"map-bytes":   {Encoding: kvevents.EncodingMap, Hashes: kvevents.HashBytes},
		"array-int":   {Encoding: kvevents.EncodingArray, Hashes: kvevents.HashInt},
		"array-bytes": {Encoding: kvevents.EncodingArray, Hashes: kvevents.HashBytes},
	}
	var cfgs []enginesim.Config
	var ids []string
	for id, enc := range encs {
		cfgs = append(cfgs, kvEngine(id, true, enc))
		ids = append(ids, id)
	}
	kc := newKVCluster(t, nil, cfgs...)
	kc.warm(ids...)
	for _, id := range ids {
		d := doc("enc-" + id)
		kc.direct(id, withQuestion(d, "q1"), 1)
		kc.waitView(id, "exact", func(n int) bool { return n >= 60 }, "the document's blocks")
		if tg := kc.ask("m", "", withQuestion(d, "q2")); tg.Worker.ID != id || tg.MatchedTokens < 60*16 {
			t.Errorf("%s: routed to %s, matched %d", id, tg.Worker.ID, tg.MatchedTokens)
		}
	}
}

// TestKVEventsLoRAAndSaltKeptApart: blocks computed for an adapter, or
// with a cache salt, match only requests of that adapter and salt.
func TestKVEventsLoRAAndSaltKeptApart(t *testing.T) {
	lora := func(id string) enginesim.Config {
		c := kvEngine(id, true, kvevents.Encoder{})
		c.Adapters = []string{"sql"}
		return c
	}
	kc := newKVCluster(t, nil, lora("w1"), lora("w2"))
	kc.warm("w1", "w2")
	d := doc("H")
	for i, tc := range []struct {
		model, salt string
		hit         bool
	}{
		{"m", "tenant-a", false}, {"m", "tenant-a", true}, // the salt's own blocks
		{"m", "tenant-b", false}, {"m", "", false}, // another salt, or none: none of a's
		{"sql", "", false}, {"sql", "", true}, // the adapter's own
		{"sql", "tenant-a", false}, {"m", "", true}, // the base model's unsalted blocks, stored by the fourth
	} {
		tg := kc.ask(tc.model, tc.salt, withQuestion(d, fmt.Sprintf("question %d", i)))
		if tg.CacheView != "exact" || (tg.MatchedTokens >= 60*16) != tc.hit || !tc.hit && tg.MatchedTokens != 0 {
			t.Fatalf("request %d (%s, salt %q): %s (%s) matched %d tokens, want a hit: %v", i, tc.model, tc.salt, tg.Worker.ID, tg.CacheView, tg.MatchedTokens, tc.hit)
		}
		// The next request finds this one's blocks in the view.
		kc.waitView(tg.Worker.ID, "exact", func(n int) bool { return n >= 60 }, "the request's blocks")
	}
}

// TestTokenizeDeadlineFallsBack: a tokenizer slower than the deadline
// does not hold the request: it is routed on the prefix index, and
// answered.
func TestTokenizeDeadlineFallsBack(t *testing.T) {
	release := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer slow.Close()
	defer close(release)
	kc := newKVCluster(t, []clusterOpt{func(cfg *config.Config) {
		cfg.Gateway.Tokenizer.Timeout = config.D(50 * time.Millisecond)
		cfg.Gateway.Tokenizer.Endpoints = []config.TokenizerEndpoint{{Model: "m", URL: slow.URL}}
	}}, kvEngine("w1", true, kvevents.Encoder{}), kvEngine("w2", true, kvevents.Encoder{}))
	kc.warm("w1", "w2")
	done := make(chan router.Target, 1)
	go func() {
		body := map[string]any{"model": "m", "messages": withQuestion(doc("I"), "q"), "max_tokens": 1}
		if r := kc.post("/v1/chat/completions", "key-plain", body); r.status != http.StatusOK {
			t.Errorf("request: %d %s", r.status, r.body)
		}
		done <- kc.last()
	}()
	select {
	case tg := <-done:
		if tg.CacheView != "approximate" {
			t.Fatalf("routed on %s without tokens", tg.CacheView)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the request waited for a tokenizer that never answers")
	}
}

// TestTokenizerKeepsConnections: prompts tokenized at once keep their
// connections to the tokenizer for the prompts after them: a second burst
// of requests as wide as the first opens (nearly) no new connection.
func TestTokenizerKeepsConnections(t *testing.T) {
	const burst = 8
	var arrived, conns atomic.Int32
	gates := [2]chan struct{}{make(chan struct{}), make(chan struct{})}
	tok := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		// Each burst's tokenizations are held until all of it has arrived,
		// so that the first needs burst connections at once.
		n := int(arrived.Add(1))
		if b := (n - 1) / burst; b < len(gates) {
			if n == (b+1)*burst {
				close(gates[b])
			}
			select {
			case <-gates[b]:
			case <-time.After(10 * time.Second):
				t.Errorf("tokenization %d: its burst never arrived whole", n)
			}
		}
		_, _ = io.WriteString(w, `{"count":3,"tokens":[1,2,3]}`)
	}))
	tok.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	tok.Start()
	defer tok.Close()
	kc := newKVCluster(t, []clusterOpt{func(cfg *config.Config) {
		cfg.Gateway.KVEvents.IndexAgreement = 0 // every request is tokenized
		cfg.Gateway.Tokenizer.Endpoints = []config.TokenizerEndpoint{{Model: "m", URL: tok.URL}}
	}}, kvEngine("w1", true, kvevents.Encoder{}), kvEngine("w2", true, kvevents.Encoder{}))
	kc.warm("w1", "w2")
	opened := make([]int32, len(gates))
	for b := range gates {
		before := conns.Load()
		var wg sync.WaitGroup
		for i := range burst {
			wg.Go(func() {
				body := map[string]any{"model": "m", "messages": short(fmt.Sprintf("burst %d, request %d", b, i)), "max_tokens": 1}
				if r := kc.post("/v1/chat/completions", "key-plain", body); r.status != http.StatusOK {
					t.Errorf("burst %d, request %d: %d %s", b, i, r.status, r.body)
				}
			})
		}
		wg.Wait()
		opened[b] = conns.Load() - before
	}
	if int(arrived.Load()) != len(gates)*burst {
		t.Fatalf("%d tokenizations for %d requests", arrived.Load(), len(gates)*burst)
	}
	// A connection is put back for reuse as its answer ends, which may
	// trail the request's own answer: a couple may not be back yet.
	if opened[0] != burst || opened[1] > 2 {
		t.Fatalf("connections opened to the tokenizer: %d in the first burst of %d, %d in the second; want %d and none (two at most)", opened[0], burst, opened[1], burst)
	}
}

// TestKVEventsReplicasAgree: three replicas each follow one engine's
// events themselves, and see the same blocks.
func TestKVEventsReplicasAgree(t *testing.T) {
	f := testcluster.New(t, "key-plain")
	for range 3 {
		cfg, err := config.Parse([]byte(`
[gateway]
listen = "127.0.0.1:0"
registry_listen = "127.0.0.1:0"
heartbeat_interval = "200ms"
route_policy = "cache_aware"
[gateway.tokenizer]
timeout = "5s"                       # a busy machine: no fallback
[[gateway.api_keys]]
name = "plain"
key = "key-plain"
scopes = ["inference", "debug"]
`))
		if err != nil {
			t.Fatal(err)
		}
		f.StartReplica(cfg)
	}
	f.StartEngines([]enginesim.Config{kvEngine("w1", true, kvevents.Encoder{}), kvEngine("w2", true, kvevents.Encoder{})})
	post := func(url string, body any) {
		b := jsonText(t, body)
		resp, err := http.Post(url, "application/json", strings.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("POST %s: %d", url, resp.StatusCode)
		}
	}
	for _, e := range f.Engines {
		post(e.URL()+"/v1/chat/completions", map[string]any{"model": "m", "max_tokens": 1, "messages": short("warm")})
	}
	d := doc("J")
	post(f.Engines[1].URL()+"/v1/chat/completions", map[string]any{"model": "m", "max_tokens": 1, "messages": withQuestion(d, "q1")})
	want := f.Engines[1].Stats()
	for i := range f.Replicas {
		f.WaitWorker(i, "w2", func(w router.WorkerView) bool { return w.CacheView == "exact" && w.KVBlocks["gpu"] >= 60 }, "w2's blocks")
	}
	// Every replica's view of w2 holds the same blocks (the engine's cache
	// stays as it is: nothing else is sent to it).
	blocks := f.Worker(0, "w2").KVBlocks["gpu"]
	eventually(t, 10*time.Second, func() bool {
		for i := range f.Replicas {
			if f.Worker(i, "w2").KVBlocks["gpu"] != blocks {
				return false
			}
		}
		return true
	}, "the replicas' views of w2 agree (%d blocks, %d cached in the engine)", blocks, want.TotalBlocks-want.FreeBlocks)
	for i, r := range f.Replicas {
		rep := f.Do(context.Background(), http.MethodPost, r.URL+"/v1/chat/completions", jsonText(t, map[string]any{"model": "m", "max_tokens": 1, "messages": withQuestion(d, fmt.Sprintf("q%d", i+2))}))
		if rep.Err != nil || rep.Status != http.StatusOK || rep.Route() != "w2" {
			var views []string
			for _, w := range f.Workers(i) {
				views = append(views, fmt.Sprintf("%s %s %v in flight %d+%d queue %d running %d", w.ID, w.CacheView, w.KVBlocks, w.InFlight, w.PeerInFlight, w.QueueDepth, w.Running))
			}
			t.Fatalf("replica %d routed to %q: %d %v; its views: %v; failovers %v; engines %+v %+v", i, rep.Route(), rep.Status, rep.Err, views,
				f.Metric(i, "tlgate_failovers_total"), f.Engines[0].Stats().Requests, f.Engines[1].Stats().Requests)
		}
	}
}

// TestKVEventsIndexAgreement: once the prefix index made the same picks
// as the engines' events for a model's latest checks, the gateway routes
// that model's requests on the index without tokenizing them, all but one
// in agreement_sample; with index_agreement 0 it tokenizes every one.
func TestKVEventsIndexAgreement(t *testing.T) {
	for _, share := range []float64{config.DefaultIndexAgreement, 0} {
		t.Run(fmt.Sprint(share), func(t *testing.T) {
			kc := newKVCluster(t, []clusterOpt{func(cfg *config.Config) {
				cfg.Gateway.KVEvents.IndexAgreement = share
			}}, kvEngine("w1", true, kvevents.Encoder{}), kvEngine("w2", true, kvevents.Encoder{}))
			kc.warm("w1", "w2")
			// Questions on one document: from the second on, the prefix
			// index and the events both hold it on the first's worker.
			d := doc("agreed")
			for i := range router.AgreementChecks + 1 {
				if tg := kc.ask("m", "", withQuestion(d, fmt.Sprint("checked ", i))); tg.CacheView != "exact" {
					t.Fatalf("request %d of the first %d routed on %s", i, router.AgreementChecks+1, tg.CacheView)
				}
			}
			views := map[string]int{}
			for i := range 2 * router.DefaultAgreementSample {
				views[kc.ask("m", "", withQuestion(d, fmt.Sprint("trusted ", i))).CacheView]++
			}
			want := map[string]int{"exact": 2, router.ViewAgreed: 2*router.DefaultAgreementSample - 2}
			if share == 0 {
				want = map[string]int{"exact": 2 * router.DefaultAgreementSample}
			}
			if !maps.Equal(views, want) {
				t.Fatalf("picks by view %v, want %v", views, want)
			}
		})
	}
}

// TestKVEventsNotFollowed: with follow = false the gateway subscribes to
// no engine's events, though the engines publish and advertise them:
// cache_aware routes on the prefix index, untokenized, and no worker's
// view is exact or stale.
func TestKVEventsNotFollowed(t *testing.T) {
	kc := newKVCluster(t, []clusterOpt{func(cfg *config.Config) {
		cfg.Gateway.KVEvents.Follow = false
	}}, kvEngine("w1", true, kvevents.Encoder{}), kvEngine("w2", true, kvevents.Encoder{}))
	d := doc("unfollowed")
	kc.direct("w2", withQuestion(d, "first question"), 1)
	first := kc.ask("m", "", withQuestion(d, "second question"))
	second := kc.ask("m", "", withQuestion(d, "third question"))
	for i, tg := range []router.Target{first, second} {
		if tg.CacheView != "approximate" {
			t.Fatalf("pick %d routed on %q, want approximate", i, tg.CacheView)
		}
	}
	if second.Worker.ID != first.Worker.ID || second.MatchedTokens == 0 {
		t.Fatalf("second question to %s (matched %d tokens), first to %s: the prefix index was not used", second.Worker.ID, second.MatchedTokens, first.Worker.ID)
	}
	for _, id := range []string{"w1", "w2"} {
		if v := kc.view(id); v.CacheView != "approximate" || v.KVBlocks != nil {
			t.Fatalf("%s: cache view %q with blocks %v, want approximate and none", id, v.CacheView, v.KVBlocks)
		}
		if pub := kc.engines[id].KVEventsPublisher(); pub.Subscribed(pub.Topic()) {
			t.Fatalf("%s's events have a subscriber", id)
		}
	}
}
