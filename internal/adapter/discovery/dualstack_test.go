package discovery

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/rs/zerolog"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tlgate/tlgate/internal/adapter/config"
)

// TestDualStackEndpointSliceStable: a dual-stack Service lists each pod
// in an IPv4 slice and an IPv6 slice. Whatever order the informers list
// them in, each pod is one engine under its pod key, always at its IPv4
// address, routable while either listing says ready; with only the IPv6
// slice left it is at its IPv6 address.
func TestDualStackEndpointSliceStable(t *testing.T) {
	k, err := newKubernetes(config.Discovery{Name: "k", Service: "vllm", Port: "8000", Namespaces: []string{"ns"}}, zerolog.Nop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	yes, no := true, false
	slice := func(name string, family discoveryv1.AddressType, addr func(i int) string, ready *bool) *discoveryv1.EndpointSlice {
		s := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}, AddressType: family}
		for i := range 3 {
			s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{
				Addresses:  []string{addr(i)},
				Conditions: discoveryv1.EndpointConditions{Ready: ready},
				TargetRef:  &corev1.ObjectReference{Kind: "Pod", Name: fmt.Sprintf("vllm-%d", i)},
			})
		}
		return s
	}
	v4 := slice("vllm-v4", discoveryv1.AddressTypeIPv4, func(i int) string { return fmt.Sprintf("10.0.0.%d", i+1) }, &yes)
	v6 := slice("vllm-v6", discoveryv1.AddressTypeIPv6, func(i int) string { return fmt.Sprintf("fd00::%d", i+1) }, &yes)
	v6late := slice("vllm-v6", discoveryv1.AddressTypeIPv6, func(i int) string { return fmt.Sprintf("fd00::%d", i+1) }, &no)

	check := func(what string, objs []any, wantAddr func(i int) string, wantDraining bool) {
		t.Helper()
		for range 20 {
			rand.Shuffle(len(objs), func(i, j int) { objs[i], objs[j] = objs[j], objs[i] })
			got := k.endpoints(objs)
			if len(got) != 3 {
				t.Fatalf("%s: %d endpoints %+v, want one per pod", what, len(got), got)
			}
			for i, ep := range got {
				want := Endpoint{Key: fmt.Sprintf("ns:vllm-%d", i), Address: wantAddr(i), Draining: wantDraining}
				if ep != want {
					t.Fatalf("%s: endpoint %d is %+v, want %+v", what, i, ep, want)
				}
			}
		}
	}
	ipv4 := func(i int) string { return fmt.Sprintf("10.0.0.%d:8000", i+1) }
	ipv6 := func(i int) string { return fmt.Sprintf("[fd00::%d]:8000", i+1) }
	check("both families", []any{v4, v6}, ipv4, false)
	check("IPv6 slice not ready yet", []any{v4, v6late}, ipv4, false)
	check("IPv6 slice alone", []any{v6}, ipv6, false)
}
