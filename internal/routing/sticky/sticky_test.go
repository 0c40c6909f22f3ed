package sticky

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/tlgate/tlgate/internal/testkit/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

// peerPut is PutPeer of id as its digest and key's tag.
func peerPut(m *Map, replica, id, key, worker string, ttl time.Duration, now time.Time) bool {
	return m.PutPeer(replica, Digest(id), OwnerTag(id, key), worker, ttl, now)
}

func TestMap(t *testing.T) {
	t0 := time.Unix(1000, 0)
	cases := []struct {
		name string
		run  func(m *Map) (string, bool)
		want string
		ok   bool
	}{
		{"put then get", func(m *Map) (string, bool) {
			m.Put("r1", "w1", "alice", t0)
			return m.Worker("r1", "alice", t0.Add(time.Minute))
		}, "w1", true},
		{"another key finds nothing", func(m *Map) (string, bool) {
			m.Put("r1", "w1", "alice", t0)
			return m.Worker("r1", "bob", t0)
		}, "", false},
		{"another key finds nothing of a peer's either", func(m *Map) (string, bool) {
			peerPut(m, "gw-1", "r1", "alice", "w1", time.Minute, t0)
			return m.Worker("r1", "bob", t0)
		}, "", false},
		{"unknown id", func(m *Map) (string, bool) { return m.Worker("nope", "alice", t0) }, "", false},
		{"a peer that forgot another's digest cannot store it", func(m *Map) (string, bool) {
			peerPut(m, "gw-1", "r1", "alice", "w1", time.Minute, t0)
			m.ForgetPeer(Digest("r1"))
			peerPut(m, "mallory", "r1", "alice", "w9", time.Minute, t0)
			return m.Worker("r1", "alice", t0)
		}, "", false},
		{"nor can any peer store a response deleted here", func(m *Map) (string, bool) {
			m.Put("r1", "w1", "alice", t0)
			m.Forget("r1")
			peerPut(m, "gw-1", "r1", "alice", "w9", time.Minute, t0)
			return m.Worker("r1", "alice", t0)
		}, "", false},
		{"expired after the TTL", func(m *Map) (string, bool) {
			m.Put("r1", "w1", "alice", t0)
			return m.Worker("r1", "alice", t0.Add(10*time.Minute))
		}, "", false},
		{"a later put renews", func(m *Map) (string, bool) {
			m.Put("r1", "w1", "alice", t0)
			m.Put("r1", "w2", "alice", t0.Add(8*time.Minute))
			return m.Worker("r1", "alice", t0.Add(12*time.Minute))
		}, "w2", true},
		{"forgotten", func(m *Map) (string, bool) {
			m.Put("r1", "w1", "alice", t0)
			m.Forget("r1")
			return m.Worker("r1", "alice", t0)
		}, "", false},
		{"the oldest goes when full", func(m *Map) (string, bool) {
			for i := range 4 {
				m.Put(fmt.Sprintf("r%d", i), "w", "alice", t0.Add(time.Duration(i)*time.Second))
			}
			return m.Worker("r0", "alice", t0.Add(5*time.Second))
		}, "", false},
		{"the newest stays when full", func(m *Map) (string, bool) {
			for i := range 4 {
				m.Put(fmt.Sprintf("r%d", i), fmt.Sprintf("w%d", i), "alice", t0.Add(time.Duration(i)*time.Second))
			}
			return m.Worker("r3", "alice", t0.Add(5*time.Second))
		}, "w3", true},
		{"empty ids are not recorded", func(m *Map) (string, bool) {
			m.Put("", "w1", "alice", t0)
			return m.Worker("", "alice", t0)
		}, "", false},
		{"a peer's entry is found", func(m *Map) (string, bool) {
			peerPut(m, "gw-1", "r1", "alice", "w1", time.Minute, t0)
			return m.Worker("r1", "alice", t0.Add(59*time.Second))
		}, "w1", true},
		{"a peer's entry lives its own ttl", func(m *Map) (string, bool) {
			peerPut(m, "gw-1", "r1", "alice", "w1", time.Minute, t0)
			return m.Worker("r1", "alice", t0.Add(time.Minute))
		}, "", false},
		{"a peer's entry lives at most the TTL", func(m *Map) (string, bool) {
			peerPut(m, "gw-1", "r1", "alice", "w1", 24*time.Hour, t0)
			return m.Worker("r1", "alice", t0.Add(10*time.Minute))
		}, "", false},
		{"the own entry wins over a peer's", func(m *Map) (string, bool) {
			m.Put("r1", "w1", "alice", t0)
			peerPut(m, "gw-1", "r1", "alice", "liar", time.Minute, t0.Add(time.Second))
			return m.Worker("r1", "alice", t0.Add(2*time.Second))
		}, "w1", true},
		{"a digest one peer holds is not another's", func(m *Map) (string, bool) {
			peerPut(m, "gw-1", "r1", "alice", "w1", time.Minute, t0)
			if peerPut(m, "gw-2", "r1", "alice", "liar", time.Minute, t0.Add(time.Second)) {
				return "taken over", true
			}
			return m.Worker("r1", "alice", t0.Add(2*time.Second))
		}, "w1", true},
		{"a peer's forget keeps the own entry", func(m *Map) (string, bool) {
			m.Put("r1", "w1", "alice", t0)
			peerPut(m, "gw-1", "r1", "alice", "w1", time.Minute, t0)
			m.ForgetPeer(Digest("r1"))
			return m.Worker("r1", "alice", t0)
		}, "w1", true},
		{"a peer's forget drops the peer's entry", func(m *Map) (string, bool) {
			peerPut(m, "gw-1", "r1", "alice", "w1", time.Minute, t0)
			m.ForgetPeer(Digest("r1"))
			return m.Worker("r1", "alice", t0)
		}, "", false},
		{"the own forget drops a peer's entry too", func(m *Map) (string, bool) {
			peerPut(m, "gw-1", "r1", "alice", "w1", time.Minute, t0)
			m.Forget("r1")
			return m.Worker("r1", "alice", t0)
		}, "", false},
		{"a flood of peers' entries keeps the own ones", func(m *Map) (string, bool) {
			m.Put("mine", "w1", "alice", t0)
			for i := range 100 {
				peerPut(m, "gw-1", fmt.Sprintf("p%d", i), "alice", "w2", time.Minute, t0)
			}
			return m.Worker("mine", "alice", t0)
		}, "w1", true},
		{"the oldest peer's entry goes when the peers' share is full", func(m *Map) (string, bool) {
			for i := range 4 {
				peerPut(m, "gw-1", fmt.Sprintf("p%d", i), "alice", "w2", time.Minute, t0)
			}
			return m.Worker("p0", "alice", t0)
		}, "", false},
		{"a digest of the wrong length is refused", func(m *Map) (string, bool) {
			if m.PutPeer("gw-1", "short", OwnerTag("r1", "alice"), "w1", time.Minute, t0) {
				return "recorded", true
			}
			return "", false
		}, "", false},
		{"a peer's ttl not positive", func(m *Map) (string, bool) {
			if peerPut(m, "gw-1", "r1", "alice", "w1", 0, t0) {
				return "recorded", true
			}
			return m.Worker("r1", "alice", t0)
		}, "", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := New(Config{TTL: 10 * time.Minute, MaxEntries: 3})
			got, ok := tc.run(m)
			if got != tc.want || ok != tc.ok {
				t.Fatalf("got %q, %v; want %q, %v", got, ok, tc.want, tc.ok)
			}
			if own, peer := m.Len(); own > 3 || peer > 3 {
				t.Fatalf("Len %d, %d over MaxEntries", own, peer)
			}
		})
	}
}

