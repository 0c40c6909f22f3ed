package discovery_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/dynamic"

	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/adapter/discovery"
	"github.com/tlgate/tlgate/internal/testkit/kubeapi"
)

// poolCRD is the InferencePool CRD of the Gateway API Inference Extension
// (deploy/testdata/crds/README.md says which release).
const poolCRD = "../../deploy/testdata/crds/inference.networking.k8s.io_inferencepools.yaml"

// poolKube is an apiserver with the InferencePool CRD installed, and the
// calls the InferencePool tests make of it.
type poolKube struct {
	*kube
	a  *kubeapi.Applier
	ns string
}

// startPoolKube starts the apiserver, installs the CRD and creates the
// namespaces (the gateway's and ns).
func startPoolKube(t *testing.T, ns string) *poolKube {
	t.Helper()
	k := startKube(t)
	a := k.Applier(kubeapi.AdminToken)
	a.InstallCRDs(poolCRD)
	k.CreateNamespaces(gatewayNS, ns)
	return &poolKube{kube: k, a: a, ns: ns}
}

// poolToken makes the gateway's ServiceAccount and binds it, in the pool's
// namespace, to the least privilege an inferencepool source needs (as the
// Helm chart's Role grants it): list and watch on the pool by name and on
// Pods. It checks the token can do that and no more, and returns it.
func (k *poolKube) poolToken(t *testing.T, pool string) string {
	t.Helper()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "tlgate", Namespace: gatewayNS}}
	if _, err := k.Admin.CoreV1().ServiceAccounts(gatewayNS).Create(k.ctx(), sa, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	gvr := discovery.InferencePoolResource
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "tlgate-discovery", Namespace: k.ns}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{gvr.Group}, Resources: []string{gvr.Resource}, ResourceNames: []string{pool}, Verbs: []string{"list", "watch"}},
	}}
	if _, err := k.Admin.RbacV1().Roles(k.ns).Create(k.ctx(), role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "tlgate-discovery", Namespace: k.ns},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa.Name, Namespace: gatewayNS}}}
	if _, err := k.Admin.RbacV1().RoleBindings(k.ns).Create(k.ctx(), rb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	k.AwaitAllowed(t, gatewayNS, sa.Name, authorizationv1.ResourceAttributes{Namespace: k.ns, Group: gvr.Group, Resource: gvr.Resource, Name: pool, Verb: "list"})
	token := k.Token(gatewayNS, sa.Name)
	checkPoolPrivilege(t, k.kube, token, k.ns, pool)
	return token
}

// checkPoolPrivilege: token may list and watch pool (by name, as the
// source asks) and Pods in ns, and may not list every pool, another pool,
// or pools elsewhere.
func checkPoolPrivilege(t *testing.T, k *kube, token, ns, pool string) {
	t.Helper()
	dyn, err := dynamic.NewForConfig(k.rest(token))
	if err != nil {
		t.Fatal(err)
	}
	pools := dyn.Resource(discovery.InferencePoolResource)
	byName := func(name string) metav1.ListOptions {
		return metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()}
	}
	if _, err := pools.Namespace(ns).List(k.ctx(), byName(pool)); err != nil {
		t.Errorf("the gateway's ServiceAccount cannot list its InferencePool by name: %v", err)
	}
	w, err := pools.Namespace(ns).Watch(k.ctx(), byName(pool))
	if err != nil {
		t.Errorf("the gateway's ServiceAccount cannot watch its InferencePool by name: %v", err)
	} else {
		w.Stop()
	}
	for what, list := range map[string]func() error{
		"list every InferencePool": func() error { _, err := pools.Namespace(ns).List(k.ctx(), metav1.ListOptions{}); return err },
		"list another InferencePool": func() error {
			_, err := pools.Namespace(ns).List(k.ctx(), byName(pool+"-other"))
			return err
		},
		"list InferencePools elsewhere": func() error { _, err := pools.Namespace(gatewayNS).List(k.ctx(), byName(pool)); return err },
	} {
		if err := list(); !apierrors.IsForbidden(err) {
			t.Errorf("the gateway's ServiceAccount may %s (err %v), want forbidden", what, err)
		}
	}
}

// putPool creates or updates InferencePool name: pods matching selector,
// on ports.
func (k *poolKube) putPool(t *testing.T, name string, selector map[string]string, ports ...int) {
	t.Helper()
	sel := map[string]any{}
	for key, v := range selector {
		sel[key] = v
	}
	var tp []any
	for _, p := range ports {
		tp = append(tp, map[string]any{"number": int64(p)})
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
		"metadata": map[string]any{"name": name, "namespace": k.ns},
		"spec":     map[string]any{"selector": map[string]any{"matchLabels": sel}, "targetPorts": tp},
	}}
	if err := k.a.Apply(u, k.ns, false); err != nil {
		t.Fatal(err)
	}
}

