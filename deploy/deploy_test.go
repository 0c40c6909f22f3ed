// Package deploy holds tlgate's deployment files: a Grafana dashboard,
// Prometheus alert rules, a Dockerfile, a Helm chart, Kubernetes manifests
// and a systemd unit. Its tests check each file with the tool made for it
// (promtool, systemd-analyze, helm lint, and a real kube-apiserver that
// every rendered manifest is applied to as a server-side dry run) and
// against the gateway itself: every metric a dashboard or alert reads is
// one the gateway exports, the configuration the manifests ship loads, the
// ports, paths, user and secrets agree across files, the chart's defaults
// render the kustomization's objects, and the Dockerfile's build command
// yields a static binary.
package deploy

import (
	"bytes"
	"debug/elf"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.yaml.in/yaml/v3"

	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/adapter/metrics"
)

// tool returns the path of a command the checks need. Outside CI a missing
// tool skips the check; in CI (.ci/run installs them) it fails it.
func tool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s is not installed: .ci/run must install it", name)
		}
		t.Skipf("%s is not installed", name)
	}
	return p
}

// recorder is a prometheus.Registerer that keeps what is registered.
type recorder struct{ cs []prometheus.Collector }

func (r *recorder) Register(c prometheus.Collector) error   { r.cs = append(r.cs, c); return nil }
func (r *recorder) MustRegister(cs ...prometheus.Collector) { r.cs = append(r.cs, cs...) }
func (r *recorder) Unregister(prometheus.Collector) bool    { return false }

var fqName = regexp.MustCompile(`fqName: "([a-zA-Z_:][a-zA-Z0-9_:]*)"`)

// exported lists every series name the gateway's metrics can have
// (histograms with their _bucket, _sum and _count).
func exported(t *testing.T) map[string]bool {
	t.Helper()
	r := &recorder{}
	if _, err := metrics.New(r); err != nil {
		t.Fatal(err)
	}
	if _, err := metrics.NewKeyMetrics(r); err != nil {
		t.Fatal(err)
	}
	if _, err := metrics.NewSyncMetrics(r); err != nil {
		t.Fatal(err)
	}
	if _, err := metrics.NewDiscoveryMetrics(r); err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, c := range r.cs {
		ch := make(chan *prometheus.Desc, 16)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			m := fqName.FindStringSubmatch(d.String())
			if m == nil {
				t.Fatalf("cannot read the name of %s", d)
			}
			names[m[1]] = true
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				names[m[1]+s] = true
			}
		}
	}
	if len(names) < 20 {
		t.Fatalf("only %d metric names found", len(names))
	}
	return names
}

var metricRef = regexp.MustCompile(`\btlgate_[a-z0-9_]+\b`)

// checkMetrics fails for every tlgate_ name in expr the gateway does not
// export.
func checkMetrics(t *testing.T, where, expr string, names map[string]bool) {
	t.Helper()
	for _, m := range metricRef.FindAllString(expr, -1) {
		if !names[m] {
			t.Errorf("%s reads %s, which the gateway does not export", where, m)
		}
	}
}

// promtoolCheck writes exprs as recording rules and runs promtool check
// rules on them: each must be valid PromQL.
func promtoolCheck(t *testing.T, exprs map[string]string) {
	t.Helper()
	promtool := tool(t, "promtool")
	type rule struct {
		Record string `yaml:"record"`
		Expr   string `yaml:"expr"`
	}
	var rules []rule
	keys := make([]string, 0, len(exprs))
	for k := range exprs {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for i, k := range keys {
		e := strings.NewReplacer("$__rate_interval", "5m", "$route", ".*").Replace(exprs[k])
		rules = append(rules, rule{Record: fmt.Sprintf("dashboard:expr_%d", i), Expr: e})
	}
	b, err := yaml.Marshal(map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rules}}})
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "dashboard.rules.yml")
	if err := os.WriteFile(f, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "check", "rules", f).CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules on the dashboard's queries: %v\n%s", err, out)
	}
}

