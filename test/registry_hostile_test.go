package test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/tlgate/tlgate/enginesim"
	controlv1 "github.com/tlgate/tlgate/protos/tl/control/v1"
)

// TestRegistryHostileHeartbeats replays the outsider's heartbeats against
// a gateway with a real engine ea1: an impostor naming ea1 with its own
// address and draining: true is refused (FailedPrecondition) and changes
// nothing, so every request still reaches the real ea1; engine addresses
// on the gateway's own listeners, link-local ones and odd numeric hosts
// are refused too.
func TestRegistryHostileHeartbeats(t *testing.T) {
	c := newCluster(t, "", []clusterOpt{keys()}, enginesim.Config{ID: "ea1", Model: "m"})
	eng := c.engines["ea1"]
	conn, err := grpc.NewClient(c.gw.RegistryAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := controlv1.NewWorkerRegistryClient(conn)
	beat := func(id, addr string, draining bool) error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := client.Heartbeat(ctx, &controlv1.WorkerStatus{WorkerId: id, Model: "m", HttpAddress: addr, Draining: draining, Role: controlv1.Role_ROLE_UNIFIED})
		return err
	}

	if err := beat("ea1", "127.0.0.1:1", true); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("impostor heartbeat for ea1: %v, want FailedPrecondition", err)
	}
	for i := range 30 {
		o := c.drillSend(context.Background(), "/v1/completions", drillKey, fmt.Sprintf("r-%d", i), drillBody("m", 2, false))
		if !o.finishedOK(false) || o.route != "ea1" {
			t.Fatalf("request %d after the impostor: %v", i, o)
		}
	}
	if w, _ := c.drillWorker("ea1"); w.HTTPAddress != eng.HTTPAddr() || w.Draining || !w.Routable {
		t.Fatalf("the impostor changed ea1: %+v", w)
	}

	for _, tc := range []struct {
		addr string
		code codes.Code
	}{
		{c.gw.HTTPAddr(), codes.PermissionDenied},
		{c.gw.RegistryAddr(), codes.PermissionDenied},
		{"169.254.169.254:80", codes.InvalidArgument},
		{"[fe80::1]:80", codes.InvalidArgument},
		{"0x7f000001:80", codes.InvalidArgument},
		{"2130706433:80", codes.InvalidArgument},
	} {
		if err := beat("evil", tc.addr, false); status.Code(err) != tc.code {
			t.Errorf("engine address %s: %v, want %v", tc.addr, err, tc.code)
		}
	}
	if _, ok := c.drillWorker("evil"); ok {
		t.Fatal("a refused address registered a worker")
	}
}
