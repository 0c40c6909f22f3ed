package enginesim

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	enginev1 "github.com/tlgate/tlgate/protos/tl/engine/v1"
)

func refused(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }

func TestFaultRefuse(t *testing.T) {
	x := startPD(t, Config{Model: "m"}, Config{Model: "m"})
	u := startEngine(t, Config{Model: "m"})
	c := newClient(t)
	body := completionBody("m", "hi", map[string]any{"max_tokens": 2, "seed": 3})
	complete(t, c, u.URL(), false, body) // leaves a keep-alive connection

	if err := u.SetFaults(Faults{Refuse: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := net.Dial("tcp", u.HTTPAddr()); !refused(err) {
		t.Fatalf("dial while refusing: %v, want connection refused", err)
	}
	if _, err := tryPost(c, u.URL()+"/v1/completions", body); err == nil {
		t.Fatal("request while refusing succeeded (on a kept-alive connection?)")
	}
	if err := x.p.SetFaults(Faults{Refuse: true}); err != nil {
		t.Fatal(err)
	}
	if err := x.d.SetFaults(Faults{Refuse: true}); err != nil {
		t.Fatal(err)
	}
	for _, addr := range []string{x.p.GRPCAddr(), x.d.KVAddr(), x.d.HTTPAddr()} {
		if _, err := net.Dial("tcp", addr); !refused(err) {
			t.Fatalf("dial %s while refusing: %v", addr, err)
		}
	}
	if s := u.Stats(); s.Requests != 1 {
		t.Fatalf("refused requests were counted: %+v", s)
	}

	addr := u.HTTPAddr()
	if err := u.SetFaults(Faults{}); err != nil {
		t.Fatal(err)
	}
	if u.HTTPAddr() != addr {
		t.Fatalf("address changed from %s to %s", addr, u.HTTPAddr())
	}
	complete(t, c, u.URL(), false, body)
	for _, e := range []*Engine{x.p, x.d} {
		if err := e.SetFaults(Faults{}); err != nil {
			t.Fatal(err)
		}
	}
	resp := x.prefill(t, false, body) // gRPC both ways works again
	complete(t, x.client, x.d.URL(), false, body, HeaderKVHandle, resp.HandleId)
}

func TestFaultUnavailable(t *testing.T) {
	x := startPD(t, Config{Model: "m"}, Config{Model: "m"})
	u := startEngine(t, Config{Model: "m", Faults: Faults{Unavailable: true}})
	c := newClient(t)
	for _, path := range []string{"/v1/completions", "/v1/chat/completions"} {
		r := post(t, c, u.URL()+path, chatBody("m", "hi", map[string]any{"prompt": "hi"}))
		if r.status != http.StatusServiceUnavailable || decode[errorJSON](t, r.body).Error.Code != "unavailable" {
			t.Fatalf("%s: %d %s", path, r.status, r.body)
		}
	}
	if r := get(t, c, u.URL()+"/health"); r.status != http.StatusServiceUnavailable {
		t.Fatalf("health: %d", r.status)
	}
	if r := get(t, c, u.URL()+"/metrics"); r.status != http.StatusOK {
		t.Fatalf("metrics: %d", r.status)
	}
	if s := u.Stats(); s.Requests != 2 || s.Completed != 0 {
		t.Fatalf("stats %+v", s)
	}
	if err := x.p.SetFaults(Faults{Unavailable: true}); err != nil {
		t.Fatal(err)
	}
	_, err := x.control.Prefill(context.Background(), &enginev1.PrefillRequest{Model: "m", PromptIds: []uint32{1}, DecodeTarget: x.d.KVAddr()})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("Prefill: %v", err)
	}
	if err := x.p.SetFaults(Faults{}); err != nil {
		t.Fatal(err)
	}
	if err := x.d.SetFaults(Faults{Unavailable: true}); err != nil {
		t.Fatal(err)
	}
	_, err = x.control.Prefill(context.Background(), &enginev1.PrefillRequest{Model: "m", PromptIds: []uint32{1}, DecodeTarget: x.d.KVAddr()})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("Prefill pushing to an unavailable decode engine: %v", err)
	}
}

