package discovery_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/BurntSushi/toml"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/tlgate/tlgate/internal/adapter/fleetsync/embednats"
	"github.com/tlgate/tlgate/internal/adapter/store/embedetcd"
	"github.com/tlgate/tlgate/internal/testkit/kubeapi"
)

// The chart, as the operator installs it: release tlgate in the
// namespace inference, with the vLLM fleet's values.
const (
	chartDir     = "../../deploy/helm/tlgate"
	chartRelease = "tlgate"
	chartNS      = "inference"
)

// TestDiscoveryUnderChartRBAC renders the Helm chart (the vLLM fleet's
// values, with an InferencePool source beside the vLLM pods found by
// label), applies everything it renders to a real kube-apiserver, and runs
// the gateway binary with the rendered gateway.toml and the Secret's keys,
// as the chart's ServiceAccount (a token of it): discovery must find the 8
// vLLM pods and the pool's pods, and route to them, under exactly the
// permissions the chart grants, which must be no more than discovery
// reads. Only what cannot exist here is changed in the configuration: the
// listeners (loopback, free ports), the state folder, the etcd and NATS
// (the test's own, with NATS's token), and a kubeconfig naming the test's
// apiserver and the token instead of the in-cluster one.
func TestDiscoveryUnderChartRBAC(t *testing.T) {
	k := startKube(t)
	a := k.Applier(kubeapi.AdminToken)
	a.InstallCRDs(poolCRD, "../../deploy/testdata/crds/monitoring.coreos.com_servicemonitors.yaml",
		"../../deploy/testdata/crds/monitoring.coreos.com_prometheusrules.yaml")
	objs := kubeapi.Render(t, chartDir, chartRelease, chartNS,
		"-f", filepath.Join(chartDir, "ci", "vllm-fleet-values.yaml"), "-f", "testdata/chart-rbac-values.yaml")
	k.CreateNamespaces(chartNS, "llm", "pools")
	for _, u := range objs {
		if err := a.Apply(u, chartNS, false); err != nil {
			t.Fatal(err)
		}
	}
	dep := kubeapi.Find(objs, "Deployment", "tlgate", false)
	sa, _, _ := unstructured.NestedString(dep.Object, "spec", "template", "spec", "serviceAccountName")
	token := k.Token(chartNS, sa)
	checkLeastPrivilege(t, k, token, "llm", chartNS)
	checkPoolPrivilege(t, k, token, "pools", "vllm-llama3")

	// 8 vLLM pods by label (one a decode worker), one pod the selector
	// does not pick; the pool and its 2 pods.
	const model = "llama-3-8b"
	engines, port := enginesOnOnePort(t, 9, model)
	pods := &poolKube{kube: k, a: a, ns: "llm"}
	for i, e := range engines {
		labels := map[string]string{"app": "vllm", "tlgate.io/model": model}
		switch i {
		case 7:
			labels["tlgate.io/role"] = "decode"
		case 8:
			labels["app"] = "sglang"
		}
		pods.podWithPort(t, fmt.Sprintf("vllm-%d", i), e, labels, "http", port)
	}
	poolEngines, poolPort := enginesOnOnePort(t, 2, model)
	pool := &poolKube{kube: k, a: a, ns: "pools"}
	pool.putPool(t, "vllm-llama3", map[string]string{"app": "pool"}, poolPort)
	for i, e := range poolEngines {
		pool.pod(t, fmt.Sprintf("pool-%d", i), e, map[string]string{"app": "pool", "tlgate.io/model": model})
	}

	gw := runChartGateway(t, k, objs, token)
	want := map[string]string{}
	for i := range 8 {
		want[fmt.Sprintf("vllm:llm:vllm-%d", i)] = "routable"
	}
	for i := range 2 {
		want[fmt.Sprintf("pool:pools:pool-%d:%d", i, poolPort)] = "routable"
	}
	gw.waitWorkers(t, want)
	if w := gw.workers(t)["vllm:llm:vllm-7"]; w.Role != "decode" || w.Model != model {
		t.Errorf("vllm-7: role %q model %q, want decode %s (its labels)", w.Role, w.Model, model)
	}
	for range 10 {
		if code, body := gw.complete(t, model); code != http.StatusOK {
			t.Fatalf("completion: %d %s", code, body)
		}
	}
	served := 0
	for _, e := range append(engines[:7:7], poolEngines...) {
		served += int(e.Stats().Requests)
	}
	if served != 10 || engines[7].Stats().Requests != 0 || engines[8].Stats().Requests != 0 {
		t.Errorf("the unified workers served %d of 10 requests; the decode pod %d, the pod not picked %d",
			served, engines[7].Stats().Requests, engines[8].Stats().Requests)
	}
}