// TestPeersShareFairly: a peer flooding entries pushes out only its own
// once it holds more than the others: the peers' bound is shared.
func TestPeersShareFairly(t *testing.T) {
	t0 := time.Unix(1000, 0)
	m := New(Config{TTL: time.Hour, MaxEntries: 100})
	for i := range 30 {
		peerPut(m, "honest", fmt.Sprintf("h%d", i), "alice", "w1", time.Hour, t0)
	}
	for i := range 10_000 {
		peerPut(m, "flood", fmt.Sprintf("f%d", i), "mallory", "w2", time.Hour, t0.Add(time.Millisecond))
	}
	for i := range 30 {
		if _, ok := m.Worker(fmt.Sprintf("h%d", i), "alice", t0.Add(time.Second)); !ok {
			t.Fatalf("the honest peer's entry h%d was pushed out by the flood", i)
		}
	}
	if own, peers := m.Len(); own != 0 || peers != 100 || m.PeerLen("flood") != 70 {
		t.Fatalf("entries own %d, peers %d, the flood's %d: want the bound of 100 full, 70 of them the flood's", own, peers, m.PeerLen("flood"))
	}
	// Two floods share what the honest peer leaves.
	for i := range 10_000 {
		peerPut(m, "flood2", fmt.Sprintf("g%d", i), "mallory", "w2", time.Hour, t0.Add(2*time.Millisecond))
	}
	if m.PeerLen("honest") != 30 || m.PeerLen("flood") != 35 || m.PeerLen("flood2") != 35 {
		t.Fatalf("shares honest %d, flood %d, flood2 %d; want 30, 35, 35", m.PeerLen("honest"), m.PeerLen("flood"), m.PeerLen("flood2"))
	}
}

