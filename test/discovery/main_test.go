// Package discovery_test runs the gateway's engine discovery against real
// servers: a DNS server on loopback, and a real kube-apiserver (built by
// .ci/run from test/kube and named by TLGATE_KUBE_APISERVER) serving Pods,
// EndpointSlices and InferencePools, with the gateway under the shipped
// RBAC, and the gateway binary under the Helm chart's (rendered with the
// helm TLGATE_HELM names).
package discovery_test

import (
	"testing"

	"github.com/tlgate/tlgate/internal/testkit/leakcheck"
)

func TestMain(m *testing.M) {
	leakcheck.VerifyTestMain(m)
}
