// Package fleetsync holds the integration tests of fleet sync: real
// gateway replicas and reference engines on 127.0.0.1 sharing their
// routing view through a real NATS server embedded in the test process
// (package embednats), all on ports the OS picks.
package fleetsync

import (
	"testing"

	"github.com/tlgate/tlgate/internal/testkit/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }
