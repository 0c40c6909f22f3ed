package gateway

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/tlgate/tlgate/actors/admin/store"
	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/adapter/store/etcdstore"
	"github.com/tlgate/tlgate/internal/routing/routes"
)

// freeLoopbackPort returns a port the OS just handed out on 127.0.0.1.
func freeLoopbackPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// TestEtcdStoreOverTLSWithAuth: [gateway.store] with ca_file, cert_file,
// key_file, username and password_env reaches an etcd that serves only
// TLS, asks for client certificates and has authentication on: the route
// table is seeded and read back. A wrong password, no client certificate
// or a CA that did not sign the server's is refused at Open with an error
// that says so.
func TestEtcdStoreOverTLSWithAuth(t *testing.T) {
	dir := t.TempDir()
	ca, caFile := newTestCA(t, dir)
	serverCert, serverKey := ca.issue(t, "etcd")
	clientCert, clientKey := ca.issue(t, "tlgate")

	cfg := embed.NewConfig()
	cfg.Name, cfg.Dir = "tls", filepath.Join(dir, "etcd")
	client, _ := url.Parse(fmt.Sprintf("https://127.0.0.1:%d", freeLoopbackPort(t)))
	peer, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", freeLoopbackPort(t)))
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*client}, []url.URL{*client}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*peer}, []url.URL{*peer}
	cfg.InitialCluster = cfg.Name + "=" + peer.String()
	cfg.ClientTLSInfo = transport.TLSInfo{CertFile: serverCert, KeyFile: serverKey, TrustedCAFile: caFile, ClientCertAuth: true}
	cfg.UnsafeNoFsync = true
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		t.Fatal("etcd not ready")
	}

	// Authentication on: a root user with a password.
	adminTLS, err := (transport.TLSInfo{CertFile: clientCert, KeyFile: clientKey, TrustedCAFile: caFile}).ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	admin, err := clientv3.New(clientv3.Config{Endpoints: []string{client.String()}, TLS: adminTLS, DialTimeout: 20 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := admin.UserAdd(ctx, "root", "root-secret"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.UserGrantRole(ctx, "root", "root"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.AuthEnable(ctx); err != nil {
		t.Fatal(err)
	}
	admin.Close()

	t.Setenv("TLGATE_TEST_ETCD_PW", "root-secret")
	t.Setenv("TLGATE_TEST_ETCD_BAD_PW", "wrong")
	base := config.Store{Kind: config.StoreEtcd, Endpoints: []string{client.String()}, Prefix: "/tls-test/",
		// Generous: a TLS handshake and a bcrypt check under -race on a
		// busy machine can take seconds.
		DialTimeout: config.D(20 * time.Second), Username: "root", PasswordEnv: "TLGATE_TEST_ETCD_PW",
		CAFile: caFile, CertFile: clientCert, KeyFile: clientKey}
	open := func(s config.Store) (*etcdstore.Store, store.Snapshot, error) {
		c, err := EtcdConfig(&s)
		if err != nil {
			t.Fatal(err)
		}
		return etcdstore.Open(ctx, c, []routes.Route{{Model: "m"}})
	}

	es, snap, err := open(base)
	if err != nil {
		t.Fatalf("open over TLS with auth: %v", err)
	}
	_, rs, err := store.DecodeTable(snap.Table)
	if err != nil || len(rs) != 1 || rs[0].Model != "m" {
		t.Fatalf("seeded table read back: %v %v", rs, err)
	}
	if err := es.Close(); err != nil {
		t.Fatal(err)
	}

	wrongPW := base
	wrongPW.PasswordEnv = "TLGATE_TEST_ETCD_BAD_PW"
	if es, _, err := open(wrongPW); err == nil {
		es.Close()
		t.Fatal("a wrong password was accepted")
	} else if !strings.Contains(err.Error(), "authentication failed") {
		t.Errorf("wrong password: %v, want it to say authentication failed", err)
	}
	base.DialTimeout = config.D(time.Second) // the refusals below wait it out
	noCert := base
	noCert.CertFile, noCert.KeyFile = "", ""
	if es, _, err := open(noCert); err == nil {
		es.Close()
		t.Fatal("a client without a certificate was accepted")
	} else if !strings.Contains(err.Error(), "certificate required") {
		t.Errorf("without a client certificate: %v, want it to say a certificate is required", err)
	}
	_, otherCA := newTestCA(t, t.TempDir())
	wrongCA := base
	wrongCA.CAFile = otherCA
	if es, _, err := open(wrongCA); err == nil {
		es.Close()
		t.Fatal("a server certificate of another CA was accepted")
	} else if !strings.Contains(err.Error(), "unknown authority") {
		t.Errorf("with another CA: %v, want it to name the unknown authority", err)
	}
}
