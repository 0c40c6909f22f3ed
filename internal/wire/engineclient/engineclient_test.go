package engineclient_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/testkit/leakcheck"
	"github.com/tlgate/tlgate/internal/wire/engineclient"
	enginev1 "github.com/tlgate/tlgate/protos/tl/engine/v1"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

func start(t *testing.T, cfg enginesim.Config) *enginesim.Engine {
	t.Helper()
	cfg.Logger = zerolog.Nop()
	e, err := enginesim.Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e
}

// TestTokenizePrefillRelease drives a prefill and a decode reference engine
// through the client: tokenize on P, Prefill pushing to D, Release on D
// (twice: idempotent), and the errors of a bad tokenize.
func TestTokenizePrefillRelease(t *testing.T) {
	p := start(t, enginesim.Config{ID: "p", Model: "big", Role: enginesim.RolePrefill})
	d := start(t, enginesim.Config{ID: "d", Model: "big", Role: enginesim.RoleDecode})
	c := engineclient.New(engineclient.Options{})
	defer c.Close()
	ctx := context.Background()

	ids, err := c.Tokenize(ctx, p.HTTPAddr(), "big", []byte(`{"model":"public-name","prompt":"Once upon a time"}`), false)
	if err != nil || len(ids) == 0 {
		t.Fatalf("tokenize: %v %v", ids, err)
	}
	chatIDs, err := c.Tokenize(ctx, p.HTTPAddr(), "big", []byte(`{"model":"x","messages":[{"role":"user","content":"hi"}]}`), true)
	if err != nil || len(chatIDs) == 0 {
		t.Fatalf("tokenize chat: %v %v", chatIDs, err)
	}
	if _, err := c.Tokenize(ctx, p.HTTPAddr(), "other-model", []byte(`{"prompt":"x"}`), false); !errors.Is(err, engineclient.ErrTokenize) {
		t.Fatalf("tokenize for a model the engine does not serve: %v", err)
	}
	if _, err := c.Tokenize(ctx, p.HTTPAddr(), "big", []byte(`not json`), false); !errors.Is(err, engineclient.ErrTokenize) {
		t.Fatalf("tokenize of a bad body: %v", err)
	}

	resp, err := c.Prefill(ctx, p.GRPCAddr(), &enginev1.PrefillRequest{
		RequestId: "r1", Model: "big", PromptIds: ids, DecodeTarget: d.KVAddr(), KvFormat: 1,
		Sampling: &enginev1.SamplingParams{Temperature: 1, TopP: 1, MaxTokens: 16, Seed: 3},
	})
	if err != nil || resp.GetHandleId() == "" {
		t.Fatalf("prefill: %v %v", resp, err)
	}
	if d.Stats().HeldHandles != 1 {
		t.Fatalf("D holds %d handles after the push", d.Stats().HeldHandles)
	}
	rel, err := c.Release(ctx, d.KVAddr(), resp.GetHandleId())
	if err != nil || !rel.GetReleased() {
		t.Fatalf("release: %v %v", rel, err)
	}
	rel, err = c.Release(ctx, d.KVAddr(), resp.GetHandleId())
	if err != nil || rel.GetReleased() {
		t.Fatalf("second release: %v %v (want released=false, no error)", rel, err)
	}
	if s := d.Stats(); s.HeldHandles != 0 || s.HeldBlocks != 0 {
		t.Fatalf("D still holds %d handles, %d blocks", s.HeldHandles, s.HeldBlocks)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Release(ctx, d.KVAddr(), "h"); !errors.Is(err, engineclient.ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
}

// TestDialControlGuardsGRPC: the gRPC calls dial through DialControl, so an
// address it refuses is never connected to (the engine here is real and
// would answer).
func TestDialControlGuardsGRPC(t *testing.T) {
	d := start(t, enginesim.Config{ID: "d", Model: "big", Role: enginesim.RoleDecode})
	refused := errors.New("refused by the test")
	var asked atomic.Int64
	c := engineclient.New(engineclient.Options{Timeout: 5 * time.Second, DialControl: func(network, address string, _ syscall.RawConn) error {
		asked.Add(1)
		return refused
	}})
	defer c.Close()
	_, err := c.Release(context.Background(), d.KVAddr(), "h")
	if err == nil || asked.Load() == 0 {
		t.Fatalf("release through a refusing DialControl: %v (asked %d times)", err, asked.Load())
	}
	if !strings.Contains(err.Error(), "refused by the test") {
		t.Errorf("error %q does not carry the refusal", err)
	}
}
