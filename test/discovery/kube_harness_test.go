package discovery_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/tlgate/tlgate/internal/adapter/store/embedetcd"
)

// apiserverEnv names the kube-apiserver binary the Kubernetes tests run
// (.ci/run builds it from test/kube).
const apiserverEnv = "TLGATE_KUBE_APISERVER"

// adminToken is the static token of the tests' cluster admin.
const adminToken = "tlgate-test-admin"

// kube is a real kube-apiserver over an embedded etcd, with a static token
// file (the admin, in system:masters), RBAC, and ServiceAccount tokens. No
// controllers run: the tests create EndpointSlices and Pods themselves.
type kube struct {
	t      *testing.T
	bin    string
	args   []string
	dir    string
	url    string
	ca     string // the serving certificate the apiserver made
	cmd    *exec.Cmd
	waited chan struct{}
	etcd   *embedetcd.Cluster
	Admin  kubernetes.Interface
}

// startKube starts the apiserver, or skips the test when no binary is
// named outside CI (under CI, with CI set, it fails).
func startKube(t *testing.T) *kube {
	t.Helper()
	bin := os.Getenv(apiserverEnv)
	if bin == "" {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s is not set: .ci/run builds the kube-apiserver from test/kube and names it there", apiserverEnv)
		}
		t.Skipf("%s is not set (build it: cd test/kube && go build -o kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver)", apiserverEnv)
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("%s: %v", apiserverEnv, err)
	}
	dir := t.TempDir()
	etcd, err := embedetcd.Start(filepath.Join(dir, "etcd"), 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(etcd.Close)

	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	saKey := write("sa.key", pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}))
	saPub := write("sa.pub", pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}))
	tokens := write("tokens.csv", []byte(adminToken+",admin,admin-uid,system:masters\n"))
	certDir := filepath.Join(dir, "certs")
	port := freePort(t, "127.0.0.1")
	k := &kube{t: t, bin: bin, dir: dir, etcd: etcd,
		url: "https://127.0.0.1:" + strconv.Itoa(port), ca: filepath.Join(certDir, "apiserver.crt"),
		args: []string{
			"--etcd-servers=" + etcd.Endpoints()[0],
			"--secure-port=" + strconv.Itoa(port), "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
			"--cert-dir=" + certDir,
			"--service-account-issuer=https://kubernetes.default.svc",
			"--service-account-key-file=" + saPub, "--service-account-signing-key-file=" + saKey,
			"--token-auth-file=" + tokens,
			"--authorization-mode=RBAC",
			"--service-cluster-ip-range=10.96.0.0/24",
			// No controllers run, so no namespace gets its default
			// ServiceAccount: pods are admitted without one.
			"--disable-admission-plugins=ServiceAccount",
			"--enable-priority-and-fairness=false",
			"--profiling=false",
		}}
	k.start()
	t.Cleanup(k.stop)
	admin, err := kubernetes.NewForConfig(k.rest(adminToken))
	if err != nil {
		t.Fatal(err)
	}
	k.Admin = admin
	return k
}

// start runs the apiserver and waits until /readyz answers 200.
func (k *kube) start() {
	k.t.Helper()
	log, err := os.OpenFile(filepath.Join(k.dir, "apiserver.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		k.t.Fatal(err)
	}
	defer log.Close()
	k.cmd = exec.Command(k.bin, k.args...)
	k.cmd.Stdout, k.cmd.Stderr = log, log
	if err := k.cmd.Start(); err != nil {
		k.t.Fatal(err)
	}
	k.waited = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) {
		_ = cmd.Wait()
		close(done)
	}(k.cmd, k.waited)
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	defer client.CloseIdleConnections()
	deadline := time.Now().Add(90 * time.Second)
	for {
		req, _ := http.NewRequest(http.MethodGet, k.url+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+adminToken)
		if resp, err := client.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		select {
		case <-k.waited:
			k.t.Fatalf("kube-apiserver exited:\n%s", k.logTail())
		default:
		}
		if time.Now().After(deadline) {
			k.t.Fatalf("kube-apiserver not ready after 90s:\n%s", k.logTail())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// stop ends the apiserver (SIGTERM, then SIGKILL) and waits for it.
func (k *kube) stop() {
	if k.cmd == nil {
		return
	}
	_ = k.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-k.waited:
	case <-time.After(20 * time.Second):
		_ = k.cmd.Process.Kill()
		<-k.waited
	}
	k.cmd = nil
}

// restart stops the apiserver and starts it again on the same port, etcd
// and keys.
func (k *kube) restart() {
	k.t.Helper()
	k.stop()
	k.start()
}

func (k *kube) logTail() string {
	b, _ := os.ReadFile(filepath.Join(k.dir, "apiserver.log"))
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// rest is a client config presenting token.
func (k *kube) rest(token string) *rest.Config {
	return &rest.Config{Host: k.url, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{CAFile: k.ca}, Timeout: 10 * time.Second}
}

// kubeconfig writes a kubeconfig file for token and returns its path.
func (k *kube) kubeconfig(token string) string {
	k.t.Helper()
	var b bytes.Buffer
	fmt.Fprintf(&b, `apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: gateway
  user:
    token: %s
contexts:
- name: test
  context:
    cluster: test
    user: gateway
current-context: test
`, k.url, k.ca, token)
	p := filepath.Join(k.t.TempDir(), "kubeconfig")
	if err := os.WriteFile(p, b.Bytes(), 0o600); err != nil {
		k.t.Fatal(err)
	}
	return p
}

// ctx is a context for one API call.
func (k *kube) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	k.t.Cleanup(cancel)
	return ctx
}
