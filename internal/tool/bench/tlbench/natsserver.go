package tlbench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/tlgate/tlgate/internal/tool/bench/procs"
)

// natsServerPkg is the NATS server's main package, built from the module's
// own nats-server requirement (the version the tests embed).
const natsServerPkg = "github.com/nats-io/nats-server/v2"

// natsServer is a NATS server for the replicas' fleet sync: the
// nats-server binary in a process of its own, as a fleet runs it, so that
// the sync lag is NATS's and not the load generator's scheduling. It
// listens on loopback, token-authenticated as the gateway requires, and can
// be stopped and started again on the same port (the kill drill).
type natsServer struct {
	bin, dir      string
	addr, monitor string // client and monitoring listeners, host:port
	token         string
	proc          *procs.Proc
}

// startNATS starts bin on free loopback ports with a random token; its
// configuration and log go to a temporary directory.
func startNATS(ctx context.Context, bin string) (*natsServer, error) {
	if bin == "" {
		return nil, fmt.Errorf("nats: no nats-server binary was built")
	}
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return nil, fmt.Errorf("nats token: %w", err)
	}
	addrs, err := procs.FreeAddrs(2)
	if err != nil {
		return nil, fmt.Errorf("nats: %w", err)
	}
	dir, err := os.MkdirTemp("", "tlbench-nats-")
	if err != nil {
		return nil, fmt.Errorf("nats: %w", err)
	}
	n := &natsServer{bin: bin, dir: dir, addr: addrs[0], monitor: addrs[1], token: hex.EncodeToString(b)}
	conf := fmt.Sprintf("listen: %q\nhttp: %q\nauthorization { token: %q }\nmax_payload: %d\n", n.addr, n.monitor, n.token, 4<<20)
	if err := os.WriteFile(filepath.Join(dir, "nats.conf"), []byte(conf), 0o600); err != nil {
		n.close()
		return nil, fmt.Errorf("nats: %w", err)
	}
	if err := n.start(ctx); err != nil {
		n.close()
		return nil, err
	}
	return n, nil
}

// start starts the server process and waits until it is healthy.
func (n *natsServer) start(ctx context.Context) error {
	p, err := procs.Start("nats-server", n.dir, n.bin, []string{"-c", filepath.Join(n.dir, "nats.conf")}, nil)
	if err != nil {
		return fmt.Errorf("nats: %w", err)
	}
	if err := p.WaitHTTP(ctx, "http://"+n.monitor+"/healthz", http.StatusOK, 10*time.Second); err != nil {
		p.Stop(time.Second)
		return fmt.Errorf("nats: %w\n%s", err, p.Log())
	}
	n.proc = p
	return nil
}

// url is the server's client URL (no credentials in it).
func (n *natsServer) url() string { return "nats://" + n.addr }

// stop kills the server (SIGTERM, SIGKILL after a second); start brings it
// back on the same port.
func (n *natsServer) stop() {
	if n.proc != nil {
		n.proc.Stop(time.Second)
		n.proc = nil
	}
}

// close stops the server and removes its directory.
func (n *natsServer) close() {
	n.stop()
	_ = os.RemoveAll(n.dir)
}
