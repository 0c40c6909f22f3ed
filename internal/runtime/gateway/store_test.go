package gateway

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tlgate/tlgate/internal/adapter/config"
)

// writePEM writes a certificate and its key under dir.
func writePEM(t *testing.T, dir string) (certFile, keyFile string) {
	t.Helper()
	ca, _ := newTestCA(t, dir)
	return ca.issue(t, "tlgate-test")
}

// testCA issues certificates for the TLS tests.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	dir  string
	n    int64
}

func newTestCA(t *testing.T, dir string) (*testCA, string) {
	t.Helper()
	ca := &testCA{dir: dir, n: 1}
	var err error
	if ca.key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "tlgate test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &ca.key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	if ca.cert, err = x509.ParseCertificate(der); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return ca, file
}

// issue writes a certificate for name (valid for 127.0.0.1, as server and
// client) and its key.
func (ca *testCA) issue(t *testing.T, name string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ca.n++
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(ca.n), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(ca.dir, name+".pem"), filepath.Join(ca.dir, name+"-key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

func TestEtcdConfig(t *testing.T) {
	dir := t.TempDir()
	cert, key := writePEM(t, dir)
	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TLGATE_TEST_ETCD_PASSWORD", "pw")
	base := config.Store{Kind: config.StoreEtcd, Endpoints: []string{"https://e:2379"}, Prefix: "/p/", DialTimeout: config.D(time.Second)}

	plain, err := EtcdConfig(&base)
	if err != nil || plain.TLS != nil || plain.Prefix != "/p/" || plain.DialTimeout != time.Second {
		t.Fatalf("plain: %+v %v", plain, err)
	}
	full := base
	full.Username, full.PasswordEnv, full.CAFile, full.CertFile, full.KeyFile = "u", "TLGATE_TEST_ETCD_PASSWORD", cert, cert, key
	got, err := EtcdConfig(&full)
	if err != nil || got.Username != "u" || got.Password != "pw" || got.TLS == nil || got.TLS.RootCAs == nil || len(got.TLS.Certificates) != 1 {
		t.Fatalf("full: %+v %v", got, err)
	}
	for _, c := range []struct {
		name    string
		mod     func(s *config.Store)
		wantKey string
	}{
		{"CA not PEM", func(s *config.Store) { s.CAFile = notPEM }, "gateway.store.ca_file"},
		{"CA missing", func(s *config.Store) { s.CAFile = filepath.Join(dir, "none.pem") }, "gateway.store.ca_file"},
		{"key not PEM", func(s *config.Store) { s.CertFile, s.KeyFile = cert, notPEM }, "gateway.store.cert_file"},
		{"password unset", func(s *config.Store) { s.Username, s.PasswordEnv = "u", "TLGATE_TEST_ETCD_PASSWORD_UNSET" }, "gateway.store.password_env"},
	} {
		s := base
		c.mod(&s)
		if _, err := EtcdConfig(&s); err == nil || !strings.Contains(err.Error(), c.wantKey) {
			t.Errorf("%s: %v, want an error naming %s", c.name, err, c.wantKey)
		}
	}
}
