package tlbench

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// errNATSNotReady: the embedded NATS server did not accept connections in
// time.
var errNATSNotReady = errors.New("embedded NATS server not ready")

// natsServer is an embedded NATS server on loopback for the replicas'
// fleet sync, token-authenticated as the gateway requires; it can be
// stopped and started again on the same port (the kill drill).
type natsServer struct {
	srv   *server.Server
	port  int
	token string
}

// startNATS starts a server on a free loopback port with a random token.
func startNATS() (*natsServer, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return nil, fmt.Errorf("nats token: %w", err)
	}
	n := &natsServer{token: hex.EncodeToString(b), port: server.RANDOM_PORT}
	if err := n.start(); err != nil {
		return nil, err
	}
	return n, nil
}

func (n *natsServer) start() error {
	opts := &server.Options{Host: "127.0.0.1", Port: n.port, Authorization: n.token, NoLog: true, NoSigs: true, MaxPayload: 4 << 20}
	s, err := server.NewServer(opts)
	if err != nil {
		return fmt.Errorf("nats: %w", err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		return errNATSNotReady
	}
	n.srv = s
	if a, ok := s.Addr().(*net.TCPAddr); ok {
		n.port = a.Port
	}
	return nil
}

// url is the server's client URL (no credentials in it).
func (n *natsServer) url() string { return "nats://127.0.0.1:" + strconv.Itoa(n.port) }

// stop shuts the server down; start brings it back on the same port.
func (n *natsServer) stop() {
	if n.srv != nil {
		n.srv.Shutdown()
		n.srv.WaitForShutdown()
		n.srv = nil
	}
}

func (n *natsServer) close() { n.stop() }
