// Package kubeapi runs a real kube-apiserver for a test (the binary .ci/run
// builds from test/kube, named by TLGATE_KUBE_APISERVER) over an embedded
// etcd, with a static token file (the test's admin, in system:masters),
// RBAC, and ServiceAccount tokens, and stops it at the end of the test. No
// controllers run: a test creates the Pods and EndpointSlices it needs and
// sets their status as the kubelet and the endpoint controller would.
//
// Beside the server it has the calls the deployment tests make of it:
// decode manifests, install CRDs, apply objects for real or as a
// server-side dry run, and get a ServiceAccount's token.
package kubeapi

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/tlgate/tlgate/internal/adapter/store/embedetcd"
)

// Env names the kube-apiserver binary the tests run (.ci/run builds it
// from test/kube).
const Env = "TLGATE_KUBE_APISERVER"

// AdminToken is the static token of the tests' cluster admin.
const AdminToken = "tlgate-test-admin"

// Server is a real kube-apiserver over an embedded etcd.
type Server struct {
	t      testing.TB
	bin    string
	args   []string
	dir    string
	url    string
	ca     string // the serving certificate the apiserver made
	cmd    *exec.Cmd
	waited chan struct{}
	etcd   *embedetcd.Cluster
	// Admin is a client presenting AdminToken.
	Admin kubernetes.Interface
}

// Start starts the apiserver, or skips the test when no binary is named
// outside CI (under CI, with CI set, it fails).
func Start(t testing.TB) *Server {
	t.Helper()
	bin := os.Getenv(Env)
	if bin == "" {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s is not set: .ci/run builds the kube-apiserver from test/kube and names it there", Env)
		}
		t.Skipf("%s is not set (build it: cd test/kube && go build -o kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver)", Env)
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("%s: %v", Env, err)
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
	tokens := write("tokens.csv", []byte(AdminToken+",admin,admin-uid,system:masters\n"))
	certDir := filepath.Join(dir, "certs")
	port := freePort(t)
	s := &Server{t: t, bin: bin, dir: dir, etcd: etcd,
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
	s.start()
	t.Cleanup(s.stop)
	admin, err := kubernetes.NewForConfig(s.Rest(AdminToken))
	if err != nil {
		t.Fatal(err)
	}
	s.Admin = admin
	return s
}

// freePort returns a port free on 127.0.0.1 at the time of the call.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// start runs the apiserver and waits until /readyz answers 200.
func (s *Server) start() {
	s.t.Helper()
	log, err := os.OpenFile(filepath.Join(s.dir, "apiserver.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		s.t.Fatal(err)
	}
	defer log.Close()
	s.cmd = exec.Command(s.bin, s.args...)
	s.cmd.Stdout, s.cmd.Stderr = log, log
	if err := s.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	s.waited = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) {
		_ = cmd.Wait()
		close(done)
	}(s.cmd, s.waited)
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	defer client.CloseIdleConnections()
	deadline := time.Now().Add(90 * time.Second)
	for {
		req, _ := http.NewRequest(http.MethodGet, s.url+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+AdminToken)
		if resp, err := client.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		select {
		case <-s.waited:
			s.t.Fatalf("kube-apiserver exited:\n%s", s.LogTail())
		default:
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("kube-apiserver not ready after 90s:\n%s", s.LogTail())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// stop ends the apiserver (SIGTERM, then SIGKILL) and waits for it.
func (s *Server) stop() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.waited:
	case <-time.After(20 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.waited
	}
	s.cmd = nil
}

// Restart stops the apiserver and starts it again on the same port, etcd
// and keys.
func (s *Server) Restart() {
	s.t.Helper()
	s.stop()
	s.start()
}

// LogTail is the end of the apiserver's log.
func (s *Server) LogTail() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "apiserver.log"))
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// URL is the apiserver's https:// address.
func (s *Server) URL() string { return s.url }

// CAFile is the path of the certificate the apiserver serves (self-signed).
func (s *Server) CAFile() string { return s.ca }

// Rest is a client config presenting token.
func (s *Server) Rest(token string) *rest.Config {
	return &rest.Config{Host: s.url, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{CAFile: s.ca}, Timeout: 10 * time.Second}
}

// Kubeconfig writes a kubeconfig file for token and returns its path.
func (s *Server) Kubeconfig(token string) string {
	s.t.Helper()
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
`, s.url, s.ca, token)
	p := filepath.Join(s.t.TempDir(), "kubeconfig")
	if err := os.WriteFile(p, b.Bytes(), 0o600); err != nil {
		s.t.Fatal(err)
	}
	return p
}

// Ctx is a context for one API call.
func (s *Server) Ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	s.t.Cleanup(cancel)
	return ctx
}

// AwaitAllowed asks the apiserver (a SubjectAccessReview) whether the
// ServiceAccount sa of namespace saNS may do what attrs says, until it may,
// and fails the test when it still may not after 10 s. The RBAC authorizer
// reads Roles and RoleBindings from an informer's cache, so a binding
// created a moment ago may not be seen yet: a test that checks what a
// fresh binding grants (or that it grants no more) waits for it here first.
func (s *Server) AwaitAllowed(t testing.TB, saNS, sa string, attrs authorizationv1.ResourceAttributes) {
	t.Helper()
	if !s.allowedWithin(t, saNS, sa, attrs, 10*time.Second) {
		t.Fatalf("system:serviceaccount:%s:%s may not %s %s in %q after 10 s", saNS, sa, attrs.Verb, attrs.Resource, attrs.Namespace)
	}
}

// Allowed is AwaitAllowed's question without the failure: whether the
// ServiceAccount may, once the authorizer has had up to wait to see a
// fresh binding (0 asks once).
func (s *Server) Allowed(t testing.TB, saNS, sa string, attrs authorizationv1.ResourceAttributes, wait time.Duration) bool {
	t.Helper()
	return s.allowedWithin(t, saNS, sa, attrs, wait)
}

func (s *Server) allowedWithin(t testing.TB, saNS, sa string, attrs authorizationv1.ResourceAttributes, wait time.Duration) bool {
	t.Helper()
	review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User:               "system:serviceaccount:" + saNS + ":" + sa,
		Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + saNS},
		ResourceAttributes: &attrs,
	}}
	deadline := time.Now().Add(wait)
	for {
		r, err := s.Admin.AuthorizationV1().SubjectAccessReviews().Create(s.Ctx(), review, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("kubeapi: subject access review: %v", err)
		}
		if r.Status.Allowed || !time.Now().Before(deadline) {
			return r.Status.Allowed
		}
		time.Sleep(100 * time.Millisecond)
	}
}
