package deploy

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"
	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/adapter/discovery"
	"github.com/tlgate/tlgate/internal/routing/routes"
	"github.com/tlgate/tlgate/internal/testkit/kubeapi"
)

// The chart, and the release and namespace the tests render it as (the
// kustomization's namespace).
const (
	chartDir  = "helm/tlgate"
	release   = "tlgate"
	namespace = "inference"
)

// crdFiles are the CRDs the rendered manifests and discovery need
// (testdata/crds/README.md says where they come from).
var crdFiles = []string{
	"testdata/crds/monitoring.coreos.com_servicemonitors.yaml",
	"testdata/crds/monitoring.coreos.com_prometheusrules.yaml",
	"testdata/crds/inference.networking.k8s.io_inferencepools.yaml",
}

// TestHelmLint runs helm lint --strict on the chart with its default
// values and with each values file of ci/.
func TestHelmLint(t *testing.T) {
	helm := kubeapi.Binary(t, kubeapi.HelmEnv)
	files, err := filepath.Glob(filepath.Join(chartDir, "ci", "*-values.yaml"))
	if err != nil || len(files) < 2 {
		t.Fatalf("ci values files: %v %v", files, err)
	}
	for _, args := range append([][]string{nil}, wrapEach("-f", files)...) {
		cmd := exec.Command(helm, append([]string{"lint", "--strict", "--namespace", namespace, chartDir}, args...)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("helm lint %v: %v\n%s", args, err, out)
		}
	}
}

func wrapEach(flag string, files []string) [][]string {
	var out [][]string
	for _, f := range files {
		out = append(out, []string{flag, f})
	}
	return out
}

// TestHelmTemplateDryRunDefaults applies what helm template renders with
// the default values to a real kube-apiserver as a server-side dry run
// (schemas, unknown fields, admission), checks the rendered gateway.toml
// loads, and that the ServiceAccount may do what discovery does under the
// rendered RBAC, and no more.
func TestHelmTemplateDryRunDefaults(t *testing.T) {
	srv := kubeapi.Start(t)
	objs := kubeapi.Render(t, chartDir, release, namespace)
	wantObjects(t, objs, "Deployment/tlgate", "Service/tlgate", "Service/tlgate-registry", "ConfigMap/tlgate-config", "Secret/tlgate-keys",
		"ServiceAccount/tlgate", "Role/tlgate-discovery", "RoleBinding/tlgate-discovery", "PodDisruptionBudget/tlgate", "NetworkPolicy/tlgate",
		"StatefulSet/tlgate-etcd", "Service/tlgate-etcd", "PodDisruptionBudget/tlgate-etcd", "NetworkPolicy/tlgate-etcd",
		"StatefulSet/tlgate-nats", "Service/tlgate-nats", "ConfigMap/tlgate-nats-config", "NetworkPolicy/tlgate-nats")
	cfg := renderedConfig(t, objs, "tlgate-config", false)
	dryRun(t, srv, objs)
	checkDiscoveryRBAC(t, srv, objs, cfg)

	// The dry run refuses what the API does not define: an unknown field,
	// a value of the wrong type.
	a := srv.Applier(kubeapi.AdminToken)
	for _, bad := range []func(*unstructured.Unstructured){
		func(u *unstructured.Unstructured) { _ = unstructured.SetNestedField(u.Object, "x", "spec", "replicaz") },
		func(u *unstructured.Unstructured) {
			_ = unstructured.SetNestedField(u.Object, "three", "spec", "replicas")
		},
	} {
		u := kubeapi.Find(objs, "Deployment", "tlgate", false).DeepCopy()
		bad(u)
		if err := a.Apply(u, namespace, true); err == nil {
			t.Errorf("a Deployment with a bad field passed the dry run: %v", u.Object["spec"])
		}
	}
}

