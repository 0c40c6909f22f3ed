package discovery

import (
	"errors"
	"maps"
	"slices"
	"testing"

	"github.com/rs/zerolog"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/tlgate/tlgate/internal/adapter/config"
)

func pool(spec map[string]any) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
		"metadata": map[string]any{"name": "p", "namespace": "inf"},
		"spec":     spec,
	}}
}

func TestParsePool(t *testing.T) {
	sel := map[string]any{"matchLabels": map[string]any{"app": "vllm", "tier": "gpu"}}
	tests := []struct {
		name  string
		spec  map[string]any
		want  poolSpec
		error error
	}{
		{"one port", map[string]any{"selector": sel, "targetPorts": []any{map[string]any{"number": int64(8000)}}},
			poolSpec{selector: labels.Set{"app": "vllm", "tier": "gpu"}, ports: []int{8000}}, nil},
		{"ports in order, each once, out of range dropped", map[string]any{"selector": sel, "targetPorts": []any{
			map[string]any{"number": int64(8001)}, map[string]any{"number": int64(8000)}, map[string]any{"number": int64(8001)},
			map[string]any{"number": int64(0)}, map[string]any{"number": int64(70000)}, "junk"}},
			poolSpec{selector: labels.Set{"app": "vllm", "tier": "gpu"}, ports: []int{8001, 8000}}, nil},
		{"no selector", map[string]any{"targetPorts": []any{map[string]any{"number": int64(8000)}}}, poolSpec{}, ErrPoolSelector},
		{"empty selector", map[string]any{"selector": map[string]any{"matchLabels": map[string]any{}}, "targetPorts": []any{map[string]any{"number": int64(8000)}}}, poolSpec{}, ErrPoolSelector},
		{"no ports", map[string]any{"selector": sel}, poolSpec{}, ErrPoolPorts},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parsePool(pool(tc.spec))
			if !errors.Is(err, tc.error) {
				t.Fatalf("error %v, want %v", err, tc.error)
			}
			if !labelsEqual(got.selector, tc.want.selector) || !slices.Equal(got.ports, tc.want.ports) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
	if _, err := parsePool(pool(map[string]any{"selector": map[string]any{"matchLabels": "app=vllm"}})); err == nil {
		t.Error("a selector that is not a map parsed")
	}
}

func labelsEqual(a, b labels.Set) bool {
	return len(a) == len(b) && labels.Equals(a, b)
}

func TestInferencePoolEndpoints(t *testing.T) {
	c := config.Discovery{Name: "pool", Kind: config.DiscoveryInferencePool, Namespaces: []string{"inf"}, Pool: "p",
		ModelLabel: "tlgate.io/model", RoleLabel: "tlgate.io/role"}
	s := newInferencePool(c, zerolog.Nop(), nil, nil)
	pod := func(name, ns, ip string, ready, deleting bool, lbl map[string]string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: lbl},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip}}
		st := corev1.ConditionFalse
		if ready {
			st = corev1.ConditionTrue
		}
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}
		if deleting {
			now := metav1.Now()
			p.DeletionTimestamp = &now
		}
		return p
	}
	vllm := func(extra ...string) map[string]string {
		l := map[string]string{"app": "vllm", "tlgate.io/model": "llama"}
		for i := 0; i+1 < len(extra); i += 2 {
			l[extra[i]] = extra[i+1]
		}
		return l
	}
	objs := []any{
		pod("a", "inf", "10.0.0.1", true, false, vllm()),
		pod("b", "inf", "10.0.0.2", false, false, vllm("tlgate.io/role", "decode")),
		pod("c", "inf", "10.0.0.3", true, true, vllm()),
		pod("d", "inf", "", true, false, vllm()),                                // no IP yet
		pod("e", "inf", "10.0.0.5", true, false, vllm("app", "other")),          // not picked
		pod("f", "other", "10.0.0.6", true, false, vllm()),                      // another namespace
		pod("g", "inf", "10.0.0.7", true, false, vllm("tlgate.io/role", "odd")), // role unusable: skipped
		pod("h", "inf", "fd00::8", true, false, vllm()),
	}
	spec := poolSpec{selector: labels.Set{"app": "vllm"}, ports: []int{8000, 8001}}
	got := s.endpoints(spec, objs)
	want := []Endpoint{
		{Key: "inf:a:8000", Address: "10.0.0.1:8000", Model: "llama"},
		{Key: "inf:a:8001", Address: "10.0.0.1:8001", Model: "llama"},
		{Key: "inf:b:8000", Address: "10.0.0.2:8000", Model: "llama", Role: "decode", Draining: true},
		{Key: "inf:b:8001", Address: "10.0.0.2:8001", Model: "llama", Role: "decode", Draining: true},
		{Key: "inf:c:8000", Address: "10.0.0.3:8000", Model: "llama", Draining: true},
		{Key: "inf:c:8001", Address: "10.0.0.3:8001", Model: "llama", Draining: true},
		{Key: "inf:h:8000", Address: "[fd00::8]:8000", Model: "llama"},
		{Key: "inf:h:8001", Address: "[fd00::8]:8001", Model: "llama"},
	}
	if !slices.Equal(got, want) {
		t.Errorf("endpoints:\n got %+v\nwant %+v", got, want)
	}
	if got := s.endpoints(poolSpec{selector: labels.Set{"app": "none"}, ports: []int{8000}}, objs); len(got) != 0 {
		t.Errorf("a selector picking no pod gave %+v", got)
	}
}

// TestBootstrapPortOfPods: an SGLang pool's pods give their bootstrap port
// by label (a pod whose value is no port is skipped), and Engines hands it
// to the prefill engines only, the source's own port to those without one.
func TestBootstrapPortOfPods(t *testing.T) {
	c := config.Discovery{Name: "sg", Kind: config.DiscoveryInferencePool, Namespaces: []string{"inf"}, Pool: "p",
		EngineKind: config.KindSGLang, Scheme: "http", RoleLabel: "tlgate.io/role", BootstrapPortLabel: "tlgate.io/bootstrap-port", BootstrapPort: 9100}
	s := newInferencePool(c, zerolog.Nop(), nil, nil)
	pod := func(name, ip string, lbl map[string]string) *corev1.Pod {
		lbl["app"] = "sglang"
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "inf", Labels: lbl},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}}
	}
	objs := []any{
		pod("p1", "10.0.0.1", map[string]string{"tlgate.io/role": "prefill", "tlgate.io/bootstrap-port": "9001"}),
		pod("p2", "10.0.0.2", map[string]string{"tlgate.io/role": "prefill"}),
		pod("p3", "10.0.0.3", map[string]string{"tlgate.io/role": "prefill", "tlgate.io/bootstrap-port": "none"}),
		pod("d1", "10.0.0.4", map[string]string{"tlgate.io/role": "decode", "tlgate.io/bootstrap-port": "9002"}),
	}
	eps := s.endpoints(poolSpec{selector: labels.Set{"app": "sglang"}, ports: []int{30000}}, objs)
	got := map[string]int{}
	for _, e := range Engines(c, "", eps) {
		got[e.ID] = e.BootstrapPort
		if e.Role != RoleOf(e.Engine.Role) {
			t.Errorf("%s: role %v, its config says %q", e.ID, e.Role, e.Engine.Role)
		}
	}
	want := map[string]int{"sg:inf:p1:30000": 9001, "sg:inf:p2:30000": 9100, "sg:inf:d1:30000": 0}
	if !maps.Equal(got, want) {
		t.Fatalf("bootstrap ports %v, want %v (p3's label is no port: skipped; a decode engine has none)", got, want)
	}
}