func TestFaultDieAfterTokens(t *testing.T) {
	e := startEngine(t, Config{Model: "m", Faults: Faults{Die: true, DieAfterTokens: 3}})
	c := newClient(t)
	for _, chat := range []bool{false, true} {
		body := completionBody("m", "die", map[string]any{"max_tokens": 10, "stream": true})
		path := "/v1/completions"
		if chat {
			body, path = chatBody("m", "die", map[string]any{"max_tokens": 10, "stream": true}), "/v1/chat/completions"
		}
		s := openStream(t, context.Background(), c, e.URL()+path, body)
		var chunks []string
		var err error
		for {
			var d string
			if d, err = s.tryNext(); err != nil {
				break
			}
			chunks = append(chunks, d)
		}
		s.close()
		want := 3
		if chat {
			want = 4 // the role chunk, then three tokens
		}
		if len(chunks) != want || !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("chat=%v: %d chunks then %v, want %d chunks then an abrupt close", chat, len(chunks), err, want)
		}
	}
	// Not streamed: no response at all.
	if _, err := tryPost(c, e.URL()+"/v1/completions", completionBody("m", "die", map[string]any{"max_tokens": 10})); err == nil {
		t.Fatal("non-streamed request got a response")
	}
	// Before the first byte.
	if err := e.SetFaults(Faults{Die: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := tryPost(c, e.URL()+"/v1/completions", completionBody("m", "die", map[string]any{"stream": true})); err == nil {
		t.Fatal("request dying before its first byte got a response")
	}
	if s := e.Stats(); s.Aborted != 4 || s.Completed != 0 || s.Running != 0 || s.FreeBlocks != s.TotalBlocks {
		t.Fatalf("stats %+v", s)
	}
	// A request shorter than N tokens completes.
	if err := e.SetFaults(Faults{Die: true, DieAfterTokens: 5}); err != nil {
		t.Fatal(err)
	}
	complete(t, c, e.URL(), false, completionBody("m", "die", map[string]any{"max_tokens": 4, "stream": true}))
}

func TestFaultStall(t *testing.T) {
	h := &hooks{stalled: make(chan struct{}, 1)}
	x := startPD(t, Config{Model: "m", hooks: h}, Config{Model: "m"})
	e := startEngine(t, Config{Model: "m", Faults: Faults{StallMS: int(time.Hour / time.Millisecond)}, hooks: h})
	c := newClient(t)

	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.URL()+"/v1/completions",
			strings.NewReader(`{"model":"m","prompt":"stall"}`))
		resp, err := c.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	<-h.stalled
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("stalled request: %v, want no response before the client gave up", err)
	}

	// Prefill stalls too.
	if err := x.p.SetFaults(Faults{StallMS: int(time.Hour / time.Millisecond)}); err != nil {
		t.Fatal(err)
	}
	pctx, pcancel := context.WithCancel(context.Background())
	go func() {
		_, err := x.control.Prefill(pctx, &enginev1.PrefillRequest{Model: "m", PromptIds: []uint32{1}, DecodeTarget: x.d.KVAddr()})
		errc <- err
	}()
	<-h.stalled
	pcancel()
	if err := <-errc; status.Code(err) != codes.Canceled {
		t.Fatalf("stalled Prefill: %v", err)
	}

	// A short stall delays but completes.
	if err := e.SetFaults(Faults{StallMS: 1}); err != nil {
		t.Fatal(err)
	}
	complete(t, c, e.URL(), false, completionBody("m", "stall", nil))
}