// TestHelmTemplateDryRunVLLMFleet is the same for ci/vllm-fleet-values.yaml:
// vLLM pods found by label in another namespace, 3 replicas, the chart's
// etcd and NATS, a ServiceMonitor and a PrometheusRule (whose rules are
// deploy/prometheus/alerts.yml's).
func TestHelmTemplateDryRunVLLMFleet(t *testing.T) {
	srv := kubeapi.Start(t)
	objs := kubeapi.Render(t, chartDir, release, namespace, "-f", filepath.Join(chartDir, "ci", "vllm-fleet-values.yaml"))
	wantObjects(t, objs, "ServiceMonitor/tlgate", "PrometheusRule/tlgate", "StatefulSet/tlgate-etcd", "StatefulSet/tlgate-nats")
	cfg := renderedConfig(t, objs, "tlgate-config", false)
	dep := kubeapi.Find(objs, "Deployment", "tlgate", false)
	if n, _, _ := unstructured.NestedInt64(dep.Object, "spec", "replicas"); n != 3 {
		t.Errorf("replicas %d, want 3", n)
	}
	if len(cfg.Gateway.Discovery) != 1 || cfg.Gateway.Discovery[0].Selector != "app=vllm" || !slices.Equal(cfg.Gateway.Discovery[0].Namespaces, []string{"llm"}) {
		t.Errorf("discovery %+v: want the vLLM pods labelled app=vllm in llm", cfg.Gateway.Discovery)
	}
	if want := members("http://tlgate-etcd-%d.tlgate-etcd:2379", 3); cfg.Gateway.Store.Kind != "etcd" || !slices.Equal(cfg.Gateway.Store.Endpoints, want) {
		t.Errorf("store %s %v, want etcd %v (the chart's members)", cfg.Gateway.Store.Kind, cfg.Gateway.Store.Endpoints, want)
	}
	if want := members("nats://tlgate-nats-%d.tlgate-nats:4222", 3); cfg.Gateway.Sync.Kind != "nats" || !slices.Equal([]string(cfg.Gateway.Sync.URL), want) {
		t.Errorf("sync %s %v, want nats %v (the chart's nodes)", cfg.Gateway.Sync.Kind, cfg.Gateway.Sync.URL, want)
	}
	checkAlertsAgree(t, kubeapi.Find(objs, "PrometheusRule", "tlgate", false))
	dryRun(t, srv, objs)
	checkDiscoveryRBAC(t, srv, objs, cfg)
}

// TestHelmTemplateDryRunVLLMDisaggregated is the same for
// ci/vllm-pd-values.yaml: vLLM prefill and decode pods found by label,
// their roles from a label, a route that serves their model disaggregated
// (paired over vLLM's kv_transfer_params, as the engines' kind says), and
// no NetworkPolicy rule letting anything reach the registry port, since
// probed engines send no heartbeats.
func TestHelmTemplateDryRunVLLMDisaggregated(t *testing.T) {
	srv := kubeapi.Start(t)
	objs := kubeapi.Render(t, chartDir, release, namespace, "-f", filepath.Join(chartDir, "ci", "vllm-pd-values.yaml"))
	cfg := renderedConfig(t, objs, "tlgate-config", false)
	if d := cfg.Gateway.Discovery; len(d) != 1 || d[0].EngineKind != "vllm" || d[0].RoleLabel != "tlgate.io/role" || d[0].Selector != "app=vllm-pd" {
		t.Errorf("discovery %+v: want the vLLM pods labelled app=vllm-pd, their role from tlgate.io/role", d)
	}
	rs := cfg.Gateway.Routes
	if len(rs) != 1 || rs[0].Model != "llama-pd" || !slices.Equal(rs[0].Targets, []string{"disaggregated"}) {
		t.Errorf("routes %+v: want llama-pd served disaggregated", rs)
	}
	np := kubeapi.Find(objs, "NetworkPolicy", "tlgate", false)
	if ingress, _, _ := unstructured.NestedSlice(np.Object, "spec", "ingress"); len(ingress) != 1 {
		t.Errorf("the gateway's NetworkPolicy has %d ingress rules, want the HTTP port's alone: %v", len(ingress), ingress)
	}
	dryRun(t, srv, objs)
	checkDiscoveryRBAC(t, srv, objs, cfg)
}

// TestHelmTemplateDryRunInferencePool is the same for
// ci/inferencepool-values.yaml: an InferencePool source (its Role grants
// that pool by name), an etcd of the operator's, keys from existing
// Secrets, TLS.
func TestHelmTemplateDryRunInferencePool(t *testing.T) {
	srv := kubeapi.Start(t)
	objs := kubeapi.Render(t, chartDir, release, namespace, "-f", filepath.Join(chartDir, "ci", "inferencepool-values.yaml"))
	for _, gone := range []string{"StatefulSet/tlgate-etcd", "StatefulSet/tlgate-nats"} {
		kind, name, _ := strings.Cut(gone, "/")
		if kubeapi.Find(objs, kind, name, false) != nil {
			t.Errorf("%s rendered with etcd.enabled and nats.enabled false", gone)
		}
	}
	cfg := renderedConfig(t, objs, "tlgate-config", false)
	if !strings.HasSuffix(cfg.Gateway.TLSCertFile, "/etc/tlgate-tls/tls.crt") || cfg.Gateway.Store.Endpoints[0] != "https://etcd.platform.svc:2379" {
		t.Errorf("tls_cert_file %q, store endpoints %v", cfg.Gateway.TLSCertFile, cfg.Gateway.Store.Endpoints)
	}
	dryRun(t, srv, objs)
	checkDiscoveryRBAC(t, srv, objs, cfg)
}

