package discovery_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tlgate/tlgate/enginesim"
)

// kubeWithin bounds every wait for the gateway to follow the API server
// (generous for a busy machine; each change is normally followed within a
// few probe intervals, and the test logs how long the scale steps took).
const kubeWithin = 20 * time.Second

// ep is one endpoint a test puts in an EndpointSlice: the engine's
// address, its pod and its conditions.
type ep struct {
	ip, pod                     string
	ready, serving, terminating bool
}

func sliceOf(ns, name, service string, port int, eps ...ep) *discoveryv1.EndpointSlice {
	portName, p := "http", int32(port)
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"kubernetes.io/service-name": service}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &portName, Port: &p}},
	}
	for _, e := range eps {
		ready, serving, terminating := e.ready, e.serving, e.terminating
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{e.ip},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready, Serving: &serving, Terminating: &terminating},
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: e.pod},
		})
	}
	return s
}

// readyEPs are the ready endpoints of engines[from:to], pods vllm-i.
func readyEPs(engines []*enginesim.Engine, from, to int) []ep {
	var out []ep
	for i := from; i < to; i++ {
		ip := strings.Split(engines[i].HTTPAddr(), ":")[0]
		out = append(out, ep{ip: ip, pod: fmt.Sprintf("vllm-%d", i), ready: true, serving: true})
	}
	return out
}

// TestDiscoveryKubernetesEndpointSlices runs a gateway whose discovery
// watches a Service's EndpointSlices in two namespaces of a real
// kube-apiserver, as its shipped ServiceAccount and Role: ready endpoints
// become routable workers, not-ready and terminating ones drain, deleted
// ones are evicted, a scale from 2 to 5 to 1 is followed, and the informer
// recovers from an API server restart.
func TestDiscoveryKubernetesEndpointSlices(t *testing.T) {
	k := startKube(t)
	token := applyRBAC(t, k, "inf-a", "inf-b")
	checkLeastPrivilege(t, k, token, "inf-a", gatewayNS)
	engines, port := enginesOnOnePort(t, 5, "kube-es")
	slices := k.Admin.DiscoveryV1().EndpointSlices("inf-a")

	if _, err := slices.Create(k.ctx(), sliceOf("inf-a", "vllm-abc", "vllm", port, readyEPs(engines, 0, 2)...), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	other := readyEPs(engines, 4, 5)
	if _, err := slices.Create(k.ctx(), sliceOf("inf-a", "other-abc", "other", port, other...), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := k.Admin.DiscoveryV1().EndpointSlices("inf-b").Create(k.ctx(), sliceOf("inf-b", "vllm-xyz", "vllm", port, readyEPs(engines, 2, 3)...), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	gw := startGateway(t, fmt.Sprintf(`
[[gateway.discovery]]
name = "es"
kind = "kubernetes"
kubeconfig = %q
namespaces = ["inf-a", "inf-b"]
service = "vllm"
port = "http"
engine_kind = "vllm"
probe_interval = "50ms"
`, k.kubeconfig(token)))

	id := func(ns string, i int) string { return fmt.Sprintf("es:%s:vllm-%d", ns, i) }
	waitStates(t, gw, "es:", map[string]string{id("inf-a", 0): "routable", id("inf-a", 1): "routable", id("inf-b", 2): "routable"}, kubeWithin)
	if code, body := complete(t, gw, "kube-es"); code != http.StatusOK {
		t.Fatalf("completion over discovered engines: %d %s", code, body)
	}

	update := func(ns string, s *discoveryv1.EndpointSlice) {
		t.Helper()
		cur, err := k.Admin.DiscoveryV1().EndpointSlices(ns).Get(k.ctx(), s.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		s.ResourceVersion = cur.ResourceVersion
		if _, err := k.Admin.DiscoveryV1().EndpointSlices(ns).Update(k.ctx(), s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// vllm-0 terminates (not ready, still serving, terminating); vllm-1
	// fails its readiness: both drain.
	eps := readyEPs(engines, 0, 2)
	eps[0].ready, eps[0].terminating = false, true
	eps[1].ready, eps[1].serving = false, false
	update("inf-a", sliceOf("inf-a", "vllm-abc", "vllm", port, eps...))
	waitStates(t, gw, "es:", map[string]string{id("inf-a", 0): "draining", id("inf-a", 1): "draining", id("inf-b", 2): "routable"}, kubeWithin)
	for range 3 {
		if code, body := complete(t, gw, "kube-es"); code != http.StatusOK {
			t.Fatalf("completion with two draining: %d %s", code, body)
		}
	}

	// vllm-0 is gone from its slice, inf-b's slice is deleted: evicted.
	update("inf-a", sliceOf("inf-a", "vllm-abc", "vllm", port, eps[1]))
	if err := k.Admin.DiscoveryV1().EndpointSlices("inf-b").Delete(k.ctx(), "vllm-xyz", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitStates(t, gw, "es:", map[string]string{id("inf-a", 1): "draining"}, kubeWithin)

	// Scale 2 → 5 → 1.
	scale := func(n int) {
		t.Helper()
		start := time.Now()
		update("inf-a", sliceOf("inf-a", "vllm-abc", "vllm", port, readyEPs(engines, 0, n)...))
		want := map[string]string{}
		for i := range n {
			want[id("inf-a", i)] = "routable"
		}
		waitStates(t, gw, "es:", want, kubeWithin)
		t.Logf("scale to %d followed in %v", n, time.Since(start).Round(time.Millisecond))
	}
	scale(2)
	scale(5)
	scale(1)

	// The API server restarts: the last engines stay, and changes made
	// after it is back are followed.
	k.restart()
	waitStates(t, gw, "es:", map[string]string{id("inf-a", 0): "routable"}, kubeWithin)
	start := time.Now()
	scale(3)
	t.Logf("after the API server restart, the first change was followed in %v", time.Since(start).Round(time.Millisecond))
}
