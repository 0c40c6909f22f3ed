package kubeapi

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// The variables naming the helm and kustomize binaries the tests render
// the deployment with (.ci/run builds them with test/helm/build.sh).
const (
	HelmEnv      = "TLGATE_HELM"
	KustomizeEnv = "TLGATE_KUSTOMIZE"
)

// Binary returns the binary the variable env names, or skips the test
// when it is unset outside CI (under CI it fails).
func Binary(t testing.TB, env string) string {
	t.Helper()
	bin := os.Getenv(env)
	if bin == "" {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s is not set: .ci/run builds helm and kustomize with test/helm/build.sh and names them there", env)
		}
		t.Skipf("%s is not set (build helm and kustomize: test/helm/build.sh DIR, then %s=DIR/%s)", env, env, strings.ToLower(strings.TrimPrefix(env, "TLGATE_")))
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("%s: %v", env, err)
	}
	return bin
}

// HelmTemplate renders chart as release in namespace ns with the further
// arguments of helm template (-f values.yaml, --set ...) and returns what
// it printed, or its error with what it said.
func HelmTemplate(t testing.TB, chart, release, ns string, args ...string) ([]byte, error) {
	t.Helper()
	helm := Binary(t, HelmEnv)
	cmd := exec.Command(helm, append([]string{"template", release, chart, "--namespace", ns}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("helm template %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.Bytes(), nil
}

// Render is HelmTemplate decoded into objects; an error fails the test.
func Render(t testing.TB, chart, release, ns string, args ...string) []*unstructured.Unstructured {
	t.Helper()
	out, err := HelmTemplate(t, chart, release, ns, args...)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := Decode(out)
	if err != nil {
		t.Fatalf("helm template output: %v", err)
	}
	return objs
}

// KustomizeBuild runs kustomize build on dir and decodes its output.
func KustomizeBuild(t testing.TB, dir string) []*unstructured.Unstructured {
	t.Helper()
	kustomize := Binary(t, KustomizeEnv)
	cmd := exec.Command(kustomize, "build", dir)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("kustomize build %s: %v\n%s", dir, err, stderr.String())
	}
	objs, err := Decode(stdout.Bytes())
	if err != nil {
		t.Fatalf("kustomize build output: %v", err)
	}
	return objs
}

// Find returns the object of kind whose name is name (or starts with
// name+"-" when prefix: a kustomize-generated ConfigMap's hashed name), or
// nil.
func Find(objs []*unstructured.Unstructured, kind, name string, prefix bool) *unstructured.Unstructured {
	for _, u := range objs {
		if u.GetKind() != kind {
			continue
		}
		if u.GetName() == name || prefix && strings.HasPrefix(u.GetName(), name+"-") {
			return u
		}
	}
	return nil
}

// SecretValues returns a Secret's values (data decoded, stringData as is).
func SecretValues(u *unstructured.Unstructured) (map[string]string, error) {
	out := map[string]string{}
	data, _, _ := unstructured.NestedStringMap(u.Object, "data")
	for k, v := range data {
		b, err := base64.StdEncoding.DecodeString(v)
		if err != nil {
			return nil, fmt.Errorf("%s: data %s: %w", ObjectID(u), k, err)
		}
		out[k] = string(b)
	}
	sd, _, _ := unstructured.NestedStringMap(u.Object, "stringData")
	for k, v := range sd {
		out[k] = v
	}
	return out, nil
}
