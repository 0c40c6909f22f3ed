package discovery

import (
	"bytes"
	"strings"
	"testing"

	"github.com/rs/zerolog"
	corev1 "k8s.io/api/core/v1"
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

// TestDiscoveryKubernetesUnmatchedPortLogged: a port name that matches no
// port of the watched EndpointSlices or pods yields no engines; that is
// logged once for the source, naming the configured port and the ports
// there are, however many events repeat it.
func TestDiscoveryKubernetesUnmatchedPortLogged(t *testing.T) {
	ready := true
	ptr := func(s string) *string { return &s }
	num := func(n int32) *int32 { return &n }
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: "vllm-abc"},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("api"), Port: num(8000)}, {Name: ptr("metrics"), Port: num(9090)}},
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.0.0.1"}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "vllm-0"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Ports: []corev1.ContainerPort{{Name: "api", ContainerPort: 8000}}}}},
		Status:     corev1.PodStatus{PodIP: "10.0.0.2", Phase: corev1.PodRunning},
	}
	for _, tt := range []struct {
		name  string
		cfg   config.Discovery
		obj   any
		ports string
	}{
		{"service", config.Discovery{Name: "k", Port: "http", Service: "vllm", Namespaces: []string{"ns"}}, slice, `"ports":["api:8000","metrics:9090"]`},
		{"selector", config.Discovery{Name: "k", Port: "http", Selector: "app=vllm", Namespaces: []string{"ns"}}, pod, `"ports":["api:8000"]`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			k, err := newKubernetes(tt.cfg, zerolog.New(&buf), nil)
			if err != nil {
				t.Fatal(err)
			}
			for range 5 {
				if got := k.endpoints([]any{tt.obj}); len(got) != 0 {
					t.Fatalf("endpoints %+v, want none", got)
				}
			}
			lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
			if len(lines) != 1 || !strings.Contains(lines[0], `"port":"http"`) || !strings.Contains(lines[0], tt.ports) {
				t.Fatalf("logged %q; want one line naming port http and %s", lines, tt.ports)
			}
		})
	}
}
