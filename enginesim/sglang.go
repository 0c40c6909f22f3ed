package enginesim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	kvv1 "github.com/tlgate/tlgate/protos/tl/kv/v1"
)

// SGLang's disaggregation: a prefill engine has a bootstrap port; a router
// sends the same request at once to a prefill and a decode engine with
// bootstrap_host, bootstrap_port (the prefill's) and bootstrap_room. The
// decode engine joins the room on the prefill's bootstrap port, giving
// its KV transfer address; the prefill engine prefills, samples the first
// token, pushes the KV (tl.kv.v1 Push, standing in for SGLang's transfer
// engine) into the room's handle on the decode engine, which answers the
// client. A room nobody joins fails on both sides after RoomTimeout.

// roomHandlePrefix names the handle a room's KV is pushed under.
const roomHandlePrefix = "sglang-room-"

// errRoomTimeout is wrapped when a bootstrap room is not joined, or its KV
// does not arrive, in time.
var errRoomTimeout = errors.New("bootstrap room timed out")

// bootstrapRoom is the request's bootstrap fields.
type bootstrapRoom struct {
	host string
	port int
	room uint64
}

// room is a bootstrap room on a prefill engine: the decode engine that
// joined it (its KV address), signalled by joined.
type room struct {
	kvAddr string
	joined chan struct{}
	timer  *time.Timer
}

// rooms are a prefill engine's bootstrap rooms.
type rooms struct {
	mu      sync.Mutex
	m       map[uint64]*room
	timeout time.Duration
}

// get returns the room, creating it (forgotten after the timeout unless
// taken first).
func (rs *rooms) get(id uint64) *room {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if r := rs.m[id]; r != nil {
		return r
	}
	r := &room{joined: make(chan struct{})}
	r.timer = time.AfterFunc(rs.timeout, func() { rs.forget(id, r) })
	rs.m[id] = r
	return r
}

func (rs *rooms) forget(id uint64, r *room) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.m[id] == r {
		delete(rs.m, id)
		r.timer.Stop()
	}
}

// join records the decode engine of a room; false if one joined already.
func (rs *rooms) join(id uint64, kvAddr string) bool {
	r := rs.get(id)
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if r.kvAddr != "" {
		return false
	}
	r.kvAddr = kvAddr
	close(r.joined)
	return true
}

// wait returns the KV address of the decode engine that joins the room
// within the timeout.
func (rs *rooms) wait(ctx context.Context, id uint64) (string, error) {
	r := rs.get(id)
	defer rs.forget(id, r)
	t := time.NewTimer(rs.timeout)
	defer t.Stop()
	select {
	case <-r.joined:
		rs.mu.Lock()
		defer rs.mu.Unlock()
		return r.kvAddr, nil
	case <-t.C:
		return "", fmt.Errorf("%w: no decode engine joined bootstrap room %d within %v", errRoomTimeout, id, rs.timeout)
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// joinRequest is the body a decode engine POSTs to join a room.
type joinRequest struct {
	KVAddress string `json:"kv_address"`
	Model     string `json:"model"`
}

// bootstrapHandler serves the bootstrap port: POST /bootstrap/rooms/{room}.
func (e *Engine) bootstrapHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /bootstrap/rooms/{room}", func(w http.ResponseWriter, r *http.Request) {
		id, err := strconv.ParseUint(r.PathValue("room"), 10, 64)
		if err != nil {
			writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_request", "room must be an unsigned 64-bit integer")
			return
		}
		var req joinRequest
		if !e.readJSON(w, r, &req) {
			return
		}
		switch {
		case req.Model != e.cfg.Model:
			writeModelNotFound(w, req.Model)
		case req.KVAddress == "":
			writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_request", "kv_address is required")
		case !e.rooms.join(id, req.KVAddress):
			writeError(w, http.StatusConflict, "invalid_request_error", "room_taken", fmt.Sprintf("bootstrap room %d has a decode engine already", id))
		default:
			writeJSON(w, http.StatusOK, map[string]any{"room": id, "joined": true})
		}
	})
	return e.track(mux)
}

