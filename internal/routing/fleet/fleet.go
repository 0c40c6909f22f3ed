// Package fleet defines the gateway's view of one engine worker, built from
// the WorkerStatus it heartbeats (or that a probe reads), and the rules that
// say whether a heartbeat is acceptable and whether a worker is live and
// routable. It holds no actor and does no I/O.
package fleet

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"time"

	"github.com/tlgate/tlgate/internal/routing/routes"
	controlv1 "github.com/tlgate/tlgate/protos/tl/control/v1"
)

// Role is what part of serving a worker does.
type Role string

// The roles of control.proto.
const (
	RoleUnified Role = "unified"
	RolePrefill Role = "prefill"
	RoleDecode  Role = "decode"
)

// Roles are the roles, each once.
var Roles = [...]Role{RoleUnified, RolePrefill, RoleDecode}

// Source says where a worker's status comes from.
const (
	SourceHeartbeat = "heartbeat"
	SourceProbe     = "probe"
)

// Worker is the gateway's snapshot of one engine.
type Worker struct {
	ID          string `json:"id"`
	HTTPAddress string `json:"http_address"`
	GRPCAddress string `json:"grpc_address"`
	KVAddress   string `json:"kv_address"`
	Role        Role   `json:"role"`
	Model       string `json:"model"`
	// Adapters are the LoRA adapters loaded on the worker: model ids it
	// answers to besides Model, its base (sorted, no duplicates).
	Adapters      []string  `json:"adapters,omitempty"`
	KVFormat      uint32    `json:"kv_format"`
	QueueDepth    int       `json:"queue_depth"`
	Running       int       `json:"running"`
	KVFreeBlocks  int       `json:"kv_free_blocks"`
	KVTotalBlocks int       `json:"kv_total_blocks"`
	KVBlockTokens int       `json:"kv_block_tokens"`
	Draining      bool      `json:"draining"`
	Drained       bool      `json:"drained"`
	StartedAt     time.Time `json:"started_at"`
	LastHeartbeat time.Time `json:"last_heartbeat"`
	// Deadline is LastHeartbeat + miss_limit × interval: the worker is live
	// strictly before it and evicted at it.
	Deadline time.Time `json:"-"`
	Source   string    `json:"source"`
	Kind     string    `json:"kind,omitempty"`
	// BootstrapPort is a probed SGLang prefill engine's bootstrap port
	// (BootstrapAddress; 0: DefaultBootstrapPort).
	BootstrapPort int `json:"bootstrap_port,omitempty"`
	// KVEvents is where the worker publishes its KV cache events (zero:
	// nowhere).
	KVEvents KVEvents `json:"kv_events,omitzero"`
}

// Live reports whether the worker's last heartbeat is recent enough at now:
// now - last < k·T, i.e. now is strictly before the deadline.
func (w *Worker) Live(now time.Time) bool { return now.Before(w.Deadline) }

// Routable reports whether new requests may go to the worker at now: live,
// not draining itself, and its model not drained by an operator.
func (w *Worker) Routable(now time.Time) bool {
	return w.Live(now) && !w.Draining && !w.Drained
}

// Errors returned by Validate. Each is wrapped with the offending field.
var (
	ErrInvalidWorkerID = errors.New("invalid worker_id")
	ErrInvalidAddress  = errors.New("invalid address")
	ErrInvalidRole     = errors.New("invalid role")
	ErrInvalidModel    = errors.New("invalid model")
	ErrInvalidKV       = errors.New("invalid kv figures")
)

