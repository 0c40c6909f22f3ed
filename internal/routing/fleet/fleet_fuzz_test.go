package fleet

import (
	"errors"
	"net"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/tlgate/tlgate/internal/testkit/leakcheck"
	controlv1 "github.com/tlgate/tlgate/protos/tl/control/v1"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

// FuzzHeartbeatValidation: Validate never panics, every refusal wraps one of
// the package's sentinel errors, and every status it accepts is one that
// FromStatus turns into a usable worker: a known role, its id and model as
// sent, addresses the gateway can put in a URL (http://addr/...) or dial,
// the address its role needs, and coherent KV figures.
func FuzzHeartbeatValidation(f *testing.F) {
	type seed struct {
		id, model, httpAddr, grpcAddr, kvAddr string
		role                                  int32
		free, total                           uint32
	}
	for _, s := range []seed{
		{"w1", "smol-v3", "127.0.0.1:8000", "", "", 1, 10, 100},
		{"p-1", "big", "10.0.0.1:8000", "10.0.0.1:9000", "", 2, 0, 0},
		{"d.1:a", "org/big", "[::1]:8000", "", "[::1]:9100", 3, 100, 100},
		{"", "m", "h:1", "", "", 0, 0, 0},
		{"w", "m", "h:0", "", "", 0, 0, 0},
		{"w", "m", "h:1", "", "", 7, 0, 0},
		{"w", "m", "host:65536", "", "", 1, 0, 0},
		{"w", "m", "h:1", "", "", 3, 0, 0},
		{"w", "m", "h:1", "", "", 2, 0, 0},
		{"w", "m", "h:1", "", "", 1, 5, 4},
		{"w w", "m", "h:1", "", "", 1, 0, 0},
		{"w", "m\x00", "h:1", "", "", 1, 0, 0},
	} {
		f.Add(s.id, s.model, s.httpAddr, s.grpcAddr, s.kvAddr, s.role, s.free, s.total, uint64(1700000000000), false)
	}
	sentinels := []error{ErrInvalidWorkerID, ErrInvalidAddress, ErrInvalidRole, ErrInvalidModel, ErrInvalidKV}
	f.Fuzz(func(t *testing.T, id, model, httpAddr, grpcAddr, kvAddr string, role int32, free, total uint32, started uint64, draining bool) {
		st := &controlv1.WorkerStatus{
			WorkerId: id, Model: model, HttpAddress: httpAddr, GrpcAddress: grpcAddr, KvAddress: kvAddr,
			Role: controlv1.Role(role), KvFreeBlocks: free, KvTotalBlocks: total, KvBlockTokens: 16,
			Draining: draining, StartedAtUnixMs: started, QueueDepth: free / 2, Running: total / 3,
		}
		err := Validate(st)
		if err != nil {
			for _, s := range sentinels {
				if errors.Is(err, s) {
					return
				}
			}
			t.Fatalf("Validate error %v wraps none of the package's errors", err)
		}
		arrived := time.Unix(1_700_000_000, 0)
		const ttl = 6 * time.Second
		w := FromStatus(st, arrived, ttl, SourceHeartbeat)
		if w.ID != id || !ValidWorkerID(w.ID) {
			t.Fatalf("accepted worker id %q", id)
		}
		if w.Model != model || !ValidModelID(w.Model) {
			t.Fatalf("accepted model %q", model)
		}
		wantRole, rerr := RoleOf(st.GetRole())
		if rerr != nil || w.Role != wantRole {
			t.Fatalf("accepted role %d as %q (%v)", role, w.Role, rerr)
		}
		usable(t, "http_address", w.HTTPAddress, true)
		usable(t, "grpc_address", w.GRPCAddress, w.Role == RolePrefill)
		usable(t, "kv_address", w.KVAddress, w.Role == RoleDecode)
		if w.KVTotalBlocks > 0 && w.KVFreeBlocks > w.KVTotalBlocks {
			t.Fatalf("accepted %d free of %d blocks", w.KVFreeBlocks, w.KVTotalBlocks)
		}
		if w.KVFreeBlocks < 0 || w.KVTotalBlocks < 0 || w.QueueDepth < 0 || w.Running < 0 {
			t.Fatalf("negative figures in %+v", w)
		}
		if !w.Live(arrived) || w.Live(arrived.Add(ttl)) || !w.Live(arrived.Add(ttl-time.Nanosecond)) {
			t.Fatalf("liveness of a fresh worker: deadline %v for arrival %v and ttl %v", w.Deadline, arrived, ttl)
		}
		if w.Routable(arrived) == draining {
			t.Fatalf("routable %v with draining %v", w.Routable(arrived), draining)
		}
	})
}

// usable fails t unless addr (when required or given) is a host:port with a
// host and a port in 1..65535 that survives being put in a URL as is.
func usable(t *testing.T, field, addr string, required bool) {
	t.Helper()
	if addr == "" {
		if required {
			t.Fatalf("%s: accepted empty", field)
		}
		return
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		t.Fatalf("%s: accepted %q: %v", field, addr, err)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		t.Fatalf("%s: accepted port %q", field, port)
	}
	u, err := url.Parse("http://" + addr + "/v1/completions")
	if err != nil || u.Host != addr || u.Port() != port {
		t.Fatalf("%s: accepted %q, which is not a URL host: %v", field, addr, err)
	}
}
