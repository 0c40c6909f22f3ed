// Package replicas holds the integration tests of several gateway
// replicas sharing one route table and one set of drains in etcd: real
// gateways and reference engines on 127.0.0.1, and a real etcd embedded in
// the test process (package embedetcd), all on ports the OS picks.
package replicas

import (
	"testing"

	"github.com/tlgate/tlgate/internal/adapter/store/embedetcd"
	"github.com/tlgate/tlgate/internal/testkit/leakcheck"
)

func TestMain(m *testing.M) {
	// A child started by embedetcd.StartProcesses runs an etcd member.
	embedetcd.MemberMain()
	leakcheck.VerifyTestMain(m)
}
