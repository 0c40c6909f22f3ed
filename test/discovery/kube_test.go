package discovery_test

import (
	"fmt"
	"net"
	"net/http"
	"strconv"
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

// readyEP is the ready endpoint of engines[i], pod vllm-i.
func readyEP(engines []*enginesim.Engine, i int) ep {
	ip := strings.Split(engines[i].HTTPAddr(), ":")[0]
	return ep{ip: ip, pod: fmt.Sprintf("vllm-%d", i), ready: true, serving: true}
}

// enginePort is engines[i]'s port.
func enginePort(t *testing.T, e *enginesim.Engine) int {
	t.Helper()
	_, p, _ := net.SplitHostPort(e.HTTPAddr())
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// localEngines starts n engines serving model on the machine's first
// non-loopback IPv4 address (the API server refuses loopback endpoint
// addresses), each on a port of its own.
func localEngines(t *testing.T, n int, model string) []*enginesim.Engine {
	t.Helper()
	var host string
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil && !ipn.IP.IsLoopback() && !ipn.IP.IsLinkLocalUnicast() {
			host = ipn.IP.String()
			break
		}
	}
	if host == "" {
		t.Fatal("no non-loopback IPv4 address: the API server refuses loopback endpoint and pod addresses")
	}
	var es []*enginesim.Engine
	for range n {
		e, err := startEngine(t, net.JoinHostPort(host, "0"), model)
		if err != nil {
			t.Fatal(err)
		}
		es = append(es, e)
	}
	return es
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
	engines := localEngines(t, 5, "kube-es")
	// One slice per engine: each engine has a port of its own, and a
	// slice's endpoints share its ports.
	put := func(ns string, i int, e ep) {
		t.Helper()
		s := sliceOf(ns, fmt.Sprintf("vllm-%d", i), "vllm", enginePort(t, engines[i]), e)
		c := k.Admin.DiscoveryV1().EndpointSlices(ns)
		cur, err := c.Get(k.ctx(), s.Name, metav1.GetOptions{})
		if err == nil {
			s.ResourceVersion = cur.ResourceVersion
			_, err = c.Update(k.ctx(), s, metav1.UpdateOptions{})
		} else {
			_, err = c.Create(k.ctx(), s, metav1.CreateOptions{})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	del := func(ns string, i int) {
		t.Helper()
		if err := k.Admin.DiscoveryV1().EndpointSlices(ns).Delete(k.ctx(), fmt.Sprintf("vllm-%d", i), metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	put("inf-a", 0, readyEP(engines, 0))
	put("inf-a", 1, readyEP(engines, 1))
	put("inf-b", 2, readyEP(engines, 2))
	other := sliceOf("inf-a", "other-abc", "other", enginePort(t, engines[4]), readyEP(engines, 4))
	if _, err := k.Admin.DiscoveryV1().EndpointSlices("inf-a").Create(k.ctx(), other, metav1.CreateOptions{}); err != nil {
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

	// vllm-0 terminates (not ready, still serving, terminating); vllm-1
	// fails its readiness: both drain.
	e0, e1 := readyEP(engines, 0), readyEP(engines, 1)
	e0.ready, e0.terminating = false, true
	e1.ready, e1.serving = false, false
	put("inf-a", 0, e0)
	put("inf-a", 1, e1)
	waitStates(t, gw, "es:", map[string]string{id("inf-a", 0): "draining", id("inf-a", 1): "draining", id("inf-b", 2): "routable"}, kubeWithin)
	for range 3 {
		if code, body := complete(t, gw, "kube-es"); code != http.StatusOK {
			t.Fatalf("completion with two draining: %d %s", code, body)
		}
	}

	// vllm-0's and inf-b's slices are deleted: evicted.
	del("inf-a", 0)
	del("inf-b", 2)
	waitStates(t, gw, "es:", map[string]string{id("inf-a", 1): "draining"}, kubeWithin)

	// Scale 2 → 5 → 1.
	have := 2
	scale := func(n int) {
		t.Helper()
		start := time.Now()
		for i := range n {
			put("inf-a", i, readyEP(engines, i))
		}
		for i := n; i < have; i++ {
			del("inf-a", i)
		}
		have = n
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
	scale(3)
}