func TestGrafanaDashboard(t *testing.T) {
	b, err := os.ReadFile("grafana/tlgate.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		UID    string `json:"uid"`
		Title  string `json:"title"`
		Panels []struct {
			ID      int    `json:"id"`
			Type    string `json:"type"`
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
			GridPos struct{ X, Y, W, H int } `json:"gridPos"`
		} `json:"panels"`
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&dash); err != nil {
		t.Fatalf("grafana/tlgate.json: %v", err)
	}
	if dash.UID == "" || dash.Title == "" {
		t.Fatal("the dashboard has no uid or title")
	}
	names := exported(t)
	exprs := map[string]string{}
	ids := map[int]bool{}
	for _, p := range dash.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d is used twice", p.ID)
		}
		ids[p.ID] = true
		if p.GridPos.W <= 0 || p.GridPos.X+p.GridPos.W > 24 {
			t.Errorf("panel %q is placed off the 24-column grid: %+v", p.Title, p.GridPos)
		}
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for i, tg := range p.Targets {
			where := fmt.Sprintf("panel %q query %d", p.Title, i)
			checkMetrics(t, where, tg.Expr, names)
			exprs[where] = tg.Expr
		}
	}
	if len(exprs) < 15 {
		t.Fatalf("only %d queries", len(exprs))
	}
	promtoolCheck(t, exprs)
}