// TestKustomizeDryRun applies what kustomize build renders of
// deploy/kubernetes as a server-side dry run, and checks discovery's RBAC
// as the chart's: everything lands in the namespace inference, where the
// RoleBinding's subject is.
func TestKustomizeDryRun(t *testing.T) {
	srv := kubeapi.Start(t)
	objs := kubeapi.KustomizeBuild(t, "kubernetes")
	for _, u := range objs {
		if u.GetNamespace() != namespace {
			t.Errorf("%s is not in the namespace %s", kubeapi.ObjectID(u), namespace)
		}
	}
	cfg := renderedConfig(t, objs, "tlgate-config", true)
	dryRun(t, srv, objs)
	checkDiscoveryRBAC(t, srv, objs, cfg)
}

// TestHelmDefaultsMatchKustomize: the chart's default values render the
// objects deploy/kubernetes ships, field by field, but for what only Helm
// adds (its chart, managed-by and version labels, checksum annotations),
// the ConfigMap's hash suffix (kustomize's), the gateway.toml (compared
// as TOML, not as text) and the Secret's values (the chart makes random
// ones; the keys must agree).
func TestHelmDefaultsMatchKustomize(t *testing.T) {
	chart := kubeapi.Render(t, chartDir, release, namespace)
	kust := kubeapi.KustomizeBuild(t, "kubernetes")
	norm := func(objs []*unstructured.Unstructured) map[string]map[string]any {
		hashed := map[string]string{}
		for _, u := range objs {
			if u.GetKind() == "ConfigMap" && strings.HasPrefix(u.GetName(), "tlgate-config-") {
				hashed[u.GetName()] = "tlgate-config"
			}
		}
		out := map[string]map[string]any{}
		for _, u := range objs {
			m := normalize(t, u, hashed)
			id := fmt.Sprintf("%s/%s/%s", u.GetKind(), u.GetNamespace(), m["metadata"].(map[string]any)["name"])
			out[id] = m
		}
		return out
	}
	c, k := norm(chart), norm(kust)
	for _, id := range slices.Sorted(keysOfAny(c, k)) {
		co, cok := c[id]
		ko, kok := k[id]
		switch {
		case !cok:
			t.Errorf("%s: deploy/kubernetes ships it, the chart's defaults do not render it", id)
		case !kok:
			t.Errorf("%s: the chart's defaults render it, deploy/kubernetes does not ship it", id)
		default:
			for _, d := range diff("", co, ko) {
				t.Errorf("%s: %s", id, d)
			}
		}
	}
}

// TestHelmValuesRefused: values that contradict each other are refused by
// helm template with a message that says what to set; the chart renders
// without NATS and without discovery when told so.
func TestHelmValuesRefused(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--set", "config.store.kind=file"}, `etcd.enabled runs an etcd, but config.store.kind is "file"`},
		{[]string{"--set", "etcd.enabled=false"}, "config.store.kind is etcd: set config.store.endpoints to your etcd, or etcd.enabled=true"},
		{[]string{"--set", "nats.enabled=false"}, "config.sync.kind is nats: set config.sync.url to your NATS, or nats.enabled=true"},
		{[]string{"--set", "secretEnv.TLGATE_OPS_KEY=null"}, "config names the environment variable TLGATE_OPS_KEY (a *_env key), which neither secretEnv nor extraEnv sets"},
		{[]string{"--set", "podAntiAffinity=maybe"}, `podAntiAffinity: must be soft, hard or none, got "maybe"`},
		{[]string{"--set", "etcd.replicas=2"}, "etcd.replicas: must be odd (1, 3, 5), got 2"},
		{[]string{"--set", "config.listen=0.0.0.0:http"}, `config: listener "0.0.0.0:http" has no port number`},
		{[]string{"--set", "serviceAccount.create=false"}, "serviceAccount.name: name the existing ServiceAccount"},
		// A stop must fit in the grace period, or SIGKILL cuts requests in
		// flight.
		{[]string{"--set", "config.shutdown_timeout=60s"}, "terminationGracePeriodSeconds (30) must be longer than preStopSleepSeconds (2) + config.shutdown_delay (5s) + config.shutdown_timeout (60s) = 67s"},
		{[]string{"--set", "config.shutdown_timeout=23s"}, "= 30s, or requests in flight are killed"},
		{[]string{"--set", "config.shutdown_delay=1m", "--set", "terminationGracePeriodSeconds=80"}, "= 82s"},
		{[]string{"--set", "config.shutdown_timeout=20 s"}, `config.shutdown_timeout: "20 s" is not a duration`},
	}
	for _, tc := range tests {
		_, err := kubeapi.HelmTemplate(t, chartDir, release, namespace, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("helm template %v: %v, want an error saying %q", tc.args, err, tc.want)
		}
	}
	// Durations as the gateway reads them (Go's): 2 + 1.5 + 86.4 < 90.
	kubeapi.Render(t, chartDir, release, namespace, "--set", "terminationGracePeriodSeconds=90", "--set", "config.shutdown_delay=1500ms",
		"--set", "config.shutdown_timeout=1m26.4s")
	kubeapi.Render(t, chartDir, release, namespace, "--set", "config.shutdown_delay=null", "--set", "config.shutdown_timeout=.38m")
	objs := kubeapi.Render(t, chartDir, release, namespace, "--set", "nats.enabled=false", "--set", "config.sync.kind=none",
		"--set", "secretEnv.TLGATE_NATS_TOKEN=null", "--set", "config.discovery=null", "--set", "config.sync.token_env=null")
	for _, gone := range []string{"StatefulSet/tlgate-nats", "Role/tlgate-discovery"} {
		kind, name, _ := strings.Cut(gone, "/")
		if kubeapi.Find(objs, kind, name, false) != nil {
			t.Errorf("%s rendered without NATS and discovery", gone)
		}
	}
	renderedConfig(t, objs, "tlgate-config", false)
}

