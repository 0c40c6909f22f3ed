package discovery_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tlgate/tlgate/enginesim"
)

// podState is what a test sets of a pod, as the kubelet would.
type podState struct {
	ready bool
}

// TestDiscoveryKubernetesPods runs a gateway whose discovery watches the
// Pods matching a label selector in a real kube-apiserver, as its shipped
// ServiceAccount and Role, taking the model and the role from pod labels:
// Ready pods become routable workers of the labelled model and role, a
// not-Ready pod and a pod being deleted drain, a deleted pod is evicted, a
// pod with an unknown role is skipped, a scale from 2 to 5 to 1 is
// followed, and the informer recovers from an API server restart.
func TestDiscoveryKubernetesPods(t *testing.T) {
	k := startKube(t)
	const ns = "inf-p"
	token := applyRBAC(t, k, ns)
	checkLeastPrivilege(t, k, token, ns, gatewayNS)
	engines := localEngines(t, 5, "kube-pods")
	pods := k.Admin.CoreV1().Pods(ns)

	// create makes pod sim-i for engines[i] (labels on top of the
	// selector's) and sets its status as the kubelet would.
	create := func(i int, extra map[string]string, st podState) {
		t.Helper()
		labels := map[string]string{"app": "sglang-sim", "tlgate.io/model": "kube-pods"}
		for k, v := range extra {
			labels[k] = v
		}
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("sim-%d", i), Namespace: ns, Labels: labels},
			Spec: corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Name: "engine", Image: "enginesim",
				Ports: []corev1.ContainerPort{{Name: "serve", ContainerPort: int32(enginePort(t, engines[i]))}}}}},
		}
		p, err := pods.Create(k.ctx(), p, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		setStatus(t, k, p, engines[i], st)
	}
	id := func(i int) string { return fmt.Sprintf("pods:%s:sim-%d", ns, i) }

	create(0, nil, podState{ready: true})
	create(1, nil, podState{ready: true})
	create(2, map[string]string{"tlgate.io/role": "decode"}, podState{ready: true})
	create(3, map[string]string{"tlgate.io/role": "sideways"}, podState{ready: true})
	create(4, map[string]string{"app": "something-else"}, podState{ready: true})

	gw := startGateway(t, fmt.Sprintf(`
[[gateway.discovery]]
name = "pods"
kind = "kubernetes"
kubeconfig = %q
namespaces = [%q]
selector = "app=sglang-sim"
port = "serve"
engine_kind = "sglang"
model_label = "tlgate.io/model"
role_label = "tlgate.io/role"
probe_interval = "50ms"
`, k.kubeconfig(token), ns))

	waitStates(t, gw, "pods:", map[string]string{id(0): "routable", id(1): "routable", id(2): "routable"}, kubeWithin)
	ws := workers(t, gw)
	if w := ws[id(0)]; w.Model != "kube-pods" || w.Role != "unified" {
		t.Errorf("%s: model %q role %q, want kube-pods unified", id(0), w.Model, w.Role)
	}
	if w := ws[id(2)]; w.Role != "decode" {
		t.Errorf("%s: role %q, want decode (its label)", id(2), w.Role)
	}
	if code, body := complete(t, gw, "kube-pods"); code != http.StatusOK {
		t.Fatalf("completion over discovered pods: %d %s", code, body)
	}

	// sim-1 fails its readiness; sim-0 is being deleted (the kubelet has
	// not confirmed yet): both drain. sim-2 is deleted at once: evicted.
	p1, err := pods.Get(k.ctx(), "sim-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	setStatus(t, k, p1, engines[1], podState{ready: false})
	if err := pods.Delete(k.ctx(), "sim-0", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	forceDelete(t, k, ns, "sim-2")
	waitStates(t, gw, "pods:", map[string]string{id(0): "draining", id(1): "draining"}, kubeWithin)
	for _, name := range []string{"sim-0", "sim-1", "sim-3", "sim-4"} {
		forceDelete(t, k, ns, name)
	}
	waitStates(t, gw, "pods:", map[string]string{}, kubeWithin)

	// Scale 2 → 5 → 1 (pods created ready, deleted outright).
	have := 0
	scale := func(n int) {
		t.Helper()
		start := time.Now()
		for i := have; i < n; i++ {
			create(i, nil, podState{ready: true})
		}
		for i := n; i < have; i++ {
			forceDelete(t, k, ns, fmt.Sprintf("sim-%d", i))
		}
		have = n
		want := map[string]string{}
		for i := range n {
			want[id(i)] = "routable"
		}
		waitStates(t, gw, "pods:", want, kubeWithin)
		t.Logf("scale to %d followed in %v", n, time.Since(start).Round(time.Millisecond))
	}
	scale(2)
	scale(5)
	scale(1)

	k.restart()
	waitStates(t, gw, "pods:", map[string]string{id(0): "routable"}, kubeWithin)
	scale(3)
}

// setStatus gives pod p engine e's address and the Ready condition of st,
// as the kubelet would.
func setStatus(t *testing.T, k *kube, p *corev1.Pod, e *enginesim.Engine, st podState) {
	t.Helper()
	ip := strings.Split(e.HTTPAddr(), ":")[0]
	ready := corev1.ConditionFalse
	if st.ready {
		ready = corev1.ConditionTrue
	}
	p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: ready, LastTransitionTime: metav1.Now()}}}
	if _, err := k.Admin.CoreV1().Pods(p.Namespace).UpdateStatus(k.ctx(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// forceDelete deletes a pod at once (grace period 0), as the kubelet's
// confirmation would.
func forceDelete(t *testing.T, k *kube, ns, name string) {
	t.Helper()
	zero := int64(0)
	if err := k.Admin.CoreV1().Pods(ns).Delete(k.ctx(), name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
}
