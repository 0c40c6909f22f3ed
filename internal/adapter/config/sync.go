package config

import (
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/tlgate/tlgate/actors/router"
)

// Kinds of fleet sync (gateway.sync.kind).
const (
	SyncNone = "none"
	SyncNATS = "nats"
)

// Defaults of [gateway.sync].
const (
	DefaultSyncSubjectPrefix   = "tlgate.sync"
	DefaultSyncBatchInterval   = time.Millisecond
	DefaultSyncReleaseHold     = 5 * time.Millisecond
	DefaultSyncMaxBatchBytes   = 64 << 10
	DefaultSyncMaxQueue        = 8192
	DefaultSyncMaxMessageBytes = 1 << 20
	DefaultSyncPeerRate        = 2000
	DefaultSyncLoadInterval    = time.Second
	DefaultSyncPeerTimeout     = router.DefaultSyncPeerTimeout
	DefaultSyncStaleAfter      = 10 * time.Second
	DefaultSyncMaxPeers        = router.DefaultSyncMaxPeers
	DefaultSyncMaxPeerInFlight = router.DefaultSyncMaxPeerInFlight
	DefaultSyncPeerClaimMargin = router.DefaultSyncClaimMargin
	DefaultSyncEjectionQuorum  = router.DefaultSyncEjectionQuorum
	DefaultSyncSnapshotTimeout = 2 * time.Second
	DefaultSyncConnectTimeout  = 2 * time.Second
	DefaultSyncReconnectWait   = 500 * time.Millisecond
	DefaultSyncSnapshotChunks  = 16384
)

// Sync is the [gateway.sync] table: fleet sync, the replicas' routing
// decisions, load and prefix index shared over NATS.
type Sync struct {
	// Kind is none (each replica routes on its own view) or nats.
	Kind string `toml:"kind"`
	// URL lists the NATS servers (nats://host:port or tls://host:port;
	// one string or an array); required with kind = "nats".
	URL StringList `toml:"url"`
	// SubjectPrefix is put in front of the subjects (<prefix>.events,
	// <prefix>.snapshot): NATS tokens of [A-Za-z0-9_-] joined by dots.
	SubjectPrefix string `toml:"subject_prefix"`
	// ReplicaID names this replica to its peers (ValidReplicaID); empty:
	// the host name and the HTTP listener's port.
	ReplicaID string `toml:"replica_id"`
	// Peers lists the replica ids of the fleet: at max_peers a listed
	// replica takes the place of one that is not.
	Peers []string `toml:"peers"`

	// Credentials: exactly one of a token (Token or TokenEnv), a user
	// (User with Password or PasswordEnv), a creds file, or a client
	// certificate (CertFile and KeyFile). Sync messages are accepted only
	// over an authenticated connection.
	Token       string `toml:"token"`
	TokenEnv    string `toml:"token_env"`
	User        string `toml:"user"`
	Password    string `toml:"password"`
	PasswordEnv string `toml:"password_env"`
	CredsFile   string `toml:"creds_file"`
	// TLS: CAFile verifies the servers' certificates (and turns TLS on);
	// CertFile and KeyFile are a client certificate.
	CAFile   string `toml:"ca_file"`
	CertFile string `toml:"cert_file"`
	KeyFile  string `toml:"key_file"`

	// BatchInterval is the least time between two batches (an event
	// after a quiet interval goes at once, later ones wait for the
	// interval's end and go together); MaxBatchBytes bounds one batch; MaxQueue bounds the events waiting
	// (more are dropped and counted: a pick never waits on NATS).
	BatchInterval Duration `toml:"batch_interval"`
	// ReleaseHold is how long a release or a load report may wait for
	// another event to ride with (0: it goes like a pick). Peers see a
	// request end up to this much late, for fewer messages.
	ReleaseHold   Duration `toml:"release_hold"`
	MaxBatchBytes int      `toml:"max_batch_bytes"`
	MaxQueue      int      `toml:"max_queue"`
	// MaxMessageBytes bounds a received message; PeerRate bounds the
	// messages per second taken from one peer (burst: one second's worth).
	MaxMessageBytes int     `toml:"max_message_bytes"`
	PeerRate        float64 `toml:"peer_rate"`
	// LoadInterval is how often a replica sends its whole in-flight count;
	// PeerTimeout forgets a silent peer's in-flight requests; StaleAfter
	// drops messages sent longer ago than that.
	LoadInterval Duration `toml:"load_interval"`
	PeerTimeout  Duration `toml:"peer_timeout"`
	StaleAfter   Duration `toml:"stale_after"`
	// MaxPeers bounds the replicas tracked; MaxPeerInFlight the requests
	// one replica may claim on one worker.
	MaxPeers        int `toml:"max_peers"`
	MaxPeerInFlight int `toml:"max_peer_in_flight"`
	// EjectionQuorum is how many peers' ejections of a worker, in force,
	// eject it here without a failure of this replica's own there.
	EjectionQuorum int `toml:"ejection_quorum"`
	// PeerClaimMargin is how many of the peers' requests picked since an
	// engine's last report count on it beyond what the report shows.
	PeerClaimMargin int `toml:"peer_claim_margin"`
	// SnapshotTimeout bounds the wait for a peer's snapshot at start and
	// on reconnection; SnapshotChunks bounds each worker's index entries in
	// a snapshot sent.
	SnapshotTimeout Duration `toml:"snapshot_timeout"`
	SnapshotChunks  int      `toml:"snapshot_chunks"`
	// ConnectTimeout bounds one connection attempt; ReconnectWait is the
	// pause between attempts (the gateway keeps trying for ever).
	ConnectTimeout Duration `toml:"connect_timeout"`
	ReconnectWait  Duration `toml:"reconnect_wait"`
	// KeyLimits is KeyLimitsFleet (the API keys' limits are split between
	// the replicas, which together grant what one gateway would) or
	// KeyLimitsReplica (each replica counts its own requests).
	KeyLimits string `toml:"key_limits"`
}