func members(format string, n int) []string {
	var out []string
	for i := range n {
		out = append(out, fmt.Sprintf(format, i))
	}
	return out
}

// wantObjects fails for each "Kind/name" not among objs.
func wantObjects(t *testing.T, objs []*unstructured.Unstructured, ids ...string) {
	t.Helper()
	for _, id := range ids {
		kind, name, _ := strings.Cut(id, "/")
		if kubeapi.Find(objs, kind, name, false) == nil {
			t.Errorf("no %s among %s", id, kubeapi.Kinds(objs))
		}
	}
}

// renderedConfig loads the gateway.toml of the ConfigMap name (a
// kustomize-hashed name with hashed) with the container's variables set,
// as the gateway would at start: it must validate.
func renderedConfig(t *testing.T, objs []*unstructured.Unstructured, name string, hashed bool) *config.Config {
	t.Helper()
	cm := kubeapi.Find(objs, "ConfigMap", name, hashed)
	if cm == nil {
		t.Fatalf("no ConfigMap %s among %s", name, kubeapi.Kinds(objs))
	}
	doc, _, _ := unstructured.NestedString(cm.Object, "data", "gateway.toml")
	dep := kubeapi.Find(objs, "Deployment", "tlgate", false)
	containers, _, _ := unstructured.NestedSlice(dep.Object, "spec", "template", "spec", "containers")
	env, _, _ := unstructured.NestedSlice(containers[0].(map[string]any), "env")
	for _, e := range env {
		name, _ := e.(map[string]any)["name"].(string)
		t.Setenv(name, "rendered-"+strings.ToLower(name))
	}
	// Files the config names under the container's volume mounts (TLS
	// certificates, CAs) are there at run time: here they are empty files
	// under a temporary folder, which the config is pointed at.
	mounts, _, _ := unstructured.NestedSlice(containers[0].(map[string]any), "volumeMounts")
	root := t.TempDir()
	for _, m := range mounts {
		dir, _ := m.(map[string]any)["mountPath"].(string)
		for _, path := range filesUnder.FindAllStringSubmatch(doc, -1) {
			if p := path[1]; strings.HasPrefix(p, dir+"/") && dir != "/etc/tlgate" {
				if err := os.MkdirAll(filepath.Join(root, filepath.Dir(p)), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(root, p), nil, 0o600); err != nil {
					t.Fatal(err)
				}
				doc = strings.ReplaceAll(doc, `"`+p+`"`, `"`+filepath.Join(root, p)+`"`)
			}
		}
	}
	cfg, err := config.Parse([]byte(doc))
	if err != nil {
		t.Fatalf("the rendered gateway.toml does not load: %v\n%s", err, doc)
	}
	return cfg
}

// filesUnder matches a TOML string holding an absolute path.
var filesUnder = regexp.MustCompile(`"(/[^"]+)"`)

