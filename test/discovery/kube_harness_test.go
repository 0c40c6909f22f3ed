package discovery_test

import (
	"context"
	"testing"

	"k8s.io/client-go/rest"

	"github.com/tlgate/tlgate/internal/testkit/kubeapi"
)

// kube is a real kube-apiserver (kubeapi.Server) with the calls these
// tests make of it.
type kube struct {
	*kubeapi.Server
}

// startKube starts the apiserver, or skips the test when no binary is
// named outside CI (under CI it fails).
func startKube(t *testing.T) *kube {
	t.Helper()
	return &kube{kubeapi.Start(t)}
}

// restart stops the apiserver and starts it again on the same port, etcd
// and keys.
func (k *kube) restart() { k.Restart() }

// rest is a client config presenting token.
func (k *kube) rest(token string) *rest.Config { return k.Rest(token) }

// kubeconfig writes a kubeconfig file for token and returns its path.
func (k *kube) kubeconfig(token string) string { return k.Kubeconfig(token) }

// ctx is a context for one API call.
func (k *kube) ctx() context.Context { return k.Ctx() }