// TestGrafanaFleetPanelsCountEachWorkerOnce: every replica exports its
// view of the whole fleet (engines heartbeat to every replica), so the
// fleet panels must not sum those views. promtool evaluates their queries
// over three replicas (the instance and pod labels the chart's
// ServiceMonitor adds) that each see 2 routable workers of model m and 1
// ejected: the panels say 2 and 1, not 6 and 3.
func TestGrafanaFleetPanelsCountEachWorkerOnce(t *testing.T) {
	promtool := tool(t, "promtool")
	b, err := os.ReadFile("grafana/tlgate.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatal(err)
	}
	first := func(title string) string {
		for _, p := range dash.Panels {
			if p.Title == title && len(p.Targets) > 0 {
				return p.Targets[0].Expr
			}
		}
		t.Fatalf("no panel %q", title)
		return ""
	}
	type sample struct {
		Labels string  `yaml:"labels"`
		Value  float64 `yaml:"value"`
	}
	type exprTest struct {
		Expr     string   `yaml:"expr"`
		EvalTime string   `yaml:"eval_time"`
		Samples  []sample `yaml:"exp_samples"`
	}
	tests := []exprTest{
		{first("Routable workers"), "5m", []sample{{"{}", 2}}},
		{first("Workers by model and state"), "5m", []sample{{`{model="m",state="routable"}`, 2}}},
		{first("Ejected workers"), "5m", []sample{{`{model="m"}`, 1}}},
	}
	type series struct {
		Series string `yaml:"series"`
		Values string `yaml:"values"`
	}
	var in []series
	for i := range 3 {
		replica := fmt.Sprintf(`instance="10.0.0.%d:8080",pod="tlgate-%d"`, i+1, i)
		in = append(in,
			series{fmt.Sprintf(`tlgate_workers{%s,model="m",role="unified",state="routable"}`, replica), "2x10"},
			series{fmt.Sprintf(`tlgate_ejected_workers{%s,model="m"}`, replica), "1x10"})
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "none.yml"), []byte("groups: []\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	file, err := yaml.Marshal(map[string]any{
		"rule_files":          []string{"none.yml"},
		"evaluation_interval": "1m",
		"tests": []any{map[string]any{
			"interval":         "1m",
			"input_series":     in,
			"promql_expr_test": tests,
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "fleet_test.yml"), file, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(promtool, "test", "rules", "fleet_test.yml")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("the fleet panels count each worker once per replica: %v\n%s", err, out)
	}
}

func TestAlertRules(t *testing.T) {
	promtool := tool(t, "promtool")
	b, err := os.ReadFile("prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(b, &file); err != nil {
		t.Fatal(err)
	}
	names := exported(t)
	var alerts []string
	for _, g := range file.Groups {
		for _, r := range g.Rules {
			checkMetrics(t, "alert "+r.Alert, r.Expr, names)
			alerts = append(alerts, r.Alert)
		}
	}
	for _, want := range []string{"TlgateModelNoRoutableWorker", "TlgateHighFailoverRate", "TlgateUpstreamFailedRate", "TlgateHeartbeatsRejected"} {
		if !slices.Contains(alerts, want) {
			t.Errorf("alert %s is missing", want)
		}
	}
	for _, args := range [][]string{{"check", "rules", "alerts.yml"}, {"test", "rules", "alerts_test.yml"}} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = "prometheus"
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// manifest is the part of a Kubernetes object the checks read.
type manifest struct {
	Kind     string `yaml:"kind"`
	Metadata struct {
		Name string `yaml:"name"`
	} `yaml:"metadata"`
	StringData map[string]string `yaml:"stringData"`
	// Rules, RoleRef and Subjects are a Role's and a RoleBinding's.
	Rules []struct {
		APIGroups []string `yaml:"apiGroups"`
		Resources []string `yaml:"resources"`
		Verbs     []string `yaml:"verbs"`
	} `yaml:"rules"`
	RoleRef struct {
		Kind string `yaml:"kind"`
		Name string `yaml:"name"`
	} `yaml:"roleRef"`
	Subjects []struct {
		Kind string `yaml:"kind"`
		Name string `yaml:"name"`
	} `yaml:"subjects"`
	Spec struct {
		Replicas       int    `yaml:"replicas"`
		ClusterIP      string `yaml:"clusterIP"`
		ServiceName    string `yaml:"serviceName"`
		MaxUnavailable int    `yaml:"maxUnavailable"`
		MinAvailable   int    `yaml:"minAvailable"`
		// UnhealthyPodEvictionPolicy is a PodDisruptionBudget's.
		UnhealthyPodEvictionPolicy string `yaml:"unhealthyPodEvictionPolicy"`
		Selector                   struct {
			MatchLabels map[string]string `yaml:"matchLabels"`
		} `yaml:"selector"`
		Strategy struct {
			RollingUpdate struct {
				MaxUnavailable int `yaml:"maxUnavailable"`
			} `yaml:"rollingUpdate"`
		} `yaml:"strategy"`
		Ports []struct {
			Name       string `yaml:"name"`
			Port       int    `yaml:"port"`
			TargetPort string `yaml:"targetPort"`
		} `yaml:"ports"`
		Template struct {
			Metadata struct {
				Labels map[string]string `yaml:"labels"`
			} `yaml:"metadata"`
			Spec struct {
				ServiceAccountName            string `yaml:"serviceAccountName"`
				TerminationGracePeriodSeconds int    `yaml:"terminationGracePeriodSeconds"`
				SecurityContext               struct {
					RunAsNonRoot bool `yaml:"runAsNonRoot"`
					RunAsUser    int  `yaml:"runAsUser"`
				} `yaml:"securityContext"`
				Containers []struct {
					Image     string   `yaml:"image"`
					Args      []string `yaml:"args"`
					Lifecycle struct {
						PreStop struct {
							Sleep *struct {
								Seconds int `yaml:"seconds"`
							} `yaml:"sleep"`
						} `yaml:"preStop"`
					} `yaml:"lifecycle"`
					Ports []struct {
						Name          string `yaml:"name"`
						ContainerPort int    `yaml:"containerPort"`
					} `yaml:"ports"`
					Env []struct {
						Name      string `yaml:"name"`
						ValueFrom struct {
							SecretKeyRef struct {
								Name string `yaml:"name"`
								Key  string `yaml:"key"`
							} `yaml:"secretKeyRef"`
						} `yaml:"valueFrom"`
					} `yaml:"env"`
					ReadinessProbe probe `yaml:"readinessProbe"`
					LivenessProbe  probe `yaml:"livenessProbe"`
					VolumeMounts   []struct {
						Name      string `yaml:"name"`
						MountPath string `yaml:"mountPath"`
					} `yaml:"volumeMounts"`
				} `yaml:"containers"`
				Volumes []struct {
					Name      string `yaml:"name"`
					ConfigMap struct {
						Name string `yaml:"name"`
					} `yaml:"configMap"`
				} `yaml:"volumes"`
			} `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

type probe struct {
	PeriodSeconds    int `yaml:"periodSeconds"`
	FailureThreshold int `yaml:"failureThreshold"`
	HTTPGet          struct {
		Path string `yaml:"path"`
		Port string `yaml:"port"`
	} `yaml:"httpGet"`
}

func readManifests(t *testing.T, dir string) map[string]manifest {
	t.Helper()
	var kust struct {
		Resources          []string `yaml:"resources"`
		ConfigMapGenerator []struct {
			Name  string   `yaml:"name"`
			Files []string `yaml:"files"`
		} `yaml:"configMapGenerator"`
	}
	b, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &kust); err != nil {
		t.Fatal(err)
	}
	out := map[string]manifest{}
	for _, res := range kust.Resources {
		b, err := os.ReadFile(filepath.Join(dir, res))
		if err != nil {
			t.Fatalf("kustomization lists %s: %v", res, err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(b))
		for {
			var m manifest
			if err := dec.Decode(&m); err != nil {
				if err.Error() == "EOF" {
					break
				}
				t.Fatalf("%s: %v", res, err)
			}
			id := m.Kind + "/" + m.Metadata.Name
			if _, dup := out[id]; dup {
				t.Fatalf("%s: %s is defined twice (kustomize refuses a second object with the same id)", res, id)
			}
			out[id] = m
		}
	}
	for _, g := range kust.ConfigMapGenerator {
		for _, f := range g.Files {
			if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
				t.Fatalf("configMapGenerator %s: %v", g.Name, err)
			}
		}
		out["ConfigMap/"+g.Name] = manifest{Kind: "ConfigMap"}
	}
	return out
}

func TestKubernetesManifests(t *testing.T) {
	ms := readManifests(t, "kubernetes")
	dep, ok := ms["Deployment/tlgate"]
	if !ok {
		t.Fatalf("no Deployment tlgate in %v", keysOf(ms))
	}
	if dep.Spec.Replicas != 3 {
		t.Errorf("replicas = %d, want 3", dep.Spec.Replicas)
	}
	pod := dep.Spec.Template.Spec
	if !pod.SecurityContext.RunAsNonRoot || pod.SecurityContext.RunAsUser != dockerUser(t) {
		t.Errorf("the pod runs as %d (non-root %v); the image's user is %d", pod.SecurityContext.RunAsUser, pod.SecurityContext.RunAsNonRoot, dockerUser(t))
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers", len(pod.Containers))
	}
	c := pod.Containers[0]

	// The shipped configuration loads, with the Secret's keys as its
	// environment.
	secret, ok := ms["Secret/tlgate-keys"]
	if !ok || len(c.Env) == 0 {
		t.Fatal("the container takes no environment from the Secret tlgate-keys")
	}
	for _, e := range c.Env {
		ref := e.ValueFrom.SecretKeyRef
		v, ok := secret.StringData[ref.Key]
		if ref.Name != "tlgate-keys" || !ok {
			t.Fatalf("the container's variable %s comes from key %q of Secret %q, which the manifests do not hold", e.Name, ref.Key, ref.Name)
		}
		t.Setenv(e.Name, v)
	}
	cfg, err := config.Load(filepath.Join("kubernetes", "gateway.toml"))
	if err != nil {
		t.Fatalf("the shipped configuration does not load with the Secret's keys: %v", err)
	}
	gw := cfg.Gateway
	if len(gw.APIKeys) == 0 {
		t.Error("the shipped configuration has no API keys")
	}
	// Replicas with file stores would each keep a route table of their own.
	if dep.Spec.Replicas > 1 && gw.Store.Kind != "etcd" {
		t.Errorf("%d replicas with store kind %q: they would not share routes and drains", dep.Spec.Replicas, gw.Store.Kind)
	}

	// Ports: the container's, the config's listeners and the Services'.
	ports := map[string]int{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	for name, addr := range map[string]string{"http": gw.Listen, "registry": gw.RegistryListen} {
		if want := fmt.Sprintf(":%d", ports[name]); !strings.HasSuffix(addr, want) || !strings.HasPrefix(addr, "0.0.0.0:") {
			t.Errorf("container port %s is %d, the config listens on %s", name, ports[name], addr)
		}
	}
	for _, svc := range []string{"Service/tlgate", "Service/tlgate-registry"} {
		s, ok := ms[svc]
		if !ok {
			t.Fatalf("no %s", svc)
		}
		for _, p := range s.Spec.Ports {
			if _, ok := ports[p.TargetPort]; !ok {
				t.Errorf("%s targets port %q, which the container does not name", svc, p.TargetPort)
			}
		}
	}
	if ms["Service/tlgate-registry"].Spec.ClusterIP != "None" {
		t.Error("the registry Service must be headless: engines heartbeat to every replica")
	}
	if c.ReadinessProbe.HTTPGet.Path != "/readyz" || c.LivenessProbe.HTTPGet.Path != "/healthz" {
		t.Errorf("probes: readiness %q, liveness %q", c.ReadinessProbe.HTTPGet.Path, c.LivenessProbe.HTTPGet.Path)
	}
	checkRollingUpdate(t, ms, dep, gw)
	checkImages(t, dep)
	checkEtcd(t, ms, gw)
	checkDiscovery(t, ms, dep, gw)

	// The config file the container is told to read is the ConfigMap's,
	// and the state directory is writable (a volume).
	mounts := map[string]string{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = m.Name
	}
	if len(c.Args) != 2 || c.Args[0] != "-config" || mounts[filepath.Dir(c.Args[1])] == "" {
		t.Errorf("args %v do not read a mounted config", c.Args)
	}
	if filepath.Base(c.Args[1]) != "gateway.toml" {
		t.Errorf("the container reads %s; the ConfigMap holds gateway.toml", c.Args[1])
	}
	if mounts[gw.StateDir] == "" {
		t.Errorf("state_dir %s is not a mounted volume (the root filesystem is read-only)", gw.StateDir)
	}
	var cmName string
	for _, v := range pod.Volumes {
		if v.Name == mounts[filepath.Dir(c.Args[1])] {
			cmName = v.ConfigMap.Name
		}
	}
	if _, ok := ms["ConfigMap/"+cmName]; !ok {
		t.Errorf("the config volume names ConfigMap %q, which kustomization does not make", cmName)
	}
}

// checkRollingUpdate: a stop (preStop sleep, then shutdown_delay with
// /readyz 503, then shutdown_timeout for requests in flight) fits in the
// grace period; the readiness probe sees the 503 within shutdown_delay; the
// PodDisruptionBudget covers the gateway's pods and leaves replicas
// serving; the rolling update never goes below the replica count.
func checkRollingUpdate(t *testing.T, ms map[string]manifest, dep manifest, gw config.Gateway) {
	t.Helper()
	pod := dep.Spec.Template.Spec
	c := pod.Containers[0]
	sleep := c.Lifecycle.PreStop.Sleep
	if sleep == nil || sleep.Seconds <= 0 {
		t.Fatal("the container has no preStop sleep: endpoints must learn of a deletion before SIGTERM")
	}
	preStop := time.Duration(sleep.Seconds) * time.Second
	if gw.ShutdownDelay.Duration <= 0 {
		t.Errorf("shutdown_delay is %v: a rolling update would refuse requests while endpoints catch up", gw.ShutdownDelay.Duration)
	}
	need := preStop + gw.ShutdownDelay.Duration + gw.ShutdownTimeout.Duration
	if grace := time.Duration(pod.TerminationGracePeriodSeconds) * time.Second; grace <= need {
		t.Errorf("terminationGracePeriodSeconds %v is not longer than preStop %v + shutdown_delay %v + shutdown_timeout %v",
			grace, preStop, gw.ShutdownDelay.Duration, gw.ShutdownTimeout.Duration)
	}
	rp := c.ReadinessProbe
	if seen := time.Duration(rp.PeriodSeconds*max(rp.FailureThreshold, 1)) * time.Second; seen > gw.ShutdownDelay.Duration {
		t.Errorf("the readiness probe takes %v (%d × %ds) to see /readyz's 503, longer than shutdown_delay %v",
			seen, max(rp.FailureThreshold, 1), rp.PeriodSeconds, gw.ShutdownDelay.Duration)
	}
	if dep.Spec.Strategy.RollingUpdate.MaxUnavailable != 0 {
		t.Errorf("the rolling update's maxUnavailable is %d, want 0 (surge first)", dep.Spec.Strategy.RollingUpdate.MaxUnavailable)
	}
	pdb, ok := ms["PodDisruptionBudget/tlgate"]
	if !ok {
		t.Fatalf("no PodDisruptionBudget tlgate in %v", keysOf(ms))
	}
	if !selects(pdb.Spec.Selector.MatchLabels, dep.Spec.Template.Metadata.Labels) {
		t.Errorf("the PodDisruptionBudget's selector %v does not select the pods (labels %v)", pdb.Spec.Selector.MatchLabels, dep.Spec.Template.Metadata.Labels)
	}
	available := dep.Spec.Replicas - pdb.Spec.MaxUnavailable
	if pdb.Spec.MinAvailable > 0 {
		available = pdb.Spec.MinAvailable
	}
	if pdb.Spec.MaxUnavailable < 0 || available < 2 || available >= dep.Spec.Replicas {
		t.Errorf("the PodDisruptionBudget keeps %d of %d replicas: want at least 2 serving, and a drain able to move one", available, dep.Spec.Replicas)
	}
	// With no engine routable every replica's /readyz is 503: the budget
	// must still let a drain evict those unready pods.
	if pdb.Spec.UnhealthyPodEvictionPolicy != "AlwaysAllow" {
		t.Errorf("the PodDisruptionBudget's unhealthyPodEvictionPolicy is %q, want AlwaysAllow: with every replica unready a drain would wait for ever", pdb.Spec.UnhealthyPodEvictionPolicy)
	}
}

// selects reports whether every label of sel is in labels.
func selects(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// checkImages: the gateway's image is named in kustomization.yaml's images
// (kustomize edit set image), with a version, not tlgate:latest.
func checkImages(t *testing.T, dep manifest) {
	t.Helper()
	var kust struct {
		Images []struct {
			Name    string `yaml:"name"`
			NewName string `yaml:"newName"`
			NewTag  string `yaml:"newTag"`
		} `yaml:"images"`
	}
	b, err := os.ReadFile(filepath.Join("kubernetes", "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &kust); err != nil {
		t.Fatal(err)
	}
	img := dep.Spec.Template.Spec.Containers[0].Image
	if strings.Contains(img, ":") {
		t.Errorf("deployment.yaml names the image %q with a tag: name it in kustomization.yaml's images instead", img)
	}
	for _, i := range kust.Images {
		if i.Name == img {
			if i.NewName == "" || i.NewTag == "" || i.NewTag == "latest" {
				t.Errorf("kustomization.yaml's image %s is %s:%s: want a registry name and a version", img, i.NewName, i.NewTag)
			}
			return
		}
	}
	t.Errorf("kustomization.yaml's images do not set the image %q", img)
}

// checkEtcd: the store's endpoints are the members of the etcd StatefulSet
// shipped beside the gateway, whose PodDisruptionBudget keeps a quorum.
func checkEtcd(t *testing.T, ms map[string]manifest, gw config.Gateway) {
	t.Helper()
	sts, ok := ms["StatefulSet/tlgate-etcd"]
	if !ok {
		t.Fatalf("no StatefulSet tlgate-etcd in %v", keysOf(ms))
	}
	if svc, ok := ms["Service/"+sts.Spec.ServiceName]; !ok || svc.Spec.ClusterIP != "None" {
		t.Errorf("the etcd StatefulSet's service %q is not a headless Service of the manifests", sts.Spec.ServiceName)
	}
	var want []string
	for i := range sts.Spec.Replicas {
		want = append(want, fmt.Sprintf("http://%s-%d.%s:2379", sts.Metadata.Name, i, sts.Spec.ServiceName))
	}
	if !slices.Equal(gw.Store.Endpoints, want) {
		t.Errorf("[gateway.store] endpoints %v, the StatefulSet's members are %v", gw.Store.Endpoints, want)
	}
	pdb, ok := ms["PodDisruptionBudget/tlgate-etcd"]
	quorum := sts.Spec.Replicas/2 + 1
	if !ok || sts.Spec.Replicas-pdb.Spec.MaxUnavailable < quorum || pdb.Spec.MaxUnavailable < 1 {
		t.Errorf("etcd's PodDisruptionBudget must keep a quorum of %d of %d members (got maxUnavailable %d)", quorum, sts.Spec.Replicas, pdb.Spec.MaxUnavailable)
	}
}

// checkDiscovery: engines are discovered from the API server, not listed,
// and the pods run as the ServiceAccount the manifests make.
func checkDiscovery(t *testing.T, ms map[string]manifest, dep manifest, gw config.Gateway) {
	t.Helper()
	if len(gw.Engines) > 0 {
		t.Errorf("the shipped configuration lists %d engines: they are discovered by label", len(gw.Engines))
	}
	var k8s int
	for _, d := range gw.Discovery {
		if d.Kind == config.DiscoveryKubernetes && d.Selector != "" {
			k8s++
		}
	}
	if k8s == 0 {
		t.Error("the shipped configuration has no [[gateway.discovery]] kubernetes source with a label selector")
	}
	sa := dep.Spec.Template.Spec.ServiceAccountName
	if _, ok := ms["ServiceAccount/"+sa]; sa == "" || !ok {
		t.Errorf("the pods run as ServiceAccount %q, which the manifests do not make", sa)
	}
	// The Role bound to it: list and watch on what the sources read
	// (Pods for a selector, EndpointSlices for a service), nothing more.
	need := map[string]bool{}
	for _, d := range gw.Discovery {
		switch {
		case d.Kind != config.DiscoveryKubernetes:
		case d.Selector != "":
			need["pods"] = true
		default:
			need["endpointslices"] = true
		}
	}
	granted := map[string]bool{}
	for id, m := range ms {
		if m.Kind != "RoleBinding" || m.RoleRef.Kind != "Role" {
			continue
		}
		bound := false
		for _, sub := range m.Subjects {
			bound = bound || sub.Kind == "ServiceAccount" && sub.Name == sa
		}
		role, ok := ms["Role/"+m.RoleRef.Name]
		if !bound || !ok {
			continue
		}
		for _, r := range role.Rules {
			for _, v := range r.Verbs {
				if v != "list" && v != "watch" {
					t.Errorf("%s grants %q through Role %s: discovery needs list and watch only", id, v, m.RoleRef.Name)
				}
			}
			for _, res := range r.Resources {
				if res != "pods" && res != "endpointslices" {
					t.Errorf("%s grants %s through Role %s: discovery reads only pods and endpointslices", id, res, m.RoleRef.Name)
				}
				granted[res] = slices.Contains(r.Verbs, "list") && slices.Contains(r.Verbs, "watch")
			}
		}
	}
	for res := range need {
		if !granted[res] {
			t.Errorf("no Role bound to ServiceAccount %s grants list and watch on %s, which [[gateway.discovery]] reads", sa, res)
		}
	}
}

// dockerUser returns the numeric user of the Dockerfile's final stage.
func dockerUser(t *testing.T) int {
	t.Helper()
	lines := dockerLines(t)
	var user string
	for _, l := range lines {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "USER" {
			user = f[1]
		}
	}
	var uid int
	if _, err := fmt.Sscanf(user, "%d", &uid); err != nil || uid == 0 {
		t.Fatalf("the image's USER %q is not a numeric non-root user", user)
	}
	return uid
}

// dockerLines returns the Dockerfile's instructions, continuations joined.
func dockerLines(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	var cur strings.Builder
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "#") {
			continue
		}
		if s, ok := strings.CutSuffix(l, "\\"); ok {
			cur.WriteString(s + " ")
			continue
		}
		cur.WriteString(l)
		if s := strings.TrimSpace(cur.String()); s != "" {
			out = append(out, s)
		}
		cur.Reset()
	}
	return out
}

// TestDockerfile checks the image's shape (a build stage and a final stage
// with a non-root user, the ports the config listens on, the config path
// the Kubernetes example mounts) and runs the Dockerfile's build command
// for the gateway: it must give a static binary (no interpreter, nothing
// dynamic), which a distroless image needs.
func TestDockerfile(t *testing.T) {
	lines := dockerLines(t)
	var froms []string
	var build string
	var cmd, expose string
	for _, l := range lines {
		switch f := strings.Fields(l); f[0] {
		case "FROM":
			froms = append(froms, l)
		case "RUN":
			for _, part := range strings.Split(strings.TrimPrefix(l, "RUN "), "&&") {
				if strings.Contains(part, "go build") && strings.Contains(part, "./cmd/gateway") {
					build = strings.TrimSpace(part)
				}
			}
		case "CMD":
			cmd = l
		case "EXPOSE":
			expose = l
		}
	}
	if len(froms) != 2 || !strings.Contains(froms[1], "static") {
		t.Errorf("want a build stage and a static final stage, got %q", froms)
	}
	dockerUser(t)
	if !strings.Contains(cmd, `"/etc/tlgate/gateway.toml"`) {
		t.Errorf("CMD %q does not read /etc/tlgate/gateway.toml", cmd)
	}
	if expose != "EXPOSE 8080 9090" {
		t.Errorf("%q does not expose the example's listeners", expose)
	}
	if build == "" || !strings.Contains(build, " -o /out/gateway ") {
		t.Fatalf("no go build of ./cmd/gateway -o /out/gateway in the Dockerfile (found %q)", build)
	}
	checkStateDirOwned(t, lines)

	// Run the same build, from the repository root, into a temporary file.
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "gateway")
	c := exec.Command(sh, "-c", strings.Replace(build, " -o /out/gateway ", " -o "+out+" ", 1))
	c.Dir = ".."
	if b, err := c.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", build, err, b)
	}
	f, err := elf.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Fatalf("the binary is not static: it has a %v program header", p.Type)
		}
	}
	if fi, err := os.Stat(out); err == nil {
		t.Logf("the image's gateway binary: %.1f MB", float64(fi.Size())/1e6)
	}

	// Built without the servers only the replicas demo runs: no embedded
	// etcd or NATS server is linked, and -demo -replicas says why it
	// cannot run.
	m := buildTags.FindStringSubmatch(build)
	if m == nil || m[1] != "noembed" {
		t.Fatalf("the gateway is built without -tags noembed: %q", build)
	}
	deps, err := exec.Command("go", "list", "-deps", "-tags", m[1], "../cmd/gateway").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range strings.Fields(string(deps)) {
		if strings.HasPrefix(p, "go.etcd.io/etcd/server/") || strings.HasPrefix(p, "github.com/nats-io/nats-server/") {
			t.Errorf("the image's gateway links %s", p)
		}
	}
	b, err := exec.Command(out, "-demo", "-replicas", "2").CombinedOutput()
	if err == nil || !strings.Contains(string(b), "built with -tags noembed") {
		t.Errorf("-demo -replicas 2 in the image's gateway: %v\n%s", err, b)
	}
	checkDockerRunExample(t, out)
}

// checkDockerRunExample: the docker run of the Dockerfile's comment mounts
// a configuration of the repository that the image's gateway (bin) accepts
// with -check, in an empty working directory (the image's state directory),
// given only the variables the example passes with -e: the example starts.
func checkDockerRunExample(t *testing.T, bin string) {
	t.Helper()
	b, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var run string
	for _, l := range strings.Split(string(b), "\n") {
		l = strings.TrimSpace(strings.TrimPrefix(l, "#"))
		if strings.HasPrefix(l, "docker run") || run != "" && strings.HasSuffix(run, "\\") {
			run = strings.TrimSuffix(run, "\\") + " " + l
		}
	}
	m := dockerRunConfig.FindStringSubmatch(run)
	if m == nil {
		t.Fatalf("the Dockerfile's docker run example mounts no config of the repository at /etc/tlgate/gateway.toml: %q", run)
	}
	cfg, err := filepath.Abs(filepath.Join("..", m[1]))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-check", "-config", cfg)
	cmd.Dir = t.TempDir()
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	for _, e := range dockerRunEnv.FindAllStringSubmatch(run, -1) {
		cmd.Env = append(cmd.Env, e[1]+"=example")
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("the Dockerfile's docker run example (%s) does not start: gateway -check: %v\n%s", run, err, out)
	}
}

// checkStateDirOwned: the final stage's WORKDIR (where the file store's
// relative state_dir, "./tlgate-data" by default, is made) belongs to its
// USER: copied in with --chown of that user before WORKDIR names it, since
// WORKDIR creates a missing directory as root, and distroless has no shell
// to chown one. Kubernetes hides a root-owned one behind its volume and
// fsGroup; plain Docker does not.
func checkStateDirOwned(t *testing.T, lines []string) {
	t.Helper()
	var final []string
	for _, l := range lines {
		if strings.HasPrefix(l, "FROM ") {
			final = nil
		}
		final = append(final, l)
	}
	var user, workdir string
	owned := map[string]string{} // destination -> --chown, of the COPYs before WORKDIR
	for _, l := range final {
		f := strings.Fields(l)
		switch f[0] {
		case "USER":
			user = f[1]
		case "WORKDIR":
			if workdir == "" {
				workdir = f[1]
			}
		case "COPY":
			if workdir != "" {
				continue
			}
			for _, a := range f[1:] {
				if c, ok := strings.CutPrefix(a, "--chown="); ok {
					owned[strings.TrimSuffix(f[len(f)-1], "/")] = c
				}
			}
		}
	}
	if workdir == "" {
		t.Fatal("the final stage has no WORKDIR (the file store's state_dir is relative to it)")
	}
	if !strings.Contains(user, ":") {
		user += ":" + user
	}
	if got := owned[workdir]; got != user {
		t.Errorf("the final stage's WORKDIR %s is not copied in with --chown=%s before it (got %q): WORKDIR makes it root's, and the gateway (USER %s) cannot create its state_dir there",
			workdir, user, got, user)
	}
}

// dockerRunConfig matches the configuration a docker run mounts from the
// repository; dockerRunEnv each variable it passes.
var (
	dockerRunConfig = regexp.MustCompile(` -v \$PWD/(\S+):/etc/tlgate/gateway\.toml`)
	dockerRunEnv    = regexp.MustCompile(` -e ([A-Z0-9_]+)=`)
)

// buildTags matches a go build command's -tags.
var buildTags = regexp.MustCompile(` -tags[ =]([^ ]+) `)

// TestSystemdUnit runs systemd-analyze verify on the unit (with its
// ExecStart pointed at a real executable): any warning fails the test.
func TestSystemdUnit(t *testing.T) {
	b, err := os.ReadFile("systemd/tlgate.service")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"ExecStart=/usr/local/bin/gateway -config /etc/tlgate/gateway.toml", "ExecReload=/bin/kill -HUP $MAINPID", "DynamicUser=yes", "StateDirectory=tlgate"} {
		if !bytes.Contains(b, []byte(want)) {
			t.Errorf("the unit lacks %q", want)
		}
	}
	// The gateway lists this host's addresses (net.InterfaceAddrs, over a
	// netlink socket) so that an engine may not name its own wildcard
	// listeners: the unit must let it open one.
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "RestrictAddressFamilies="); ok && !slices.Contains(strings.Fields(v), "AF_NETLINK") {
			t.Errorf("the unit's RestrictAddressFamilies=%s lacks AF_NETLINK: the gateway could not list its own addresses", v)
		}
	}
	analyze := tool(t, "systemd-analyze")
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	unit := filepath.Join(t.TempDir(), "tlgate.service")
	if err := os.WriteFile(unit, bytes.ReplaceAll(b, []byte("/usr/local/bin/gateway"), []byte(self)), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(analyze, "verify", unit).CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
}

func keysOf(m map[string]manifest) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
