package proxy

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/tlgate/tlgate/internal/routing/fleet"
)

// TestDialControlRefusesTheResolvedAddress: the proxy checks the address a
// dial resolved to, so an engine named by a host name ("localhost" here)
// that resolves outside engine_networks is never connected to; the attempt
// fails over as refused and names the address.
func TestDialControlRefusesTheResolvedAddress(t *testing.T) {
	var reached atomic.Bool
	srv := upstream(t, func(w http.ResponseWriter, r *http.Request) {
		reached.Store(true)
		_, _ = io.WriteString(w, `{"choices":[{"text":"hi"}]}`)
	})
	url := strings.Replace(srv.URL, "127.0.0.1", "localhost", 1)
	policy := fleet.NewAddressPolicy([]netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")})
	p := newProxy(t, Options{DialControl: policy.DialControl})
	_, err := p.Fetch(context.Background(), Attempt{URL: url, Body: []byte(`{}`)})
	if !errors.Is(err, fleet.ErrRefusedAddress) || !IsRetryable(err) || reached.Load() {
		t.Fatalf("Fetch = %v (reason %q, reached %v), want a retryable refusal wrapping ErrRefusedAddress", err, ReasonOf(err), reached.Load())
	}
	if !strings.Contains(err.Error(), "engine_networks") {
		t.Errorf("error %q does not say why", err)
	}
	// Without a policy the same engine answers.
	p = newProxy(t, Options{})
	if _, err := p.Fetch(context.Background(), Attempt{URL: url, Body: []byte(`{}`)}); err != nil || !reached.Load() {
		t.Fatalf("without a policy: %v (reached %v)", err, reached.Load())
	}
}