// pod creates pod name for engine e with labels, Ready, as the kubelet
// would report it.
func (k *poolKube) pod(t *testing.T, name string, e *enginesim.Engine, labels map[string]string) {
	t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: k.ns, Labels: labels},
		Spec:       corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Name: "vllm", Image: "vllm"}}},
	}
	p, err := k.Admin.CoreV1().Pods(k.ns).Create(k.ctx(), p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	setStatus(t, k.kube, p, e, podState{ready: true})
}

// poolConfig is a [[gateway.discovery]] inferencepool source named "pool"
// for pool in ns, reached with token.
func poolConfig(k *poolKube, token, pool string) string {
	return fmt.Sprintf(`
[[gateway.discovery]]
name = "pool"
kind = "inferencepool"
kubeconfig = %q
namespaces = [%q]
pool = %q
engine_kind = "sglang"
role_label = "tlgate.io/role"
probe_interval = "50ms"
`, k.kubeconfig(token), k.ns, pool)
}

// TestDiscoveryInferencePool runs a gateway serving an InferencePool of a
// real kube-apiserver, as a ServiceAccount granted only the pool (by name)
// and Pods: the pods its selector picks become workers on its target port
// (a pod's role from its label), requests are routed to them, a pod the
// selector does not pick is left alone, a pod being deleted drains, a
// deleted pod is forgotten, and a pool deleted takes its engines with it.
func TestDiscoveryInferencePool(t *testing.T) {
	const ns, pool, model = "inf-pool", "vllm-llama", "pool-model"
	k := startPoolKube(t, ns)
	token := k.poolToken(t, pool)
	engines, port := enginesOnOnePort(t, 4, model)
	id := func(i int) string { return fmt.Sprintf("pool:%s:vllm-%d:%d", ns, i, port) }

	k.putPool(t, pool, map[string]string{"app": "vllm"}, port)
	k.pod(t, "vllm-0", engines[0], map[string]string{"app": "vllm"})
	k.pod(t, "vllm-1", engines[1], map[string]string{"app": "vllm"})
	k.pod(t, "vllm-2", engines[2], map[string]string{"app": "vllm", "tlgate.io/role": "decode"})
	k.pod(t, "vllm-3", engines[3], map[string]string{"app": "sglang"})

	gw := startGateway(t, poolConfig(k, token, pool))
	waitStates(t, gw, "pool:", map[string]string{id(0): "routable", id(1): "routable", id(2): "routable"}, kubeWithin)
	ws := workers(t, gw)
	if w := ws[id(0)]; w.Model != model || w.Role != "unified" || !strings.HasSuffix(w.HTTPAddress, fmt.Sprintf("127.0.0.2:%d", port)) {
		t.Errorf("%s: model %q role %q address %q, want %s unified on the pod's IP and the pool's port", id(0), w.Model, w.Role, w.HTTPAddress, model)
	}
	if w := ws[id(2)]; w.Role != "decode" {
		t.Errorf("%s: role %q, want decode (its label)", id(2), w.Role)
	}
	// Requests go to the pool's unified pods, never to the pod it does not
	// pick.
	for range 6 {
		if code, body := complete(t, gw, model); code != http.StatusOK {
			t.Fatalf("completion over the pool's pods: %d %s", code, body)
		}
	}
	if n := engines[0].Stats().Requests + engines[1].Stats().Requests; n != 6 {
		t.Errorf("the pool's unified pods served %d of 6 requests", n)
	}
	if n := engines[3].Stats().Requests; n != 0 {
		t.Errorf("the pod the pool's selector does not pick served %d requests", n)
	}

	// vllm-0 is being deleted (the kubelet has not confirmed yet): it
	// drains and takes nothing new; vllm-1 is deleted outright: forgotten.
	pods := k.Admin.CoreV1().Pods(ns)
	if err := pods.Delete(k.ctx(), "vllm-0", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	forceDelete(t, k.kube, ns, "vllm-1")
	waitStates(t, gw, "pool:", map[string]string{id(0): "draining", id(2): "routable"}, kubeWithin)
	before := engines[0].Stats().Requests
	k.pod(t, "vllm-4", engines[1], map[string]string{"app": "vllm"})
	id4 := fmt.Sprintf("pool:%s:vllm-4:%d", ns, port)
	waitStates(t, gw, "pool:", map[string]string{id(0): "draining", id(2): "routable", id4: "routable"}, kubeWithin)
	for range 4 {
		if code, body := complete(t, gw, model); code != http.StatusOK {
			t.Fatalf("completion with one pod draining: %d %s", code, body)
		}
	}
	if n := engines[0].Stats().Requests; n != before {
		t.Errorf("the draining pod was sent %d new requests", n-before)
	}

	// The pool deleted: no engines; created again: its pods are back.
	if err := k.a.Dynamic().Resource(discovery.InferencePoolResource).Namespace(ns).Delete(k.ctx(), pool, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitStates(t, gw, "pool:", map[string]string{}, kubeWithin)
	k.putPool(t, pool, map[string]string{"app": "vllm"}, port)
	waitStates(t, gw, "pool:", map[string]string{id(0): "draining", id(2): "routable", id4: "routable"}, kubeWithin)
}

// TestDiscoveryInferencePoolSelectorChange: a change to an InferencePool's
// selector moves the gateway's fleet to the pods it now picks (those it no
// longer picks are forgotten), a change to its target ports moves the
// engines to the new port, and a pod relabelled into the selection joins.
func TestDiscoveryInferencePoolSelectorChange(t *testing.T) {
	const ns, pool, model = "inf-pool-sel", "vllm-pool", "pool-sel"
	k := startPoolKube(t, ns)
	token := k.poolToken(t, pool)
	engines, port := enginesOnOnePort(t, 5, model)
	engines2, port2 := enginesOnOnePort(t, 5, model) // the same IPs, another port
	id := func(name string, p int) string { return fmt.Sprintf("pool:%s:%s:%d", ns, name, p) }

	k.putPool(t, pool, map[string]string{"app": "vllm", "track": "blue"}, port)
	for i, name := range []string{"blue-0", "blue-1", "green-0", "green-1", "canary-0"} {
		track := strings.Split(name, "-")[0]
		k.pod(t, name, engines[i], map[string]string{"app": "vllm", "track": track})
	}
	gw := startGateway(t, poolConfig(k, token, pool))
	waitStates(t, gw, "pool:", map[string]string{id("blue-0", port): "routable", id("blue-1", port): "routable"}, kubeWithin)
	if code, body := complete(t, gw, model); code != http.StatusOK {
		t.Fatalf("completion on blue: %d %s", code, body)
	}

	// The pool now picks green: blue is forgotten, green found.
	k.putPool(t, pool, map[string]string{"app": "vllm", "track": "green"}, port)
	waitStates(t, gw, "pool:", map[string]string{id("green-0", port): "routable", id("green-1", port): "routable"}, kubeWithin)
	blue := engines[0].Stats().Requests + engines[1].Stats().Requests
	green := engines[2].Stats().Requests + engines[3].Stats().Requests
	for range 4 {
		if code, body := complete(t, gw, model); code != http.StatusOK {
			t.Fatalf("completion on green: %d %s", code, body)
		}
	}
	if n := engines[0].Stats().Requests + engines[1].Stats().Requests - blue; n != 0 {
		t.Errorf("pods the pool no longer picks served %d requests", n)
	}
	if n := engines[2].Stats().Requests + engines[3].Stats().Requests - green; n != 4 {
		t.Errorf("the pods the pool now picks served %d of 4 requests", n)
	}

	// The pool's target port changes: the engines move to it.
	k.putPool(t, pool, map[string]string{"app": "vllm", "track": "green"}, port2)
	waitStates(t, gw, "pool:", map[string]string{id("green-0", port2): "routable", id("green-1", port2): "routable"}, kubeWithin)
	for range 4 {
		if code, body := complete(t, gw, model); code != http.StatusOK {
			t.Fatalf("completion on the new port: %d %s", code, body)
		}
	}
	if n := engines2[2].Stats().Requests + engines2[3].Stats().Requests; n != 4 {
		t.Errorf("the engines on the pool's new port served %d of 4 requests", n)
	}

	// canary-0 is relabelled green: it joins.
	p, err := k.Admin.CoreV1().Pods(ns).Get(k.ctx(), "canary-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Labels["track"] = "green"
	if _, err := k.Admin.CoreV1().Pods(ns).Update(k.ctx(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitStates(t, gw, "pool:", map[string]string{id("green-0", port2): "routable", id("green-1", port2): "routable", id("canary-0", port2): "routable"}, kubeWithin)
}