// How a fleet counts its API keys' limits ([gateway.sync] key_limits).
const (
	KeyLimitsFleet   = "fleet"
	KeyLimitsReplica = "replica"
)

// StringList is a TOML string or array of strings.
type StringList []string

// UnmarshalTOML takes one string or an array of strings.
func (l *StringList) UnmarshalTOML(v any) error {
	switch x := v.(type) {
	case string:
		*l = StringList{x}
		return nil
	case []any:
		out := make(StringList, 0, len(x))
		for _, e := range x {
			s, ok := e.(string)
			if !ok {
				return fmt.Errorf("want a string or an array of strings, got an element %T", e)
			}
			out = append(out, s)
		}
		*l = out
		return nil
	}
	return fmt.Errorf("want a string or an array of strings, got %T", v)
}

func defaultSync() Sync {
	return Sync{
		Kind: SyncNone, SubjectPrefix: DefaultSyncSubjectPrefix,
		BatchInterval: D(DefaultSyncBatchInterval), ReleaseHold: D(DefaultSyncReleaseHold), MaxBatchBytes: DefaultSyncMaxBatchBytes, MaxQueue: DefaultSyncMaxQueue,
		MaxMessageBytes: DefaultSyncMaxMessageBytes, PeerRate: DefaultSyncPeerRate,
		LoadInterval: D(DefaultSyncLoadInterval), PeerTimeout: D(DefaultSyncPeerTimeout), StaleAfter: D(DefaultSyncStaleAfter),
		MaxPeers: DefaultSyncMaxPeers, MaxPeerInFlight: DefaultSyncMaxPeerInFlight, PeerClaimMargin: DefaultSyncPeerClaimMargin,
		EjectionQuorum:  DefaultSyncEjectionQuorum,
		SnapshotTimeout: D(DefaultSyncSnapshotTimeout), SnapshotChunks: DefaultSyncSnapshotChunks,
		ConnectTimeout: D(DefaultSyncConnectTimeout), ReconnectWait: D(DefaultSyncReconnectWait),
		KeyLimits: KeyLimitsFleet,
	}
}

