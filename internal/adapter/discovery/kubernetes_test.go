package discovery

import (
	"testing"

	"github.com/rs/zerolog"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tlgate/tlgate/internal/adapter/config"
)

// TestDiscoveryTerminatingReadyDrains: an EndpointSlice endpoint that is
// terminating drains even while its ready condition is true (what a
// Service with publishNotReadyAddresses publishes during a pod's
// shutdown); ready and not terminating it is routable, not ready it
// drains, and an absent ready condition counts as ready.
func TestDiscoveryTerminatingReadyDrains(t *testing.T) {
	k := &Kubernetes{cfg: config.Discovery{Name: "k", Kind: config.DiscoveryKubernetes, Port: "8000", Service: "vllm"},
		log: zerolog.Nop(), warned: map[string]bool{}}
	yes, no := true, false
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: "vllm-abc"},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"10.0.0.1"}, Conditions: discoveryv1.EndpointConditions{Ready: &yes, Terminating: &yes}},
			{Addresses: []string{"10.0.0.2"}, Conditions: discoveryv1.EndpointConditions{Ready: &yes, Terminating: &no}},
			{Addresses: []string{"10.0.0.3"}, Conditions: discoveryv1.EndpointConditions{Ready: &no, Terminating: &yes}},
			{Addresses: []string{"10.0.0.4"}, Conditions: discoveryv1.EndpointConditions{Ready: &no}},
			{Addresses: []string{"10.0.0.5"}},
		},
	}
	want := "ns:10.0.0.1-8000=draining;ns:10.0.0.2-8000=routable;ns:10.0.0.3-8000=draining;ns:10.0.0.4-8000=draining;ns:10.0.0.5-8000=routable;"
	if got := states(k.endpoints([]any{slice})); got != want {
		t.Fatalf("endpoints %s, want %s", got, want)
	}
}
