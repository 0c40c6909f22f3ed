package tlbench

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tlgate/tlgate/internal/tool/bench/procs"
)

// TestNATSServerRestarts: the benchmark's NATS server runs as a process,
// takes only its token, and comes back on the same port after a stop (the
// kill drill).
func TestNATSServerRestarts(t *testing.T) {
	ctx := t.Context()
	bin, err := procs.Build(ctx, t.TempDir(), natsServerPkg, raceBuildFlags...)
	if err != nil {
		t.Fatal(err)
	}
	n, err := startNATS(ctx, bin)
	if err != nil {
		t.Fatal(err)
	}
	defer n.close()
	roundTrip := func(step string) {
		t.Helper()
		nc, err := nats.Connect(n.url(), nats.Token(n.token), nats.Timeout(10*time.Second), nats.NoReconnect())
		if err != nil {
			t.Fatalf("%s: connect: %v", step, err)
		}
		defer nc.Close()
		sub, err := nc.SubscribeSync("x")
		if err != nil {
			t.Fatalf("%s: subscribe: %v", step, err)
		}
		if err := nc.Publish("x", []byte("ping")); err != nil {
			t.Fatalf("%s: publish: %v", step, err)
		}
		if m, err := sub.NextMsg(10 * time.Second); err != nil || string(m.Data) != "ping" {
			t.Fatalf("%s: got %v, %v; want ping", step, m, err)
		}
	}
	roundTrip("started")
	if nc, err := nats.Connect(n.url(), nats.Token("wrong"), nats.NoReconnect()); err == nil {
		nc.Close()
		t.Fatal("a wrong token was accepted")
	}
	url := n.url()
	n.stop()
	if nc, err := nats.Connect(url, nats.Token(n.token), nats.NoReconnect()); err == nil {
		nc.Close()
		t.Fatal("connected to a stopped server")
	}
	if err := n.start(ctx); err != nil {
		t.Fatal(err)
	}
	if n.url() != url {
		t.Fatalf("restarted on %s, want %s", n.url(), url)
	}
	roundTrip("restarted")
}