// podWithPort creates pod name for engine e with labels and a container
// port named portName, Ready.
func (k *poolKube) podWithPort(t *testing.T, name string, e interface{ HTTPAddr() string }, labels map[string]string, portName string, port int) {
	t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: k.ns, Labels: labels},
		Spec: corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Name: "vllm", Image: "vllm",
			Ports: []corev1.ContainerPort{{Name: portName, ContainerPort: int32(port)}}}}},
	}
	p, err := k.Admin.CoreV1().Pods(k.ns).Create(k.ctx(), p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ip := strings.Split(e.HTTPAddr(), ":")[0]
	p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}}}
	if _, err := k.Admin.CoreV1().Pods(k.ns).UpdateStatus(k.ctx(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// chartGateway is the gateway binary running with the chart's
// configuration.
type chartGateway struct {
	url      string
	opsKey   string
	appsKey  string
	log      string
	cmd      *exec.Cmd
	finished chan struct{}
}

// runChartGateway builds the gateway as the Dockerfile does and runs it
// with the rendered gateway.toml (adapted as TestDiscoveryUnderChartRBAC
// says) and the rendered Secret's values as its environment; it is
// stopped (SIGTERM) at the end of the test.
func runChartGateway(t *testing.T, k *kube, objs []*unstructured.Unstructured, token string) *chartGateway {
	t.Helper()
	dir := t.TempDir()
	bin := buildGateway(t, dir)
	cm := kubeapi.Find(objs, "ConfigMap", "tlgate-config", false)
	doc, _, _ := unstructured.NestedString(cm.Object, "data", "gateway.toml")
	var cfg map[string]any
	if _, err := toml.Decode(doc, &cfg); err != nil {
		t.Fatalf("the rendered gateway.toml: %v", err)
	}
	g := cfg["gateway"].(map[string]any)

	etcd, err := embedetcd.Start(filepath.Join(dir, "etcd"), 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(etcd.Close)
	nats, err := embednats.Start(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nats.Close)
	port, registry := freePort(t, "127.0.0.1"), freePort(t, "127.0.0.1")
	g["listen"] = "127.0.0.1:" + strconv.Itoa(port)
	g["registry_listen"] = "127.0.0.1:" + strconv.Itoa(registry)
	g["state_dir"] = filepath.Join(dir, "state")
	g["store"].(map[string]any)["endpoints"] = etcd.Endpoints()
	g["sync"].(map[string]any)["url"] = []string{nats.URL()}
	kubeconfig := k.kubeconfig(token)
	for _, d := range g["discovery"].([]map[string]any) {
		d["kubeconfig"] = kubeconfig
	}
	var b bytes.Buffer
	if err := toml.NewEncoder(&b).Encode(cfg); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "gateway.toml")
	if err := os.WriteFile(path, b.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}

	// The environment the Deployment gives the container: each variable
	// from its Secret (the chart's, rendered here), NATS's token the
	// test's.
	secret, err := kubeapi.SecretValues(kubeapi.Find(objs, "Secret", "tlgate-keys", false))
	if err != nil {
		t.Fatal(err)
	}
	containers, _, _ := unstructured.NestedSlice(kubeapi.Find(objs, "Deployment", "tlgate", false).Object, "spec", "template", "spec", "containers")
	envs, _, _ := unstructured.NestedSlice(containers[0].(map[string]any), "env")
	env := []string{"PATH=" + os.Getenv("PATH")}
	vars := map[string]string{}
	for _, e := range envs {
		name, _, _ := unstructured.NestedString(e.(map[string]any), "name")
		key, _, _ := unstructured.NestedString(e.(map[string]any), "valueFrom", "secretKeyRef", "key")
		vars[name] = secret[key]
		if name == g["sync"].(map[string]any)["token_env"] {
			vars[name] = nats.Token()
		}
		env = append(env, name+"="+vars[name])
	}

	gw := &chartGateway{url: "http://127.0.0.1:" + strconv.Itoa(port), opsKey: vars["TLGATE_OPS_KEY"], appsKey: vars["TLGATE_APPS_KEY"],
		log: filepath.Join(dir, "gateway.log"), finished: make(chan struct{})}
	logf, err := os.Create(gw.log)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	gw.cmd = exec.Command(bin, "-config", path)
	gw.cmd.Env, gw.cmd.Stdout, gw.cmd.Stderr = env, logf, logf
	if err := gw.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = gw.cmd.Wait(); close(gw.finished) }()
	t.Cleanup(func() { gw.stop(t) })
	return gw
}

// buildGateway builds ./cmd/gateway into dir with the Dockerfile's flags
// (its packages are then those TestDockerfile built: cached).
func buildGateway(t *testing.T, dir string) string {
	t.Helper()
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "gateway")
	cmd := exec.Command(gobin, "build", "-trimpath", "-tags", "noembed", "-ldflags=-s -w", "-o", bin, "./cmd/gateway")
	cmd.Dir = "../.."
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/gateway: %v\n%s", err, out)
	}
	return bin
}