// sglangPrefill serves the prefill side of a room: prefill (keeping the
// prompt's blocks), wait for the decode engine to join, push the KV to it.
// The answer to its own client is the one token it sampled.
func (e *Engine) sglangPrefill(ctx context.Context, g *genRequest, out *output) (result, error) {
	g.maxTokens, g.keepPrompt = 1, true
	res, err := e.generate(ctx, g, nil, out.emit)
	if err != nil {
		return res, err
	}
	defer e.core.releaseBlocks(res.kept)
	addr, err := e.rooms.wait(ctx, g.room.room)
	if err != nil {
		return res, err
	}
	id := roomHandlePrefix + strconv.FormatUint(g.room.room, 10)
	header := &kvv1.KvHeader{
		HandleId: id, Model: e.cfg.Model, KvFormat: e.cfg.KVFormat, PromptIds: g.prompt,
		FirstToken: res.first.Token, FirstLogprob: float32(res.first.Logprob), Seed: g.seed,
		RngDrawsConsumed: res.draws, NumBlocks: uint32(blockCount(len(g.prompt))),
	}
	if err := e.push(ctx, addr, header, e.hash.promptBlocks(g.prompt)); err != nil {
		return res, fmt.Errorf("%w: push to the decode engine of room %d: %w", errKVTransfer, g.room.room, err)
	}
	return res, nil
}

// sglangJoin joins the room on the prefill engine's bootstrap port and
// waits for its KV; the handle it returns resumes the request.
func (e *Engine) sglangJoin(ctx context.Context, g *genRequest) (*handle, error) {
	id := roomHandlePrefix + strconv.FormatUint(g.room.room, 10)
	arrived := e.expectKV(id)
	defer e.forgetKV(id)
	// SGLang's decode engine joins f"{bootstrap_host}:{bootstrap_port}":
	// an IPv6 host must come bracketed.
	boot := g.room.host + ":" + strconv.Itoa(g.room.port)
	if e.Faults().UnreachablePrefill {
		return nil, fmt.Errorf("%w: bootstrap %s unreachable (injected fault)", errKVTransfer, boot)
	}
	body, _ := json.Marshal(joinRequest{KVAddress: e.advertised(e.KVAddr()), Model: e.cfg.Model})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost,
		"http://"+boot+"/bootstrap/rooms/"+strconv.FormatUint(g.room.room, 10), bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("%w: bootstrap %s: %w", errKVTransfer, boot, err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := e.bootClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%w: bootstrap %s: %w", errKVTransfer, boot, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%w: bootstrap %s answered %d to joining room %d", errKVTransfer, boot, resp.StatusCode, g.room.room)
	}
	t := time.NewTimer(e.cfg.RoomTimeout)
	defer t.Stop()
	select {
	case <-arrived:
	case <-t.C:
		return nil, fmt.Errorf("%w: no KV arrived in bootstrap room %d within %v", errRoomTimeout, g.room.room, e.cfg.RoomTimeout)
	case <-ctx.Done():
		e.core.release(id) // it may arrive as we give up
		return nil, ctx.Err()
	}
	h := e.core.take(id)
	if h == nil {
		return nil, fmt.Errorf("%w: the KV of room %d expired", errKVTransfer, g.room.room)
	}
	if !g.seeded { // continue the stream the prefill engine began
		g.seed = h.header.GetSeed()
	}
	return h, nil
}

// expectKV returns a channel closed when KV is pushed under id.
func (e *Engine) expectKV(id string) chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	ch := make(chan struct{})
	e.arrivals[id] = ch
	return ch
}

func (e *Engine) forgetKV(id string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.arrivals, id)
}

// kvArrived signals the request waiting for KV pushed under id.
func (e *Engine) kvArrived(id string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if ch := e.arrivals[id]; ch != nil {
		close(ch)
		delete(e.arrivals, id)
	}
}