func TestFaultsEndpoint(t *testing.T) {
	e := startEngine(t, Config{Model: "m", ControlAddr: "127.0.0.1:0"})
	c := newClient(t)
	r := post(t, c, e.URL()+"/sim/faults", `{"unavailable":true,"die":true,"die_after_tokens":2,"stall_ms":5,"no_heartbeat":true}`)
	want := Faults{Unavailable: true, Die: true, DieAfterTokens: 2, StallMS: 5, NoHeartbeat: true}
	if r.status != http.StatusOK || decode[Faults](t, r.body) != want || e.Faults() != want {
		t.Fatalf("POST /sim/faults: %d %s; engine has %+v", r.status, r.body, e.Faults())
	}
	if got := decode[Faults](t, get(t, c, e.URL()+"/sim/faults").body); got != want {
		t.Fatalf("GET /sim/faults: %+v", got)
	}
	for _, bad := range []string{`{"stall_ms":-1}`, `{"refuse":"yes"}`, `{"typo":true}`, `{`} {
		if r := post(t, c, e.URL()+"/sim/faults", bad); r.status != http.StatusBadRequest {
			t.Fatalf("POST /sim/faults %s: %d", bad, r.status)
		}
	}
	if e.Faults() != want {
		t.Fatalf("bad posts changed the faults: %+v", e.Faults())
	}

	// Refuse over HTTP, clear over the control listener.
	post(t, c, e.URL()+"/sim/faults", `{"refuse":true}`)
	if _, err := net.Dial("tcp", e.HTTPAddr()); !refused(err) {
		t.Fatalf("dial while refusing: %v", err)
	}
	if r := post(t, c, "http://"+e.ControlAddr()+"/sim/faults", `{}`); r.status != http.StatusOK {
		t.Fatalf("clearing over the control listener: %d %s", r.status, r.body)
	}
	complete(t, c, e.URL(), false, completionBody("m", "back", nil))
}

func TestKill(t *testing.T) {
	x := startPD(t, Config{Model: "m"}, Config{Model: "m", DecodePerToken: time.Hour})
	x.prefill(t, false, completionBody("m", "held", map[string]any{"seed": 1}))
	body := completionBody("m", "in flight", map[string]any{"max_tokens": 3, "stream": true})
	s := openStream(t, context.Background(), x.client, x.d.URL()+"/v1/completions", body)
	defer s.close()
	s.next(t) // one token out, then an hour per token

	x.d.Kill()
	for {
		d, err := s.tryNext()
		if err != nil {
			if !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("in-flight stream ended with %v, want an abrupt close", err)
			}
			break
		}
		if d == "[DONE]" {
			t.Fatal("killed engine finished the stream")
		}
	}
	for _, addr := range []string{x.d.HTTPAddr(), x.d.KVAddr()} {
		if _, err := net.Dial("tcp", addr); !refused(err) {
			t.Fatalf("dial %s after Kill: %v", addr, err)
		}
	}
	if st := x.d.Stats(); st.HeldHandles != 0 || st.Running != 0 {
		t.Fatalf("after Kill: %+v", st)
	}
	if err := x.d.Close(); err != nil {
		t.Fatalf("Close after Kill: %v", err)
	}
}

func TestCloseFinishesInFlight(t *testing.T) {
	e, err := Start(context.Background(), Config{Model: "m", DecodePerToken: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	c := newClient(t)
	s := openStream(t, context.Background(), c, e.URL()+"/v1/completions",
		completionBody("m", "finish me", map[string]any{"max_tokens": 20, "stream": true}))
	defer s.close()
	s.next(t)
	closed := make(chan error, 1)
	go func() { closed <- e.Close() }()
	var last string
	for {
		d, err := s.tryNext()
		if err != nil {
			break
		}
		last = d
	}
	if last != "[DONE]" {
		t.Fatalf("stream cut at close: last %q", last)
	}
	if err := <-closed; err != nil {
		t.Fatalf("Close: %v", err)
	}
	if st := e.Stats(); st.Completed != 1 {
		t.Fatalf("after Close: %+v", st)
	}
}
