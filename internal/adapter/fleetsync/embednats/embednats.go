// Package embednats runs a NATS server inside the process, on loopback,
// for the demo (-demo -replicas N) and the tests: token authentication or
// users with per-subject permissions, a port the OS picks, and Stop and
// Restart on the same port to drill an outage.
package embednats

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// ErrNotReady: the server did not accept connections in time.
var ErrNotReady = errors.New("embednats: server not ready")

// readyTimeout bounds a start.
const readyTimeout = 10 * time.Second

// Server is an embedded NATS server.
type Server struct {
	mu    sync.Mutex
	opts  server.Options
	srv   *server.Server
	token string
	url   string
}

// User is a NATS user of a server started with users: its name and
// password, and the subjects it may publish and subscribe to (none
// listed: any).
type User struct {
	Name, Password     string
	Publish, Subscribe []string
}

// Options are a server's: MaxPayload bounds one message (0: NATS's
// default, 1 MiB); with Users, clients log in as one of them (no token).
type Options struct {
	MaxPayload int32
	Users      []User
}

// Start starts a server on 127.0.0.1 (port picked by the OS) that accepts
// only clients presenting a random token (Token). maxPayload bounds one
// message (0: NATS's default, 1 MiB).
func Start(maxPayload int32) (*Server, error) {
	return StartWith(Options{MaxPayload: maxPayload})
}

// StartWith starts a server on 127.0.0.1 (port picked by the OS): with
// o.Users, clients log in as one of them and publish and subscribe only
// where its permissions allow; without, they present a random token
// (Token).
func StartWith(o Options) (*Server, error) {
	s := &Server{}
	s.opts = server.Options{
		Host: "127.0.0.1", Port: server.RANDOM_PORT, NoLog: true, NoSigs: true, MaxPayload: o.MaxPayload,
	}
	if len(o.Users) == 0 {
		var b [16]byte
		if _, err := rand.Read(b[:]); err != nil {
			return nil, fmt.Errorf("embednats: %w", err)
		}
		s.token = hex.EncodeToString(b[:])
		s.opts.Authorization = s.token
	}
	for _, u := range o.Users {
		su := &server.User{Username: u.Name, Password: u.Password}
		if len(u.Publish) > 0 || len(u.Subscribe) > 0 {
			su.Permissions = &server.Permissions{}
			if len(u.Publish) > 0 {
				su.Permissions.Publish = &server.SubjectPermission{Allow: u.Publish}
			}
			if len(u.Subscribe) > 0 {
				su.Permissions.Subscribe = &server.SubjectPermission{Allow: u.Subscribe}
			}
		}
		s.opts.Users = append(s.opts.Users, su)
	}
	if err := s.start(); err != nil {
		return nil, err
	}
	// A restart keeps the port, so clients find it again.
	s.opts.Port = s.srv.Addr().(*net.TCPAddr).Port
	s.url = fmt.Sprintf("nats://127.0.0.1:%d", s.opts.Port)
	return s, nil
}

func (s *Server) start() error {
	opts := s.opts
	srv, err := server.NewServer(&opts)
	if err != nil {
		return fmt.Errorf("embednats: %w", err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(readyTimeout) {
		srv.Shutdown()
		return fmt.Errorf("embednats: 127.0.0.1:%d: %w", s.opts.Port, ErrNotReady)
	}
	s.srv = srv
	return nil
}

// URL is the server's nats:// URL.
func (s *Server) URL() string { return s.url }

// Token is the token clients must present ("" for a server with users).
func (s *Server) Token() string { return s.token }

// Stop shuts the server down (clients see it gone); Restart brings it
// back on the same port.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv != nil {
		s.srv.Shutdown()
		s.srv.WaitForShutdown()
		s.srv = nil
	}
}

// Restart starts a stopped server again on its port.
func (s *Server) Restart() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv != nil {
		return nil
	}
	return s.start()
}

// Close stops the server for good.
func (s *Server) Close() { s.Stop() }