func TestExportOwn(t *testing.T) {
	t0 := time.Unix(1000, 0)
	m := New(Config{TTL: 10 * time.Minute, MaxEntries: 3})
	m.Put("old", "w1", "alice", t0)
	m.Put("mine", "w1", "alice", t0.Add(6*time.Minute))
	m.Put("both", "w2", "bob", t0.Add(7*time.Minute))
	peerPut(m, "gw-1", "theirs", "alice", "w3", 5*time.Minute, t0.Add(7*time.Minute))
	// "old" has lived its time:
	now := t0.Add(10 * time.Minute)
	type entry struct {
		digest, owner, worker string
		ttl                   time.Duration
	}
	var got []entry
	export := func(digest, owner, worker string, ttl time.Duration) {
		got = append(got, entry{digest, owner, worker, ttl})
	}
	m.ExportOwn(10, now, export)
	want := []entry{{Digest("both"), OwnerTag("both", "bob"), "w2", 7 * time.Minute}, {Digest("mine"), OwnerTag("mine", "alice"), "w1", 6 * time.Minute}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("ExportOwn\n got %+v\nwant %+v", got, want)
	}
	got = nil
	m.ExportOwn(1, now, export)
	if len(got) != 1 || got[0].digest != Digest("both") {
		t.Fatalf("ExportOwn(1) = %+v, want the newest", got)
	}
}

// TestDigestsHideIDsAndKeys: digests and owner tags are DigestBytes long,
// differ for different ids and keys, and a key's tags of two responses
// are unrelated.
func TestDigestsHideIDsAndKeys(t *testing.T) {
	if len(Digest("resp_1")) != DigestBytes || len(OwnerTag("resp_1", "alice")) != DigestBytes {
		t.Fatal("digest lengths")
	}
	if Digest("resp_1") == Digest("resp_2") || OwnerTag("resp_1", "alice") == OwnerTag("resp_1", "bob") ||
		OwnerTag("resp_1", "alice") == OwnerTag("resp_2", "alice") || OwnerTag("resp_1", "") == Digest("resp_1") {
		t.Fatal("digests collide")
	}
}

// TestExportCallsOutsideMutex: ExportOwn's callback runs with the map's
// mutex released, so lookups of request actors never wait through the up
// to tens of thousands of callbacks of a snapshot; the entries it hands
// over are those of the moment it was called.
func TestExportCallsOutsideMutex(t *testing.T) {
	m := New(Config{})
	t0 := time.Unix(1000, 0)
	ids := map[string]string{} // digest -> id
	for i := range 100 {
		id := fmt.Sprintf("resp_%d", i)
		ids[Digest(id)] = id
		m.Put(id, "w1", "key", t0)
	}
	n := 0
	m.ExportOwn(1000, t0, func(digest, _, _ string, _ time.Duration) {
		if !m.mu.TryLock() {
			t.Fatalf("ExportOwn holds the map's mutex while calling fn (entry %x)", digest)
		}
		m.mu.Unlock()
		id := ids[digest]
		if _, ok := m.Worker(id, "key", t0); !ok {
			t.Fatalf("entry %s exported but not found", id)
		}
		m.Forget(id) // a callback may change the map: the export goes on
		n++
	})
	if n != 100 {
		t.Fatalf("exported %d entries, want 100", n)
	}
	if own, _ := m.Len(); own != 0 {
		t.Fatalf("after forgetting every exported id: %d own entries left", own)
	}
}
