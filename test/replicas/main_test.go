// Package replicas holds the integration tests of several gateway
// replicas sharing one route table and one set of drains in etcd: real
// gateways and reference engines on 127.0.0.1, and a real etcd embedded in
// the test process (package embedetcd), all on ports the OS picks.
package replicas

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/tlgate/tlgate/internal/store/embedetcd"
)

func TestMain(m *testing.M) {
	// A child started by embedetcd.StartProcesses runs an etcd member.
	embedetcd.MemberMain()
	goleak.VerifyTestMain(m,
		// protoactor's dead-letter throttle parks one goroutine for one
		// throttle interval (1 s) after a dead letter, then it ends.
		goleak.IgnoreTopFunction("github.com/asynkron/protoactor-go/actor.NewDeadLetter.NewThrottle.func4.1"),
	)
}
