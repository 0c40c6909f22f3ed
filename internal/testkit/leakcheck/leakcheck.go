// Package leakcheck is the goroutine-leak check of the project's test
// binaries: goleak, told about the goroutines of the libraries that
// outlive a test by design. Only tests import it.
package leakcheck

import (
	"testing"

	"go.uber.org/goleak"
)

// Options are goleak's options for the project, followed by extra:
//   - protoactor's dead-letter throttle parks one goroutine for one
//     throttle interval (1 s) after a dead letter (a message to an actor
//     that just stopped, as when a system shuts down with replies in
//     flight), then it ends; it is not a leak.
//   - go-zeromq/zmq4 (v0.17.0) starts a writer goroutine per PUB socket
//     that its Close never stops (socket.Close closes the connections but
//     not the writer): one parked goroutine per closed PUB socket, which
//     the project cannot end.
func Options(extra ...goleak.Option) []goleak.Option {
	return append([]goleak.Option{
		goleak.IgnoreTopFunction("github.com/asynkron/protoactor-go/actor.NewDeadLetter.NewThrottle.func4.1"),
		goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"),
	}, extra...)
}

// VerifyTestMain runs m's tests and then fails the binary when goroutines
// other than those Options allows are left.
func VerifyTestMain(m *testing.M, extra ...goleak.Option) {
	goleak.VerifyTestMain(m, Options(extra...)...)
}