// dryRun installs the CRDs, creates every namespace the objects name and
// applies each object as a server-side dry run with strict field
// validation, failing for each the apiserver refuses.
func dryRun(t *testing.T, srv *kubeapi.Server, objs []*unstructured.Unstructured) {
	t.Helper()
	a := srv.Applier(kubeapi.AdminToken)
	a.InstallCRDs(crdFiles...)
	nss := sets.New[string]()
	for _, u := range objs {
		if ns := u.GetNamespace(); ns != "" {
			nss.Insert(ns)
		}
	}
	srv.CreateNamespaces(sets.List(nss)...)
	for _, u := range objs {
		if err := a.Apply(u, namespace, true); err != nil {
			t.Errorf("server-side dry run: %v", err)
		}
	}
	t.Logf("%d objects pass a server-side dry run: %s", len(objs), kubeapi.Kinds(objs))
}

// checkDiscoveryRBAC applies the ServiceAccount, Roles and RoleBindings for
// real and asks the apiserver (SubjectAccessReview) whether the gateway's
// ServiceAccount may list and watch what each [[gateway.discovery]] source
// reads, where it reads it (Pods for a selector or a pool, EndpointSlices
// for a service, the InferencePool by name), and may not read Secrets
// there, Pods in kube-system, nor another InferencePool.
func checkDiscoveryRBAC(t *testing.T, srv *kubeapi.Server, objs []*unstructured.Unstructured, cfg *config.Config) {
	t.Helper()
	a := srv.Applier(kubeapi.AdminToken)
	for _, u := range objs {
		switch u.GetKind() {
		case "ServiceAccount", "Role", "RoleBinding":
			if err := a.Apply(u, namespace, false); err != nil {
				t.Fatal(err)
			}
		}
	}
	dep := kubeapi.Find(objs, "Deployment", "tlgate", false)
	sa, _, _ := unstructured.NestedString(dep.Object, "spec", "template", "spec", "serviceAccountName")
	user := "system:serviceaccount:" + dep.GetNamespace() + ":" + sa
	// A grant the rendered RBAC should give is asked again until the
	// authorizer has seen the binding (kubeapi.Server.Allowed); grants it
	// should not give are asked after, when the bindings are in its cache.
	want := func(ok bool, ns, group, resource, name, verb string) {
		t.Helper()
		wait := time.Duration(0)
		if ok {
			wait = 10 * time.Second
		}
		attrs := authorizationv1.ResourceAttributes{Namespace: ns, Group: group, Resource: resource, Name: name, Verb: verb}
		if got := srv.Allowed(t, dep.GetNamespace(), sa, attrs, wait); got != ok {
			t.Errorf("%s may %s %s %q in %s: %v, want %v", user, verb, resource, name, ns, got, ok)
		}
	}
	pool := discovery.InferencePoolResource
	sources := 0
	for _, d := range cfg.Gateway.Discovery {
		if d.Kind != config.DiscoveryKubernetes && d.Kind != config.DiscoveryInferencePool {
			continue
		}
		sources++
		for _, ns := range d.Namespaces {
			for _, verb := range []string{"list", "watch"} {
				switch {
				case d.Kind == config.DiscoveryInferencePool:
					want(true, ns, pool.Group, pool.Resource, d.Pool, verb)
					want(false, ns, pool.Group, pool.Resource, d.Pool+"-other", verb)
					want(true, ns, "", "pods", "", verb)
				case d.Service != "":
					want(true, ns, "discovery.k8s.io", "endpointslices", "", verb)
				default:
					want(true, ns, "", "pods", "", verb)
				}
			}
			want(false, ns, "", "secrets", "", "list")
			want(false, ns, "", "pods", "", "create")
			want(false, ns, "", "pods", "", "get")
		}
	}
	want(false, "kube-system", "", "pods", "", "list")
	want(false, "", "", "pods", "", "list")
	t.Logf("discovery's RBAC checked for %d source(s) as %s", sources, user)
}

// TestHelmDefaultsSeedNoRoutes: the default values seed no route. Routes
// of config only seed an empty store (etcd keeps the table written at the
// first install), so example routes there would stay in every release's
// table for good, whatever its values say later.
func TestHelmDefaultsSeedNoRoutes(t *testing.T) {
	cfg := renderedConfig(t, kubeapi.Render(t, chartDir, release, namespace), "tlgate-config", false)
	if len(cfg.Gateway.Routes) > 0 {
		t.Errorf("the default values seed %d routes (%+v): they would outlive any later values", len(cfg.Gateway.Routes), cfg.Gateway.Routes)
	}
}

// TestHelmNotesFileStore: with the file store, whose state_dir is an
// emptyDir, the chart's NOTES warn that a PUT route table does not outlive
// the pod; with etcd (the defaults) they do not.
func TestHelmNotesFileStore(t *testing.T) {
	const warning = "survives a container restart but not a pod replacement"
	for _, tc := range []struct {
		args []string
		warn bool
	}{
		{nil, false},
		{[]string{"--set", "config.store.kind=file", "--set", "etcd.enabled=false", "--set", "replicaCount=1"}, true},
	} {
		if notes := helmNotes(t, tc.args...); strings.Contains(notes, warning) != tc.warn {
			t.Errorf("%v: the NOTES warn that the table is lost with the pod: %v, want %v\n%s", tc.args, !tc.warn, tc.warn, notes)
		}
	}
}

// helmNotes returns the NOTES a helm install of the chart would print
// (a client-side dry run: no cluster is reached).
func helmNotes(t *testing.T, args ...string) string {
	t.Helper()
	helm := kubeapi.Binary(t, kubeapi.HelmEnv)
	cmd := exec.Command(helm, append([]string{"install", release, chartDir, "--namespace", namespace, "--dry-run=client"}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helm install --dry-run=client %v: %v\n%s", args, err, out)
	}
	_, notes, ok := strings.Cut(string(out), "\nNOTES:\n")
	if !ok {
		t.Fatalf("helm install --dry-run=client %v printed no NOTES:\n%s", args, out)
	}
	return notes
}

// TestHelmDiscoveryRBACNames: the discovery Roles and RoleBindings the
// chart makes outside the release's namespace carry that namespace in
// their names, so that two releases of one name in two namespaces, both
// watching a third, do not make (and fight over) the same objects; in the
// release's namespace the name is <fullname>-discovery, as
// deploy/kubernetes's.
func TestHelmDiscoveryRBACNames(t *testing.T) {
	values := []string{"--set", "config.discovery[0].namespaces={llm,%s}", "--set", "config.discovery[0].name=vllm",
		"--set", "config.discovery[0].kind=kubernetes", "--set", "config.discovery[0].selector=app=vllm"}
	names := map[string]map[string]string{} // release namespace -> "Kind/namespace" -> name
	for _, ns := range []string{"team-a", "team-b"} {
		args := slices.Clone(values)
		args[1] = fmt.Sprintf(args[1], ns)
		names[ns] = map[string]string{}
		for _, u := range kubeapi.Render(t, chartDir, release, ns, args...) {
			if k := u.GetKind(); k == "Role" || k == "RoleBinding" {
				names[ns][k+"/"+u.GetNamespace()] = u.GetName()
			}
		}
		for _, k := range []string{"Role", "RoleBinding"} {
			if got := names[ns][k+"/"+ns]; got != "tlgate-discovery" {
				t.Errorf("release in %s: its %s in %s is %q, want tlgate-discovery", ns, k, ns, got)
			}
			if got, want := names[ns][k+"/llm"], "tlgate-"+ns+"-discovery"; got != want {
				t.Errorf("release in %s: its %s in llm is %q, want %q", ns, k, got, want)
			}
		}
	}
	if a, b := names["team-a"]["Role/llm"], names["team-b"]["Role/llm"]; a == b {
		t.Errorf("releases tlgate in team-a and team-b both make Role %s in llm", a)
	}
}

// TestHelmScrapePort: the prometheus.io/port annotation is the port of
// config.listen (where /metrics is served), unless podAnnotations gives
// one.
func TestHelmScrapePort(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "8080"},
		{[]string{"--set", "config.listen=0.0.0.0:8000"}, "8000"},
		{[]string{"--set", "config.listen=0.0.0.0:8000", "--set-string", "podAnnotations.prometheus\\.io/port=9999"}, "9999"},
	} {
		dep := kubeapi.Find(kubeapi.Render(t, chartDir, release, namespace, tc.args...), "Deployment", "tlgate", false)
		ann, _, _ := unstructured.NestedStringMap(dep.Object, "spec", "template", "metadata", "annotations")
		if got := ann["prometheus.io/port"]; got != tc.want {
			t.Errorf("%v: prometheus.io/port %q, want %q", tc.args, got, tc.want)
		}
	}
}

