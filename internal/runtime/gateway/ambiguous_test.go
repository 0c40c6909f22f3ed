package gateway_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/tlgate/tlgate/actors/admin/store"
	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/testkit/cluster"
)

// ambiguousConfig is the gateway of TestEtcdAmbiguousPutAnswersTruth but
// its store.
const ambiguousConfig = `
[gateway]
listen = "127.0.0.1:0"
registry_listen = "127.0.0.1:0"

[[gateway.api_keys]]
name = "ops"
key = "ambiguous-ops-key"
scopes = ["admin"]

[[gateway.routes]]
model = "smol"
backends = [{ model = "smol-v1", weight = 1 }]
`

// TestEtcdAmbiguousPutAnswersTruth: a PUT /admin/v1/routes whose answer
// from etcd is lost is answered by what etcd holds, read back: 200 with
// the new ETag, and the table in force, when etcd committed it; 503
// saying the table in force is kept when it did not; 503 saying the
// outcome is unknown when etcd cannot be read back either (and the write,
// committed after all, arrives through the watch once etcd is back). A
// proxy between the gateway and etcd loses the one exchange of each case.
func TestEtcdAmbiguousPutAnswersTruth(t *testing.T) {
	etcd := cluster.StartEtcd(t, 1)
	proxy := newDropProxy(t, etcd.Endpoints()[0])
	f := cluster.New(t, "ambiguous-ops-key")
	cfg, err := config.Parse([]byte(ambiguousConfig))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Gateway.Store = config.Store{Kind: config.StoreEtcd, Endpoints: []string{proxy.URL()}, Prefix: config.DefaultStorePrefix, DialTimeout: config.D(time.Second)}
	gw := f.StartReplica(cfg)
	direct, err := clientv3.New(clientv3.Config{Endpoints: etcd.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	storedEpoch := func() uint64 {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		r, err := direct.Get(ctx, config.DefaultStorePrefix+"routes")
		if err != nil || len(r.Kvs) != 1 {
			t.Fatalf("read etcd directly: %v %v", r, err)
		}
		epoch, _, err := store.DecodeTable(r.Kvs[0].Value)
		if err != nil {
			t.Fatal(err)
		}
		return epoch
	}
	routerEpoch := func() uint64 {
		res, err := gw.GW.System().Root.RequestFuture(gw.GW.Router, &router.ListWorkers{}, 2*time.Second).Result()
		if err != nil {
			t.Fatalf("router: %v", err)
		}
		return res.(*router.WorkersResult).Epoch
	}
	body := func(model string) string {
		return fmt.Sprintf(`{"routes":[{"model":"smol","backends":[{"model":%q,"weight":1}]}]}`, model)
	}

	cases := []struct {
		name    string
		lose    loss
		refuse  bool // etcd unreachable after the loss
		ifMatch string
		model   string
		status  int
		etag    string   // the answer's ETag (200 only)
		says    []string // in the answer's body
		saysNot []string
		inForce uint64 // the epoch in force after (GET's ETag, the router's)
		stored  uint64 // the epoch etcd holds after
	}{
		{
			name: "answer lost after etcd committed", lose: answerLost, ifMatch: `"1"`, model: "committed-v2",
			status: http.StatusOK, etag: `"2"`, says: []string{"committed-v2"}, inForce: 2, stored: 2,
		},
		{
			name: "connection lost before etcd had the write", lose: requestLost, ifMatch: `"2"`, model: "lost-v3",
			status: http.StatusServiceUnavailable, says: []string{"store_unavailable", "not written", "kept"}, saysNot: []string{"lost-v3"},
			inForce: 2, stored: 2,
		},
		{
			name: "answer lost and etcd unreachable", lose: answerLost, refuse: true, ifMatch: `"2"`, model: "unknown-v3",
			status: http.StatusServiceUnavailable, says: []string{"store_unavailable", "outcome unknown; GET /admin/v1/routes and retry"},
			saysNot: []string{"kept", "not written"}, inForce: 2, stored: 3,
		},
	}
	for _, c := range cases {
		// Each case starts with etcd reachable (a store seen down would
		// answer 503 without sending the write).
		cluster.Eventually(t, 10*time.Second, gw.GW.StoreUp, "%s: the store to be up", c.name)
		fired := proxy.arm(c.model, c.lose, c.refuse)
		r := f.Do(context.Background(), "PUT", gw.URL+"/admin/v1/routes", body(c.model), "If-Match", c.ifMatch)
		select {
		case <-fired:
		default:
			t.Fatalf("%s: the proxy lost nothing (answer %d %s)", c.name, r.Status, r.Body)
		}
		t.Logf("%s: %d %s", c.name, r.Status, r.Body)
		if r.Err != nil || r.Status != c.status || c.etag != "" && r.Header.Get("ETag") != c.etag {
			t.Fatalf("%s: PUT answered %d ETag %s %s (%v), want %d ETag %s", c.name, r.Status, r.Header.Get("ETag"), r.Body, r.Err, c.status, c.etag)
		}
		for _, s := range c.says {
			if !bytes.Contains(r.Body, []byte(s)) {
				t.Errorf("%s: the answer %s does not say %q", c.name, r.Body, s)
			}
		}
		for _, s := range c.saysNot {
			if bytes.Contains(r.Body, []byte(s)) {
				t.Errorf("%s: the answer %s says %q", c.name, r.Body, s)
			}
		}
		get := f.Do(context.Background(), "GET", gw.URL+"/admin/v1/routes", "")
		if want := fmt.Sprintf(`"%d"`, c.inForce); get.Status != http.StatusOK || get.Header.Get("ETag") != want {
			t.Fatalf("%s: GET after: %d ETag %s %s, want ETag %s", c.name, get.Status, get.Header.Get("ETag"), get.Body, want)
		}
		if want := c.status == http.StatusOK; bytes.Contains(get.Body, []byte(c.model)) != want {
			t.Errorf("%s: the table in force %s, want it to hold %s: %v", c.name, get.Body, c.model, want)
		}
		if got := routerEpoch(); got != c.inForce {
			t.Errorf("%s: the router routes by epoch %d, want %d", c.name, got, c.inForce)
		}
		if got := storedEpoch(); got != c.stored {
			t.Errorf("%s: etcd holds epoch %d, want %d", c.name, got, c.stored)
		}
	}
	// etcd reachable again, the write whose outcome was unknown (etcd had
	// committed it) is installed from the watch.
	proxy.restore()
	cluster.Eventually(t, 15*time.Second, func() bool {
		get := f.Do(context.Background(), "GET", gw.URL+"/admin/v1/routes", "")
		return get.Header.Get("ETag") == `"3"` && bytes.Contains(get.Body, []byte("unknown-v3"))
	}, "the committed write to arrive through the watch")
}

// loss is which half of an exchange dropProxy loses.
type loss int

const (
	// requestLost: the connection is closed before the request's message
	// is forwarded; etcd never has it.
	requestLost loss = iota
	// answerLost: the request is forwarded and the connection is closed
	// when etcd's answer to it comes back, before it is relayed.
	answerLost
)

// dropProxy is a TCP proxy in front of etcd that follows the HTTP/2
// frames of each connection (etcd's gRPC) as it relays them, so that it
// can lose one exchange: armed with a marker (bytes of one request's
// message), it closes the connection either before it forwards the DATA
// frame holding the marker or when etcd's first frame answering that
// request's stream comes back (relaying none of etcd's frames in
// between, watch events included). It fires once and then relays everything
// again (the client's reconnection included), unless it was armed to
// refuse every connection after (until restore).
type dropProxy struct {
	lis    net.Listener
	target string
	mu     sync.Mutex
	armed  *dropArm
	refuse bool
	conns  map[net.Conn]bool
	wg     sync.WaitGroup
}

type dropArm struct {
	marker []byte
	lose   loss
	refuse bool
	fired  chan struct{}
}

func newDropProxy(t testing.TB, target string) *dropProxy {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &dropProxy{lis: lis, target: strings.TrimPrefix(target, "http://"), conns: map[net.Conn]bool{}}
	p.wg.Go(p.accept)
	t.Cleanup(func() {
		_ = lis.Close()
		p.mu.Lock()
		for c := range p.conns {
			_ = c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

// URL is the proxy's endpoint.
func (p *dropProxy) URL() string { return "http://" + p.lis.Addr().String() }

// arm makes the proxy lose the exchange whose request carries marker; the
// channel is closed once it has.
func (p *dropProxy) arm(marker string, lose loss, refuse bool) <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.armed = &dropArm{marker: []byte(marker), lose: lose, refuse: refuse, fired: make(chan struct{})}
	return p.armed.fired
}

// restore accepts connections again after an arm that refused them.
func (p *dropProxy) restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refuse = false
}

func (p *dropProxy) accept() {
	for {
		c, err := p.lis.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.refuse {
			p.mu.Unlock()
			_ = c.Close()
			continue
		}
		p.mu.Unlock()
		up, err := net.DialTimeout("tcp", p.target, time.Second)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns[c], p.conns[up] = true, true
		p.mu.Unlock()
		pc := &proxied{client: c, server: up}
		p.wg.Go(func() { p.upstream(pc) })
		p.wg.Go(func() { p.downstream(pc) })
	}
}

// proxied is one client connection and its connection to etcd; stream
// and pending are the exchange armed to lose its answer.
type proxied struct {
	client, server net.Conn
	mu             sync.Mutex
	stream         uint32
	pending        *dropArm
}

// HTTP/2 frame types the proxy looks at.
const (
	frameData    = 0x0
	frameHeaders = 0x1
	frameReset   = 0x3
)

// clientPreface opens every HTTP/2 connection, before its first frame.
const clientPreface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// readFrame reads one HTTP/2 frame whole: its 9-byte header and payload.
func readFrame(r io.Reader) (frame []byte, typ byte, stream uint32, err error) {
	var hdr [9]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, 0, 0, err
	}
	n := int(hdr[0])<<16 | int(hdr[1])<<8 | int(hdr[2])
	frame = make([]byte, 9+n)
	copy(frame, hdr[:])
	if _, err := io.ReadFull(r, frame[9:]); err != nil {
		return nil, 0, 0, err
	}
	return frame, hdr[3], binary.BigEndian.Uint32(hdr[5:9]) & 0x7fffffff, nil
}

// upstream relays client frames to etcd, and loses the armed request.
func (p *dropProxy) upstream(pc *proxied) {
	defer p.close(pc)
	preface := make([]byte, len(clientPreface))
	if _, err := io.ReadFull(pc.client, preface); err != nil {
		return
	}
	if _, err := pc.server.Write(preface); err != nil {
		return
	}
	for {
		frame, typ, stream, err := readFrame(pc.client)
		if err != nil {
			return
		}
		if typ == frameData {
			if a := p.take(frame[9:]); a != nil {
				if a.lose == requestLost {
					p.fire(a, pc)
					return
				}
				pc.mu.Lock()
				pc.stream, pc.pending = stream, a
				pc.mu.Unlock()
			}
		}
		if _, err := pc.server.Write(frame); err != nil {
			return
		}
	}
}

// downstream relays etcd's frames to the client, and loses the answer to
// the armed request.
func (p *dropProxy) downstream(pc *proxied) {
	defer p.close(pc)
	for {
		frame, typ, stream, err := readFrame(pc.server)
		if err != nil {
			return
		}
		pc.mu.Lock()
		a := pc.pending
		pc.mu.Unlock()
		if a != nil {
			// Nothing etcd sends once the request is on its way reaches
			// the client: a watch event for the write, on its own stream,
			// can come before the answer, and would tell the gateway the
			// outcome the case means it not to know.
			if stream == pc.stream && (typ == frameHeaders || typ == frameData || typ == frameReset) {
				p.fire(a, pc)
				return
			}
			continue
		}
		if _, err := pc.client.Write(frame); err != nil {
			return
		}
	}
}

// take disarms the proxy and returns its arm when payload holds the
// marker.
func (p *dropProxy) take(payload []byte) *dropArm {
	p.mu.Lock()
	defer p.mu.Unlock()
	a := p.armed
	if a == nil || !bytes.Contains(payload, a.marker) {
		return nil
	}
	p.armed = nil
	return a
}

// fire closes the connection pair and, as armed, refuses the next ones.
func (p *dropProxy) fire(a *dropArm, pc *proxied) {
	p.mu.Lock()
	if a.refuse {
		p.refuse = true
	}
	p.mu.Unlock()
	close(a.fired) // before the close, which the client may answer at once
	p.close(pc)
}

func (p *dropProxy) close(pc *proxied) {
	_ = pc.client.Close()
	_ = pc.server.Close()
	p.mu.Lock()
	delete(p.conns, pc.client)
	delete(p.conns, pc.server)
	p.mu.Unlock()
}
