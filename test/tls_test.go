package test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"

	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/runtime/gateway"
	controlv1 "github.com/tlgate/tlgate/protos/tl/control/v1"
)

// selfSigned writes a self-signed certificate for 127.0.0.1 (its own CA)
// and its key to dir.
func selfSigned(t *testing.T, dir string) (certFile, keyFile string, pair tls.Certificate, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "tlgate test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if pair, err = tls.X509KeyPair(certPEM, keyPEM); err != nil {
		t.Fatal(err)
	}
	pool = x509.NewCertPool()
	pool.AppendCertsFromPEM(certPEM)
	return certFile, keyFile, pair, pool
}

// TestTLSEverywhere: TLS on the gateway's HTTP and gRPC listeners, TLS to
// the engine, and a registry token: an engine that heartbeats over TLS with
// the token serves a client's HTTPS request; one without the token cannot
// register.
func TestTLSEverywhere(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, pair, pool := selfSigned(t, dir)
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
[gateway]
listen = "127.0.0.1:0"
registry_listen = "127.0.0.1:0"
heartbeat_interval = "200ms"
tls_cert_file = %q
tls_key_file = %q
engine_ca_file = %q
registry_token = "engine-secret"
`, certFile, keyFile, certFile)))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Gateway.StateDir = t.TempDir()
	gw, err := gateway.Start(context.Background(), cfg, gateway.Options{Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = gw.Close(context.Background()) }()

	// An HTTPS engine.
	eng := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"object":"text_completion","model":"m","choices":[{"index":0,"text":"over tls"}]}`)
	}))
	eng.TLS = &tls.Config{Certificates: []tls.Certificate{pair}}
	eng.StartTLS()
	defer eng.Close()

	conn, err := grpc.NewClient(gw.RegistryAddr(), grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	reg := controlv1.NewWorkerRegistryClient(conn)
	st := &controlv1.WorkerStatus{WorkerId: "tls-1", Model: "m", HttpAddress: strings.TrimPrefix(eng.URL, "https://"), KvTotalBlocks: 1}
	if _, err := reg.Heartbeat(context.Background(), st); err == nil {
		t.Fatal("a heartbeat without the registry token was accepted")
	}
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer engine-secret")
	if _, err := reg.Heartbeat(ctx, st); err != nil {
		t.Fatalf("heartbeat over TLS with the token: %v", err)
	}

	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	defer client.CloseIdleConnections()
	resp, err := client.Post("https://"+gw.HTTPAddr()+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":"hi"}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), "over tls") {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	// Plain HTTP to the TLS listener is refused.
	if r, err := http.Get("http://" + gw.HTTPAddr() + "/healthz"); err == nil {
		r.Body.Close()
		if r.StatusCode == 200 {
			t.Fatal("plain HTTP served on the TLS listener")
		}
	}
}