var (
	workerIDPattern = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,128}$`)
)

// ValidWorkerID reports whether id matches [A-Za-z0-9._:-]{1,128}.
func ValidWorkerID(id string) bool { return workerIDPattern.MatchString(id) }

// ValidModelID reports whether a model id is acceptable
// (routes.CheckModelID: 1 to routes.MaxIDLen bytes of [A-Za-z0-9._:/-],
// no empty, "." or ".." segment).
func ValidModelID(m string) bool { return routes.CheckModelID(m) == nil }

// Validate checks a heartbeat before it may change anything: a well-formed
// worker id, a model, host:port addresses (the KV address required of
// decode workers, the gRPC address of prefill workers), a known role and
// coherent KV figures.
func Validate(s *controlv1.WorkerStatus) error {
	if s == nil {
		return fmt.Errorf("worker_id: %w: empty status", ErrInvalidWorkerID)
	}
	if !ValidWorkerID(s.GetWorkerId()) {
		return fmt.Errorf("worker_id: %w: %q must match [A-Za-z0-9._:-]{1,128}", ErrInvalidWorkerID, truncate(s.GetWorkerId()))
	}
	if err := routes.CheckModelID(s.GetModel()); err != nil {
		return fmt.Errorf("model: %w: %v (it must match [A-Za-z0-9._:/-]{1,%d} with no empty, \".\" or \"..\" segment)", ErrInvalidModel, err, routes.MaxIDLen)
	}
	role, err := RoleOf(s.GetRole())
	if err != nil {
		return err
	}
	if err := checkHostPort("http_address", s.GetHttpAddress(), true); err != nil {
		return err
	}
	if err := checkHostPort("grpc_address", s.GetGrpcAddress(), role == RolePrefill); err != nil {
		return err
	}
	if err := checkHostPort("kv_address", s.GetKvAddress(), role == RoleDecode); err != nil {
		return err
	}
	if err := checkAdapters(s.GetModel(), s.GetLoraAdapters()); err != nil {
		return err
	}
	if _, err := kvEventsOf(s); err != nil {
		return err
	}
	if s.GetKvTotalBlocks() > 0 && s.GetKvFreeBlocks() > s.GetKvTotalBlocks() {
		return fmt.Errorf("kv_free_blocks: %w: %d free of %d total", ErrInvalidKV, s.GetKvFreeBlocks(), s.GetKvTotalBlocks())
	}
	return nil
}

// MaxAdapters bounds the LoRA adapters one worker may report.
const MaxAdapters = 256

// checkAdapters refuses adapter ids that are not model ids, repeat, name
// the base model, or are more than MaxAdapters.
func checkAdapters(model string, ids []string) error {
	if len(ids) > MaxAdapters {
		return fmt.Errorf("lora_adapters: %w: %d adapters, at most %d", ErrInvalidModel, len(ids), MaxAdapters)
	}
	seen := make(map[string]bool, len(ids))
	for i, id := range ids {
		switch {
		case !ValidModelID(id):
			return fmt.Errorf("lora_adapters[%d]: %w: %q is not a valid model id", i, ErrInvalidModel, truncate(id))
		case id == model:
			return fmt.Errorf("lora_adapters[%d]: %w: %q is the base model", i, ErrInvalidModel, truncate(id))
		case seen[id]:
			return fmt.Errorf("lora_adapters[%d]: %w: %q is given twice", i, ErrInvalidModel, truncate(id))
		}
		seen[id] = true
	}
	return nil
}

// Serves reports whether the worker answers to model id m: its base model
// or one of its adapters.
func (w *Worker) Serves(m string) bool { return w.Model == m || slices.Contains(w.Adapters, m) }

// Models returns the model ids the worker answers to: its base, then its
// adapters.
func (w *Worker) Models() []string { return append([]string{w.Model}, w.Adapters...) }

// RoleOf maps the contract's role; ROLE_UNSPECIFIED means unified.
func RoleOf(r controlv1.Role) (Role, error) {
	switch r {
	case controlv1.Role_ROLE_UNSPECIFIED, controlv1.Role_ROLE_UNIFIED:
		return RoleUnified, nil
	case controlv1.Role_ROLE_PREFILL:
		return RolePrefill, nil
	case controlv1.Role_ROLE_DECODE:
		return RoleDecode, nil
	}
	return "", fmt.Errorf("role: %w: %d is not a known role", ErrInvalidRole, int32(r))
}

func checkHostPort(field, addr string, required bool) error {
	if addr == "" {
		if required {
			return fmt.Errorf("%s: %w: required", field, ErrInvalidAddress)
		}
		return nil
	}
	if len(addr) > 262 {
		return fmt.Errorf("%s: %w: longer than 262 bytes", field, ErrInvalidAddress)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%s: %w: %q is not host:port", field, ErrInvalidAddress, truncate(addr))
	}
	if host == "" {
		return fmt.Errorf("%s: %w: %q has no host", field, ErrInvalidAddress, truncate(addr))
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return fmt.Errorf("%s: %w: %q has no valid port", field, ErrInvalidAddress, truncate(addr))
	}
	for _, r := range host {
		if r <= ' ' || r == '/' || r == '@' || r == '?' || r == '#' || r > 0x7e {
			return fmt.Errorf("%s: %w: %q has a bad host", field, ErrInvalidAddress, truncate(addr))
		}
	}
	if err := checkHost(field, addr, host); err != nil {
		return err
	}
	// The gateway dials it as http://addr/...: it must be a URL host as is.
	if u, err := url.Parse("http://" + addr); err != nil || u.Host != addr {
		return fmt.Errorf("%s: %w: %q is not a URL host", field, ErrInvalidAddress, truncate(addr))
	}
	return nil
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// sortedAdapters is a sorted copy of ids (nil when empty).
func sortedAdapters(ids []string) []string {
	if len(ids) == 0 {
		return nil
	}
	out := slices.Clone(ids)
	slices.Sort(out)
	return slices.Compact(out)
}

// FromStatus builds the worker snapshot of a validated status that arrived
// at arrived, with the liveness deadline arrived + ttl.
func FromStatus(s *controlv1.WorkerStatus, arrived time.Time, ttl time.Duration, source string) Worker {
	role, _ := RoleOf(s.GetRole())
	w := Worker{
		ID:            s.GetWorkerId(),
		HTTPAddress:   s.GetHttpAddress(),
		GRPCAddress:   s.GetGrpcAddress(),
		KVAddress:     s.GetKvAddress(),
		Role:          role,
		Model:         s.GetModel(),
		Adapters:      sortedAdapters(s.GetLoraAdapters()),
		KVFormat:      s.GetKvFormat(),
		QueueDepth:    int(s.GetQueueDepth()),
		Running:       int(s.GetRunning()),
		KVFreeBlocks:  int(s.GetKvFreeBlocks()),
		KVTotalBlocks: int(s.GetKvTotalBlocks()),
		KVBlockTokens: int(s.GetKvBlockTokens()),
		Draining:      s.GetDraining(),
		LastHeartbeat: arrived,
		Deadline:      arrived.Add(ttl),
		Source:        source,
	}
	w.KVEvents, _ = kvEventsOf(s)
	if ms := s.GetStartedAtUnixMs(); ms > 0 && ms <= math.MaxInt64 {
		w.StartedAt = time.UnixMilli(int64(ms)).UTC()
	}
	return w
}