// SyncToken returns the NATS token: token, or the value of token_env
// (read now), or "".
func (s Sync) SyncToken() (string, error) {
	if s.TokenEnv != "" {
		v, err := envValue(s.TokenEnv)
		if err != nil {
			return "", fmt.Errorf("config: gateway.sync.token_env: %w", err)
		}
		return v, nil
	}
	return s.Token, nil
}

// SyncPassword returns the NATS user's password: password, or the value
// of password_env (read now), or "".
func (s Sync) SyncPassword() (string, error) {
	if s.PasswordEnv != "" {
		v, err := envValue(s.PasswordEnv)
		if err != nil {
			return "", fmt.Errorf("config: gateway.sync.password_env: %w", err)
		}
		return v, nil
	}
	return s.Password, nil
}

// sync checks [gateway.sync]; with kind = "none" only the keys' forms are
// checked.
func (v *checker) sync(s *Sync) {
	const p = "gateway.sync."
	switch s.Kind {
	case SyncNone, SyncNATS:
	default:
		v.add(p+"kind", "must be %q or %q, got %q", SyncNone, SyncNATS, s.Kind)
		return
	}
	if !validSubject(s.SubjectPrefix) {
		v.add(p+"subject_prefix", "must be NATS tokens of letters, digits, '_' and '-' joined by '.', got %q", s.SubjectPrefix)
	}
	if s.ReplicaID != "" && !ValidReplicaID(s.ReplicaID) {
		v.add(p+"replica_id", "must be at most %d characters, none of them '.', '*', '>' or a space (it is a NATS subject token), got %q", MaxReplicaID, s.ReplicaID)
	}
	if len(s.Peers) > 1024 {
		v.add(p+"peers", "must list at most 1024 replica ids, got %d", len(s.Peers))
	}
	seen := map[string]bool{}
	for i, id := range s.Peers {
		switch {
		case !ValidReplicaID(id):
			v.add(fmt.Sprintf("%speers[%d]", p, i), "must be a replica id: at most %d characters, none of them '.', '*', '>' or a space, got %q", MaxReplicaID, id)
		case seen[id]:
			v.add(fmt.Sprintf("%speers[%d]", p, i), "lists %q twice", id)
		}
		seen[id] = true
	}
	for _, k := range []struct {
		key string
		d   Duration
	}{{"batch_interval", s.BatchInterval}, {"load_interval", s.LoadInterval}, {"peer_timeout", s.PeerTimeout},
		{"stale_after", s.StaleAfter}, {"snapshot_timeout", s.SnapshotTimeout}, {"connect_timeout", s.ConnectTimeout}, {"reconnect_wait", s.ReconnectWait}} {
		v.positive(p+k.key, k.d)
	}
	if s.BatchInterval.Duration > time.Second {
		v.add(p+"batch_interval", "must be at most 1s (events wait that long), got %s", s.BatchInterval.Duration)
	}
	switch h := s.ReleaseHold.Duration; {
	case h < 0:
		v.add(p+"release_hold", "must be 0 or more, got %s", h)
	case h > time.Second:
		v.add(p+"release_hold", "must be at most 1s (releases wait that long), got %s", h)
	}
	switch s.KeyLimits {
	case KeyLimitsFleet, KeyLimitsReplica:
	default:
		v.add(p+"key_limits", "must be %q or %q, got %q", KeyLimitsFleet, KeyLimitsReplica, s.KeyLimits)
	}
	if s.PeerTimeout.Duration > 0 && s.PeerTimeout.Duration <= s.LoadInterval.Duration {
		v.add(p+"peer_timeout", "must be longer than load_interval (%s), got %s", s.LoadInterval.Duration, s.PeerTimeout.Duration)
	}
	ints := []struct {
		key      string
		n, lo, h int
	}{
		{"max_batch_bytes", s.MaxBatchBytes, 1024, 64 << 20}, {"max_queue", s.MaxQueue, 1, 1 << 20},
		{"max_message_bytes", s.MaxMessageBytes, 1024, 64 << 20}, {"max_peers", s.MaxPeers, 1, 1024},
		{"max_peer_in_flight", s.MaxPeerInFlight, 1, 1 << 20}, {"peer_claim_margin", s.PeerClaimMargin, 0, 1 << 20},
		{"ejection_quorum", s.EjectionQuorum, 1, 1024},
		{"snapshot_chunks", s.SnapshotChunks, 0, 1 << 20},
	}
	for _, k := range ints {
		if k.n < k.lo || k.n > k.h {
			v.add(p+k.key, "must be from %d to %d, got %d", k.lo, k.h, k.n)
		}
	}
	if s.MaxBatchBytes > s.MaxMessageBytes {
		v.add(p+"max_batch_bytes", "must be at most max_message_bytes (%d), got %d", s.MaxMessageBytes, s.MaxBatchBytes)
	}
	if !(s.PeerRate > 0) || s.PeerRate > 1e6 {
		v.add(p+"peer_rate", "must be > 0 and at most 1000000 messages per second, got %v", s.PeerRate)
	}
	v.file(p+"ca_file", s.CAFile)
	v.file(p+"cert_file", s.CertFile)
	v.file(p+"key_file", s.KeyFile)
	v.file(p+"creds_file", s.CredsFile)
	v.together(p+"cert_file", s.CertFile, p+"key_file", s.KeyFile)
	if s.Token != "" && s.TokenEnv != "" {
		v.add(p+"token_env", "cannot be combined with token")
	}
	if s.Password != "" && s.PasswordEnv != "" {
		v.add(p+"password_env", "cannot be combined with password")
	}
	if s.User != "" && s.Password == "" && s.PasswordEnv == "" {
		v.add(p+"password_env", "required with user (or password)")
	}
	if s.User == "" && (s.Password != "" || s.PasswordEnv != "") {
		v.add(p+"user", "required with password or password_env")
	}
	if s.TokenEnv != "" {
		if _, err := envValue(s.TokenEnv); err != nil {
			v.add(p+"token_env", "%s", err)
		}
	}
	if s.PasswordEnv != "" {
		if _, err := envValue(s.PasswordEnv); err != nil {
			v.add(p+"password_env", "%s", err)
		}
	}
	if s.Kind == SyncNone {
		return
	}
	if len(s.URL) == 0 {
		v.add(p+"url", "at least one NATS server required with kind = %q", SyncNATS)
	}
	for i, u := range s.URL {
		key := fmt.Sprintf("%surl[%d]", p, i)
		pu, err := url.Parse(u)
		if err != nil || (pu.Scheme != "nats" && pu.Scheme != "tls") || pu.Host == "" {
			v.add(key, "want nats://host:port or tls://host:port, got %q", u)
			continue
		}
		if pu.User != nil {
			v.add(key, "must not hold credentials (use token_env, user with password_env, or creds_file)")
		}
	}
	methods := 0
	for _, set := range []bool{s.Token != "" || s.TokenEnv != "", s.User != "", s.CredsFile != "", s.CertFile != ""} {
		if set {
			methods++
		}
	}
	switch {
	case methods == 0:
		v.add(p+"token_env", "kind = %q needs credentials: token_env (or token), user with password_env, creds_file, or cert_file with key_file (sync messages are accepted only over an authenticated connection)", SyncNATS)
	case methods > 1 && !(methods == 2 && s.CertFile != ""):
		v.add(p+"token_env", "at most one of token, user, creds_file (a client certificate may go with any)")
	}
}

// MaxReplicaID bounds a replica id; ReplicaIDForbidden are the
// characters it may not hold.
const (
	MaxReplicaID       = 128
	ReplicaIDForbidden = ".*> \t\r\n\f\v"
)

// ValidReplicaID reports whether id can name a fleet-sync replica: 1 to
// MaxReplicaID characters and one NATS subject token (none of
// ReplicaIDForbidden), as it is part of the subjects the replica
// publishes to.
func ValidReplicaID(id string) bool {
	return id != "" && len(id) <= MaxReplicaID && !strings.ContainsAny(id, ReplicaIDForbidden)
}

// validSubject reports whether s is NATS subject tokens of [A-Za-z0-9_-]
// joined by dots.
func validSubject(s string) bool {
	if s == "" || len(s) > 200 {
		return false
	}
	for _, tok := range strings.Split(s, ".") {
		if tok == "" {
			return false
		}
		for _, r := range tok {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
				return false
			}
		}
	}
	return true
}
