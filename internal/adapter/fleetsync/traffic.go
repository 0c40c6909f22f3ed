package fleetsync

import (
	"context"
	"encoding/json"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tlgate/tlgate/internal/adapter/metrics"
	"github.com/tlgate/tlgate/internal/adapter/traffic"
)

// The console's traffic of the fleet: a replica asks on P.traffic (every
// replica subscribes, none in a queue group), and each other one answers
// with its traffic rings on its own subject P.traffics.<replica>.<asker>.
// A reply is bounded like a snapshot (snapshotLimit: its oldest buckets go
// first) and each replica answers a bounded rate of requests.

// TrafficWait bounds how long Traffic waits for the other replicas'
// rings: it returns as soon as every replica the router tracks answered.
const TrafficWait = 500 * time.Millisecond

// trafficAsk is a traffic request's payload.
type trafficAsk struct {
	Asker string `json:"asker"`
	Nonce uint64 `json:"nonce"`
}

// trafficReply is a traffic answer's payload.
type trafficReply struct {
	Nonce uint64      `json:"nonce"`
	Raw   traffic.Raw `json:"traffic"`
}

// trafficWaiter collects the answers to one of this replica's requests.
type trafficWaiter struct {
	ch chan trafficPeer
}

type trafficPeer struct {
	replica string
	raw     traffic.Raw
}

// Traffic asks every other replica for its traffic rings and returns
// those that answered within TrafficWait (or before ctx ends): at once
// when sync is off or NATS is away, with none.
func (c *Client) Traffic(ctx context.Context) []traffic.Raw {
	c.mu.Lock()
	nc, id := c.nc, c.id
	if nc == nil || !nc.IsConnected() || id == "" {
		c.mu.Unlock()
		return nil
	}
	c.trafficNonce++
	nonce := c.trafficNonce
	w := &trafficWaiter{ch: make(chan trafficPeer, c.cfg.MaxPeers)}
	if c.trafficWaits == nil {
		c.trafficWaits = map[uint64]*trafficWaiter{}
	}
	c.trafficWaits[nonce] = w
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.trafficWaits, nonce)
		c.mu.Unlock()
	}()
	ask, _ := json.Marshal(trafficAsk{Asker: id, Nonce: nonce}) // plain fields always encode
	if nc.Publish(c.subject(subjectTraffic), ask) != nil {
		return nil
	}
	peers := int(c.peers.Load())
	got := map[string]traffic.Raw{}
	timer := time.NewTimer(TrafficWait)
	defer timer.Stop()
	for peers <= 0 || len(got) < peers {
		select {
		case p := <-w.ch:
			got[p.replica] = p.raw
		case <-timer.C:
			return rawsOf(got)
		case <-ctx.Done():
			return rawsOf(got)
		}
	}
	return rawsOf(got)
}

func rawsOf(m map[string]traffic.Raw) []traffic.Raw {
	out := make([]traffic.Raw, 0, len(m))
	for _, r := range m {
		out = append(out, r)
	}
	return out
}

// onTrafficRequest answers another replica's request with this replica's
// rings.
func (c *Client) onTrafficRequest(msg *nats.Msg) {
	var ask trafficAsk
	switch {
	case c.o.Traffic == nil:
		return
	case json.Unmarshal(msg.Data, &ask) != nil || !ValidReplicaID(ask.Asker):
		c.m.Dropped(metrics.SyncTraffic, metrics.SyncDropMalformed, 1)
		return
	case ask.Asker == c.ID():
		return // this replica's own request
	case !c.trafficLimit.Allow():
		c.m.Dropped(metrics.SyncTraffic, metrics.SyncDropRate, 1)
		return
	}
	data := fitTraffic(trafficReply{Nonce: ask.Nonce, Raw: c.o.Traffic()}, c.snapshotLimit())
	c.mu.Lock()
	nc := c.nc
	c.mu.Unlock()
	if data == nil || nc == nil || nc.Publish(c.subject(subjectTraffics+"."+c.ID()+"."+ask.Asker), data) != nil {
		c.m.Dropped(metrics.SyncTraffic, metrics.SyncDropDisconnected, 1)
		return
	}
	c.m.Sent(metrics.SyncTraffic, 1)
}

// fitTraffic encodes r within limit bytes, leaving out its oldest buckets
// while it does not fit; nil when even one bucket does not.
func fitTraffic(r trafficReply, limit int) []byte {
	for {
		data, err := json.Marshal(r)
		if err != nil {
			return nil
		}
		if len(data) <= limit {
			return data
		}
		oldest, at := int64(0), -1
		for i, m := range r.Raw.Models {
			if len(m.Buckets) > 0 && (at < 0 || m.Buckets[0].Num < oldest) {
				oldest, at = m.Buckets[0].Num, i
			}
		}
		if at < 0 {
			return nil
		}
		for i := range r.Raw.Models {
			m := &r.Raw.Models[i]
			for len(m.Buckets) > 0 && m.Buckets[0].Num == oldest {
				m.Buckets = m.Buckets[1:]
			}
		}
	}
}

// onTraffic takes another replica's answer to one of this replica's
// requests.
func (c *Client) onTraffic(msg *nats.Msg) {
	from, ok := c.answerer(msg.Subject, c.subject(subjectTraffics))
	var r trafficReply
	if !ok || len(msg.Data) > c.cfg.MaxMessageBytes || json.Unmarshal(msg.Data, &r) != nil {
		c.m.Dropped(metrics.SyncTraffic, metrics.SyncDropMalformed, 1)
		return
	}
	c.mu.Lock()
	w := c.trafficWaits[r.Nonce]
	c.mu.Unlock()
	if w == nil {
		return // too late: the request was answered without it
	}
	select {
	case w.ch <- trafficPeer{replica: from, raw: r.Raw}:
	default: // more answers than max_peers
	}
}

// answerer is the replica of an answer's subject prefix.<replica>.<asker>
// when asker is this replica.
func (c *Client) answerer(subject, prefix string) (string, bool) {
	rest, ok := strings.CutPrefix(subject, prefix+".")
	from, asker, found := strings.Cut(rest, ".")
	return from, ok && found && asker == c.ID() && ValidReplicaID(from)
}