// stop sends SIGTERM and waits for the gateway to end (shutdown_delay and
// shutdown_timeout, then SIGKILL).
func (g *chartGateway) stop(t *testing.T) {
	_ = g.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-g.finished:
	case <-time.After(40 * time.Second):
		_ = g.cmd.Process.Kill()
		<-g.finished
		t.Errorf("the gateway did not stop within 40s of SIGTERM:\n%s", g.logTail())
	}
}

func (g *chartGateway) logTail() string {
	b, _ := os.ReadFile(g.log)
	if len(b) > 6000 {
		b = b[len(b)-6000:]
	}
	return string(b)
}

// do sends a request with key and returns the status and the body.
func (g *chartGateway) do(t *testing.T, method, path, key, body string) (int, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, method, g.url+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, []byte(err.Error())
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// workers lists the gateway's workers by id (admin API, the ops key).
func (g *chartGateway) workers(t *testing.T) map[string]worker {
	t.Helper()
	code, b := g.do(t, http.MethodGet, "/admin/v1/workers", g.opsKey, "")
	out := map[string]worker{}
	if code != http.StatusOK {
		return out
	}
	var body struct {
		Workers []worker `json:"workers"`
	}
	if err := json.Unmarshal(b, &body); err != nil {
		t.Fatal(err)
	}
	for _, w := range body.Workers {
		out[w.ID] = w
	}
	return out
}

// waitWorkers waits until the gateway's workers are exactly want (id →
// state as state says), or fails after kubeWithin with its log.
func (g *chartGateway) waitWorkers(t *testing.T, want map[string]string) {
	t.Helper()
	deadline := time.Now().Add(kubeWithin)
	for {
		select {
		case <-g.finished:
			t.Fatalf("the gateway exited:\n%s", g.logTail())
		default:
		}
		ws := g.workers(t)
		got := map[string]string{}
		for id := range ws {
			got[id] = state(ws, id)
		}
		if maps.Equal(got, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("workers: after %v got %v, want %v\ngateway log:\n%s", kubeWithin, got, want, g.logTail())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// complete sends one completion for model with the apps key.
func (g *chartGateway) complete(t *testing.T, model string) (int, string) {
	t.Helper()
	code, b := g.do(t, http.MethodPost, "/v1/completions", g.appsKey, `{"model":`+strconv.Quote(model)+`,"prompt":"hello","max_tokens":2}`)
	return code, string(b)
}