// TestHelmStatefulSetScheduling: imagePullSecrets reaches the etcd's and
// NATS's pods too (a mirror of their images may need them), and each takes
// its own nodeSelector and tolerations.
func TestHelmStatefulSetScheduling(t *testing.T) {
	objs := kubeapi.Render(t, chartDir, release, namespace, "--set", "imagePullSecrets[0].name=mirror",
		"--set", "etcd.nodeSelector.pool=etcd", "--set", "etcd.tolerations[0].key=dedicated", "--set", "etcd.tolerations[0].operator=Exists",
		"--set", "nats.nodeSelector.pool=nats", "--set", "nats.tolerations[0].key=dedicated", "--set", "nats.tolerations[0].operator=Exists")
	for _, c := range []string{"etcd", "nats"} {
		sts := kubeapi.Find(objs, "StatefulSet", "tlgate-"+c, false)
		if sts == nil {
			t.Fatalf("no StatefulSet tlgate-%s", c)
		}
		pod, _, _ := unstructured.NestedMap(sts.Object, "spec", "template", "spec")
		if got := short(pod["imagePullSecrets"]); got != `[{"name":"mirror"}]` {
			t.Errorf("%s: imagePullSecrets %s", c, got)
		}
		if got := short(pod["nodeSelector"]); got != `{"pool":"`+c+`"}` {
			t.Errorf("%s: nodeSelector %s", c, got)
		}
		if got := short(pod["tolerations"]); got != `[{"key":"dedicated","operator":"Exists"}]` {
			t.Errorf("%s: tolerations %s", c, got)
		}
	}
}

// TestHelmPDBEvictsUnready: the gateway's PodDisruptionBudget, with
// maxUnavailable or minAvailable, lets a drain evict a pod that is not
// ready (with no engine routable every replica's /readyz is 503, and a
// budget counting only ready pods would refuse every eviction for ever).
func TestHelmPDBEvictsUnready(t *testing.T) {
	for _, args := range [][]string{nil, {"--set", "pdb.minAvailable=2"}} {
		objs := kubeapi.Render(t, chartDir, release, namespace, args...)
		pdb := kubeapi.Find(objs, "PodDisruptionBudget", "tlgate", false)
		if pdb == nil {
			t.Fatalf("%v: no PodDisruptionBudget tlgate among %s", args, kubeapi.Kinds(objs))
		}
		if p, _, _ := unstructured.NestedString(pdb.Object, "spec", "unhealthyPodEvictionPolicy"); p != "AlwaysAllow" {
			t.Errorf("%v: the gateway's PodDisruptionBudget has unhealthyPodEvictionPolicy %q, want AlwaysAllow", args, p)
		}
	}
}

// TestHelmModelLabels: where a discovery source of the default values or
// a ci/ values file reads the model id from a pod label (model_label),
// every model id the routes send to is one a label value can hold; the API
// server refuses a pod labelled with an id like
// meta-llama/Llama-3.1-8B-Instruct ('/'), which needs model_annotation.
func TestHelmModelLabels(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(chartDir, "ci", "*-values.yaml"))
	if err != nil || len(files) < 2 {
		t.Fatalf("ci values files: %v %v", files, err)
	}
	for _, args := range append([][]string{nil}, wrapEach("-f", files)...) {
		cfg := renderedConfig(t, kubeapi.Render(t, chartDir, release, namespace, args...), "tlgate-config", false)
		var label string
		for _, d := range cfg.Gateway.Discovery {
			if d.ModelLabel != "" {
				label = d.ModelLabel
			}
		}
		if label != "" {
			checkModelLabels(t, args, label, cfg.Gateway.Routes)
		}
	}
}

func checkModelLabels(t *testing.T, args []string, label string, rs []routes.Route) {
	t.Helper()
	for _, r := range rs {
		var models []string
		for _, b := range r.Backends {
			models = append(models, b.Model)
		}
		for _, s := range r.Cascade {
			models = append(models, s.Model)
		}
		for _, m := range models {
			if errs := validation.IsValidLabelValue(m); len(errs) > 0 {
				t.Errorf("%v: route %s sends to model %q, which pods cannot carry in the label %s (model_label): %s; use model_annotation",
					args, r.Model, m, label, strings.Join(errs, "; "))
			}
		}
	}
}

