package fleetsync

import (
	"net"
	"os"
	"strings"

	"github.com/tlgate/tlgate/internal/adapter/config"
)

// The subjects under the configured prefix P. A replica publishes only
// under its own id, so one NATS user per replica allowed to publish only
// there (Permissions) makes a replica's id impossible to use without its
// credentials:
//
//	P.events.<replica>               its batches of events
//	P.snapshot                       warm-start requests (payload: the asker's id),
//	                                 answered by one replica (a queue group)
//	P.stored.<replica>               asking replica for the stored responses it
//	                                 relayed (payload: the asker's id)
//	P.snapshots.<replica>.<asker>    its answers to asker: a snapshot, its stored
//	                                 responses
//	P.keys.<replica>                 its demand per limited API key (keys.go)
//	P.traffic                        traffic requests (payload: the asker's id),
//	                                 answered by every replica (traffic.go)
//	P.traffics.<replica>.<asker>     its traffic rings, for asker
const (
	subjectKeys      = "keys"
	subjectEvents    = "events"
	subjectSnapshot  = "snapshot"
	subjectStored    = "stored"
	subjectSnapshots = "snapshots"
	subjectTraffic   = "traffic"
	subjectTraffics  = "traffics"
	// snapshotQueue is the queue group of the snapshot subject.
	snapshotQueue = "tlgate-snapshot"
)

// Permissions are the subjects replica publishes to and subscribes to
// under prefix: a NATS user of that replica's own needs exactly these
// (docs/DEPLOYMENT.md shows a nats-server configuration).
func Permissions(prefix, replica string) (publish, subscribe []string) {
	p := prefix + "."
	publish = []string{p + subjectEvents + "." + replica, p + subjectSnapshot, p + subjectStored + ".*", p + subjectSnapshots + "." + replica + ".*",
		p + subjectKeys + "." + replica, p + subjectTraffic, p + subjectTraffics + "." + replica + ".*"}
	subscribe = []string{p + subjectEvents + ".*", p + subjectSnapshot, p + subjectStored + "." + replica, p + subjectSnapshots + ".*." + replica,
		p + subjectKeys + ".*", p + subjectTraffic, p + subjectTraffics + ".*." + replica}
	return publish, subscribe
}

// ValidReplicaID reports whether id can name a replica
// (config.ValidReplicaID: one NATS subject token).
func ValidReplicaID(id string) bool { return config.ValidReplicaID(id) }

// subjectToken returns the token of subject after prefix + ".", and
// whether subject is prefix + "." + one token.
func subjectToken(subject, prefix string) (string, bool) {
	tok, ok := strings.CutPrefix(subject, prefix+".")
	return tok, ok && ValidReplicaID(tok)
}

// DefaultID is a replica's id when the configuration names none: the host
// name and the HTTP listener's port, the host name's dots (and any other
// character a subject token cannot hold) turned into '_'.
func DefaultID(httpAddr string) string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "tlgate"
	}
	port := httpAddr
	if _, p, err := net.SplitHostPort(httpAddr); err == nil {
		port = p
	}
	id := strings.Map(func(r rune) rune {
		if strings.ContainsRune(config.ReplicaIDForbidden, r) {
			return '_'
		}
		return r
	}, host+":"+port)
	return id[:min(len(id), config.MaxReplicaID)]
}
