package fleet

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"

	controlv1 "github.com/tlgate/tlgate/protos/tl/control/v1"
)

// KVEvents is where a worker publishes its KV cache events (vLLM's and
// SGLang's --kv-events-config): the gateway subscribes to them and routes
// on what the worker's cache holds. The zero value: it publishes none.
type KVEvents struct {
	// Endpoint is its PUB socket, tcp://host:port (or ipc:///path for an
	// engine configured on the gateway's host).
	Endpoint string `json:"endpoint"`
	// Replay is its replay ROUTER socket, same form ("" for none).
	Replay string `json:"replay_endpoint,omitempty"`
	// Topic is the topic subscribed ("" for every batch).
	Topic string `json:"topic,omitempty"`
}

// MaxKVTopic bounds a KV events topic, in bytes.
const MaxKVTopic = 256

// ErrInvalidKVEvents is wrapped by the errors of a bad kv_events.
var ErrInvalidKVEvents = errors.New("invalid kv_events")

// ParseKVEndpoint checks a KV events endpoint the gateway connects to and
// returns the network and address to dial: tcp://host:port, with a host
// and a port in 1..65535, or ipc:///path.
func ParseKVEndpoint(ep string) (network, addr string, err error) {
	if rest, ok := strings.CutPrefix(ep, "ipc://"); ok {
		if rest == "" || strings.ContainsRune(rest, 0) || len(rest) > 108 {
			return "", "", fmt.Errorf("%w: %q: want ipc:///path", ErrInvalidKVEvents, truncate(ep))
		}
		return "unix", rest, nil
	}
	u, err := url.Parse(ep)
	if err != nil || u.Scheme != "tcp" || u.Opaque != "" || u.User != nil || u.Path != "" || u.RawQuery != "" || u.Fragment != "" {
		return "", "", fmt.Errorf("%w: %q: want tcp://host:port or ipc:///path", ErrInvalidKVEvents, truncate(ep))
	}
	host, port, err := net.SplitHostPort(u.Host)
	if err != nil || host == "" || host == "*" {
		return "", "", fmt.Errorf("%w: %q: want tcp://host:port", ErrInvalidKVEvents, truncate(ep))
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return "", "", fmt.Errorf("%w: %q has no valid port", ErrInvalidKVEvents, truncate(ep))
	}
	return "tcp", u.Host, nil
}

// KVEndpoint resolves an endpoint as an engine announces it: a tcp
// endpoint with no host ("tcp://:5557", or vLLM's own "tcp://*:5557") is
// on the host of the engine's http address; the result is checked by
// ParseKVEndpoint. "" stays "".
func KVEndpoint(ep, httpAddress string) (string, error) {
	if ep == "" {
		return "", nil
	}
	if rest, ok := strings.CutPrefix(ep, "tcp://"); ok {
		if port, ok := strings.CutPrefix(rest, ":"); ok {
			ep = "tcp://" + net.JoinHostPort(hostOf(httpAddress), port)
		} else if port, ok := strings.CutPrefix(rest, "*:"); ok {
			ep = "tcp://" + net.JoinHostPort(hostOf(httpAddress), port)
		}
	}
	if _, _, err := ParseKVEndpoint(ep); err != nil {
		return "", err
	}
	return ep, nil
}

func hostOf(hostport string) string {
	h, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return hostport
	}
	return h
}

// kvEventsOf resolves and checks a status's kv_events.
func kvEventsOf(s *controlv1.WorkerStatus) (KVEvents, error) {
	k := s.GetKvEvents()
	if k == nil || k.GetEndpoint() == "" {
		if k.GetReplayEndpoint() != "" || k.GetTopic() != "" {
			return KVEvents{}, fmt.Errorf("kv_events.endpoint: %w: a replay endpoint or topic without an endpoint", ErrInvalidKVEvents)
		}
		return KVEvents{}, nil
	}
	ep, err := KVEndpoint(k.GetEndpoint(), s.GetHttpAddress())
	if err != nil {
		return KVEvents{}, fmt.Errorf("kv_events.endpoint: %w", err)
	}
	replay, err := KVEndpoint(k.GetReplayEndpoint(), s.GetHttpAddress())
	if err != nil {
		return KVEvents{}, fmt.Errorf("kv_events.replay_endpoint: %w", err)
	}
	if len(k.GetTopic()) > MaxKVTopic {
		return KVEvents{}, fmt.Errorf("kv_events.topic: %w: longer than %d bytes", ErrInvalidKVEvents, MaxKVTopic)
	}
	return KVEvents{Endpoint: ep, Replay: replay, Topic: k.GetTopic()}, nil
}