// checkAlertsAgree: the PrometheusRule's groups are alerts.yml's.
func checkAlertsAgree(t *testing.T, rule *unstructured.Unstructured) {
	t.Helper()
	b, err := os.ReadFile("prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	file, err := kubeapi.Decode(append([]byte("kind: Alerts\napiVersion: v1\n"), b...))
	if err != nil {
		t.Fatal(err)
	}
	want, _, _ := unstructured.NestedSlice(file[0].Object, "groups")
	got, _, _ := unstructured.NestedSlice(rule.Object, "spec", "groups")
	if len(want) == 0 || !reflect.DeepEqual(jsonRound(t, got), jsonRound(t, want)) {
		t.Errorf("the PrometheusRule's groups are not deploy/prometheus/alerts.yml's:\n%s", strings.Join(diff("groups", jsonRound(t, got), jsonRound(t, want)), "\n"))
	}
}

// helmOnlyLabels are the labels the chart adds that kustomize does not.
var helmOnlyLabels = []string{"helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/version"}

// normalize returns u as the comparison of TestHelmDefaultsMatchKustomize
// sees it.
func normalize(t *testing.T, u *unstructured.Unstructured, hashed map[string]string) map[string]any {
	t.Helper()
	m := jsonRound(t, u.Object).(map[string]any)
	m = rename(m, hashed).(map[string]any)
	meta := m["metadata"].(map[string]any)
	if labels, ok := meta["labels"].(map[string]any); ok {
		for _, l := range helmOnlyLabels {
			delete(labels, l)
		}
	}
	dropChecksums(meta)
	if tmpl, ok, _ := unstructured.NestedMap(m, "spec", "template", "metadata"); ok {
		dropChecksums(tmpl)
		_ = unstructured.SetNestedMap(m, tmpl, "spec", "template", "metadata")
	}
	switch u.GetKind() {
	case "ConfigMap":
		if doc, ok := m["data"].(map[string]any)["gateway.toml"].(string); ok {
			var parsed map[string]any
			if _, err := toml.Decode(doc, &parsed); err != nil {
				t.Fatalf("%s: gateway.toml: %v", kubeapi.ObjectID(u), err)
			}
			m["data"].(map[string]any)["gateway.toml"] = jsonRound(t, parsed)
		}
	case "Secret":
		vals, err := kubeapi.SecretValues(u)
		if err != nil {
			t.Fatal(err)
		}
		keys := slices.Sorted(maps.Keys(vals))
		delete(m, "data")
		delete(m, "stringData")
		m["keys"] = jsonRound(t, keys)
	}
	return m
}

// dropChecksums removes a metadata's checksum/ annotations (Helm's roll
// triggers), and the annotations when none is left.
func dropChecksums(meta map[string]any) {
	ann, ok := meta["annotations"].(map[string]any)
	if !ok {
		return
	}
	for k := range ann {
		if strings.HasPrefix(k, "checksum/") {
			delete(ann, k)
		}
	}
	if len(ann) == 0 {
		delete(meta, "annotations")
	}
}

// rename replaces every string of v that is a key of names with its value.
func rename(v any, names map[string]string) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = rename(e, names)
		}
	case []any:
		for i, e := range x {
			x[i] = rename(e, names)
		}
	case string:
		if n, ok := names[x]; ok {
			return n
		}
	}
	return v
}

// jsonRound is v through JSON: numbers float64, maps map[string]any.
func jsonRound(t *testing.T, v any) any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// diff lists where a and b (JSON values) differ, by path.
func diff(path string, a, b any) []string {
	am, aok := a.(map[string]any)
	bm, bok := b.(map[string]any)
	if aok && bok {
		var out []string
		for _, k := range slices.Sorted(keysOfAny(am, bm)) {
			av, ain := am[k]
			bv, bin := bm[k]
			p := path + "." + k
			switch {
			case !ain:
				out = append(out, fmt.Sprintf("%s: only deploy/kubernetes has it (%v)", p, short(bv)))
			case !bin:
				out = append(out, fmt.Sprintf("%s: only the chart has it (%v)", p, short(av)))
			default:
				out = append(out, diff(p, av, bv)...)
			}
		}
		return out
	}
	as, aok := a.([]any)
	bs, bok := b.([]any)
	if aok && bok && len(as) == len(bs) {
		var out []string
		for i := range as {
			out = append(out, diff(fmt.Sprintf("%s[%d]", path, i), as[i], bs[i])...)
		}
		return out
	}
	if !reflect.DeepEqual(a, b) {
		return []string{fmt.Sprintf("%s: the chart has %v, deploy/kubernetes %v", path, short(a), short(b))}
	}
	return nil
}

func short(v any) string {
	b, _ := json.Marshal(v)
	if len(b) > 300 {
		return string(b[:300]) + "…"
	}
	return string(b)
}

// keysOfAny iterates over the keys of both maps, each once.
func keysOfAny[V any](a, b map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		ks := map[string]bool{}
		for k := range a {
			ks[k] = true
		}
		for k := range b {
			ks[k] = true
		}
		all := make([]string, 0, len(ks))
		for k := range ks {
			all = append(all, k)
		}
		sort.Strings(all)
		for _, k := range all {
			if !yield(k) {
				return
			}
		}
	}
}
