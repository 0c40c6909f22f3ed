package enginesim

import (
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"
)

// nixlProxy plays vLLM's toy proxy (disaggregated_serving): the prefill
// engine is asked with do_remote_decode, max_tokens 1 and stream false,
// and the decode engine gets the client's body with the kv_transfer_params
// the prefill engine answered.
func nixlProxy(t *testing.T, c *http.Client, p, d *Engine, chat bool, body map[string]any) (generation, map[string]any) {
	t.Helper()
	path := "/v1/completions"
	if chat {
		path = "/v1/chat/completions"
	}
	pre := map[string]any{}
	for k, v := range body {
		pre[k] = v
	}
	pre["kv_transfer_params"] = map[string]any{"do_remote_decode": true, "do_remote_prefill": false,
		"remote_engine_id": nil, "remote_block_ids": nil, "remote_host": nil, "remote_port": nil}
	pre["stream"], pre["max_tokens"] = false, 1
	delete(pre, "stream_options")
	if chat {
		pre["max_completion_tokens"] = 1
	}
	r := post(t, c, p.URL()+path, pre)
	if r.status != http.StatusOK {
		t.Fatalf("prefill: %d %s", r.status, r.body)
	}
	params := decode[struct {
		KVTransferParams map[string]any `json:"kv_transfer_params"`
	}](t, r.body).KVTransferParams
	if params == nil {
		t.Fatalf("the prefill answer has no kv_transfer_params: %s", r.body)
	}
	dec := map[string]any{"kv_transfer_params": params}
	for k, v := range body {
		dec[k] = v
	}
	return complete(t, c, d.URL(), chat, dec), params
}

// TestNixlProtocolEqualsUnified checks vLLM's disaggregation protocol as
// vLLM's proxy drives it: the prefill engine answers kv_transfer_params
// naming itself and the blocks it holds, the decode engine pulls them
// (tl.kv.v1 Pull for NIXL), computes the last prompt token and decodes:
// with one seed its output equals a unified engine's, streamed or not, on
// both schedulers; the prefill engine frees the blocks once pulled.
func TestNixlProtocolEqualsUnified(t *testing.T) {
	for _, mode := range []string{"flat", "step"} {
		t.Run(mode, func(t *testing.T) {
			cfg := func(role string) Config {
				c := Config{Model: "m", Role: role}
				if mode == "step" {
					c = stepConfig(c)
				}
				return c
			}
			u, p, d := startEngine(t, cfg(RoleUnified)), startEngine(t, cfg(RolePrefill)), startEngine(t, cfg(RoleDecode))
			c := newClient(t)
			prompt := unsurePrompt(t, u)
			for _, chat := range []bool{false, true} {
				for _, stream := range []bool{false, true} {
					for _, seed := range []int{1, 42} {
						extra := map[string]any{"seed": seed, "max_tokens": 20, "logprobs": 2, "stream": stream}
						body := completionBody("m", prompt, extra)
						if chat {
							extra["logprobs"], extra["top_logprobs"] = true, 2
							body = chatBody("m", prompt, extra)
						}
						want := complete(t, c, u.URL(), chat, body)
						got, params := nixlProxy(t, c, p, d, chat, body)
						if !reflect.DeepEqual(got, want) {
							t.Fatalf("chat=%v stream=%v seed=%d: NIXL disaggregated\n%+v\nunified\n%+v", chat, stream, seed, got, want)
						}
						for _, k := range []string{"remote_engine_id", "remote_block_ids", "remote_host", "remote_port", "remote_request_id", "tp_size"} {
							if params[k] == nil {
								t.Fatalf("kv_transfer_params lack %s: %v", k, params)
							}
						}
						if params["do_remote_prefill"] != true || params["remote_engine_id"] != p.ID() {
							t.Fatalf("kv_transfer_params %v", params)
						}
					}
				}
			}
			for _, e := range []*Engine{p, d} {
				if s := e.Stats(); s.HeldHandles != 0 || s.FreeBlocks != s.TotalBlocks || s.Running != 0 {
					t.Fatalf("%s after the requests: %+v", e.Role(), s)
				}
			}
			// A second pull of the same blocks finds nothing: they were freed.
			body := completionBody("m", prompt, map[string]any{"seed": 1})
			_, params := nixlProxy(t, c, p, d, false, body)
			r := post(t, c, d.URL()+"/v1/completions", map[string]any{"model": "m", "prompt": prompt, "seed": 1, "kv_transfer_params": params})
			if r.status != http.StatusServiceUnavailable || !strings.Contains(string(r.body), "kv_transfer_failed") {
				t.Fatalf("second pull: %d %s", r.status, r.body)
			}
			// Misuse is named.
			for _, bad := range []map[string]any{
				{"model": "m", "prompt": "x", "kv_transfer_params": map[string]any{"do_remote_decode": true}},
				{"model": "m", "prompt": "x", "kv_transfer_params": map[string]any{"do_remote_prefill": true}},
			} {
				if r := post(t, c, u.URL()+"/v1/completions", bad); r.status != http.StatusBadRequest {
					t.Fatalf("%v on a unified engine: %d %s", bad, r.status, r.body)
				}
			}
			if r := post(t, c, p.URL()+"/v1/completions", map[string]any{"model": "m", "prompt": "x", "stream": true,
				"kv_transfer_params": map[string]any{"do_remote_decode": true}}); r.status != http.StatusBadRequest || !strings.Contains(string(r.body), "stream") {
				t.Fatalf("streamed remote decode: %d %s", r.status, r.body)
			}
		})
	}
}

// TestNixlPrefillFreesAfterTimeout checks that a prefill engine frees the
// blocks it holds for a remote decode that never pulls them, after
// RemoteDecodeTimeout (vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT); a late
// pull fails with kv_transfer_failed.
func TestNixlPrefillFreesAfterTimeout(t *testing.T) {
	h := &hooks{expired: make(chan struct{}, 1)}
	p := startEngine(t, Config{Model: "m", Role: RolePrefill, RemoteDecodeTimeout: 50 * time.Millisecond, hooks: h})
	d := startEngine(t, Config{Model: "m", Role: RoleDecode})
	c := newClient(t)
	prompt := "A prompt of some length, long enough to fill a block or two of sixteen tokens each."
	r := post(t, c, p.URL()+"/v1/completions", map[string]any{"model": "m", "prompt": prompt, "max_tokens": 1, "seed": 3,
		"kv_transfer_params": map[string]any{"do_remote_decode": true}})
	if r.status != http.StatusOK {
		t.Fatalf("prefill: %d %s", r.status, r.body)
	}
	params := decode[struct {
		KVTransferParams map[string]any `json:"kv_transfer_params"`
	}](t, r.body).KVTransferParams
	if s := p.Stats(); s.HeldHandles != 1 || s.HeldBlocks == 0 {
		t.Fatalf("the prefill engine holds %d handles, %d blocks for the remote decode", s.HeldHandles, s.HeldBlocks)
	}
	select {
	case <-h.expired:
	case <-time.After(10 * time.Second):
		t.Fatal("the held blocks never expired")
	}
	if s := p.Stats(); s.HeldHandles != 0 || s.HeldBlocks != 0 || s.FreeBlocks != s.TotalBlocks || s.HandlesExpired != 1 {
		t.Fatalf("after the timeout: %+v", s)
	}
	r = post(t, c, d.URL()+"/v1/completions", map[string]any{"model": "m", "prompt": prompt, "seed": 3, "kv_transfer_params": params})
	if r.status != http.StatusServiceUnavailable || !strings.Contains(string(r.body), "kv_transfer_failed") {
		t.Fatalf("late pull: %d %s", r.status, r.body)
	}
}

// sglangRouter plays SGLang's router: the same request, with the prefill
// engine's bootstrap address and a room, sent at once to the prefill and
// the decode engine; the client gets the decode engine's answer.
func sglangRouter(t *testing.T, c *http.Client, p, d *Engine, chat bool, body map[string]any, room uint64) (response, response) {
	t.Helper()
	path := "/v1/completions"
	if chat {
		path = "/v1/chat/completions"
	}
	host, port := splitHostPort(t, p.BootstrapAddr())
	req := map[string]any{"bootstrap_host": host, "bootstrap_port": port, "bootstrap_room": room}
	for k, v := range body {
		req[k] = v
	}
	pr := make(chan response, 1)
	go func() {
		r, err := tryPost(c, p.URL()+path, req)
		if err != nil {
			t.Errorf("prefill: %v", err)
		}
		pr <- r
	}()
	dr := post(t, c, d.URL()+path, req)
	return <-pr, dr
}

func splitHostPort(t *testing.T, addr string) (string, int) {
	t.Helper()
	i := strings.LastIndexByte(addr, ':')
	var port int
	if _, err := fmt.Sscan(addr[i+1:], &port); err != nil {
		t.Fatal(err)
	}
	return addr[:i], port
}

// TestSGLangBootstrapEqualsUnified checks SGLang's disaggregation: the
// request sent at once to a prefill engine (with a bootstrap port) and a
// decode engine meets in its room; the prefill engine pushes the KV and
// the first token, and the decode engine's answer equals a unified
// engine's, streamed or not, on both schedulers.
func TestSGLangBootstrapEqualsUnified(t *testing.T) {
	for _, mode := range []string{"flat", "step"} {
		t.Run(mode, func(t *testing.T) {
			cfg := func(role string) Config {
				c := Config{Model: "m", Role: role}
				if role == RolePrefill {
					c.BootstrapAddr = "127.0.0.1:0"
				}
				if mode == "step" {
					c = stepConfig(c)
				}
				return c
			}
			u, p, d := startEngine(t, cfg(RoleUnified)), startEngine(t, cfg(RolePrefill)), startEngine(t, cfg(RoleDecode))
			c := newClient(t)
			prompt := unsurePrompt(t, u)
			room := uint64(1 << 62)
			for _, chat := range []bool{false, true} {
				for _, stream := range []bool{false, true} {
					room++
					extra := map[string]any{"seed": 7, "max_tokens": 20, "logprobs": 2, "stream": stream}
					body := completionBody("m", prompt, extra)
					if chat {
						extra["logprobs"], extra["top_logprobs"] = true, 2
						body = chatBody("m", prompt, extra)
					}
					want := complete(t, c, u.URL(), chat, body)
					pr, dr := sglangRouter(t, c, p, d, chat, body, room)
					if pr.status != http.StatusOK || dr.status != http.StatusOK {
						t.Fatalf("prefill %d %s, decode %d %s", pr.status, pr.body, dr.status, dr.body)
					}
					gotD := parseGeneration(t, chat, stream, dr.body)
					if !reflect.DeepEqual(gotD, want) {
						t.Fatalf("chat=%v stream=%v: SGLang disaggregated\n%+v\nunified\n%+v", chat, stream, gotD, want)
					}
				}
			}
			for _, e := range []*Engine{p, d} {
				if s := e.Stats(); s.HeldHandles != 0 || s.FreeBlocks != s.TotalBlocks || s.Running != 0 {
					t.Fatalf("%s after the requests: %+v", e.Role(), s)
				}
			}
		})
	}
}

// TestSGLangRoomTimesOut checks that a room nobody joins fails on both
// sides: the prefill engine's request when no decode engine joins, the
// decode engine's when no KV arrives; neither holds blocks after.
func TestSGLangRoomTimesOut(t *testing.T) {
	p := startEngine(t, Config{Model: "m", Role: RolePrefill, BootstrapAddr: "127.0.0.1:0", RoomTimeout: 100 * time.Millisecond})
	d := startEngine(t, Config{Model: "m", Role: RoleDecode, RoomTimeout: 100 * time.Millisecond})
	c := newClient(t)
	host, port := splitHostPort(t, p.BootstrapAddr())
	body := map[string]any{"model": "m", "prompt": "Nobody comes to this room.", "seed": 1,
		"bootstrap_host": host, "bootstrap_port": port, "bootstrap_room": 99}
	// The prefill side alone: no decode engine joins.
	if r := post(t, c, p.URL()+"/v1/completions", body); r.status != http.StatusServiceUnavailable || !strings.Contains(string(r.body), "bootstrap_timeout") {
		t.Fatalf("prefill alone: %d %s", r.status, r.body)
	}
	// The decode side alone: it joins, no prefill comes, no KV arrives.
	body["bootstrap_room"] = 100
	if r := post(t, c, d.URL()+"/v1/completions", body); r.status != http.StatusServiceUnavailable || !strings.Contains(string(r.body), "bootstrap_timeout") {
		t.Fatalf("decode alone: %d %s", r.status, r.body)
	}
	for _, e := range []*Engine{p, d} {
		if s := e.Stats(); s.HeldHandles != 0 || s.FreeBlocks != s.TotalBlocks || s.Running != 0 {
			t.Fatalf("%s after the timeouts: %+v", e.Role(), s)
		}
	}
	// A decode engine that cannot reach the bootstrap port says so.
	body["bootstrap_port"], body["bootstrap_room"] = 1, 101
	if r := post(t, c, d.URL()+"/v1/completions", body); r.status != http.StatusServiceUnavailable || !strings.Contains(string(r.body), "kv_transfer_failed") {
		t.Fatalf("unreachable bootstrap: %d %s", r.status, r.body)
	}
}

// TestDisaggFaults checks the disaggregation faults: a prefill engine
// that refuses pulls (as one that died holding blocks) and a decode
// engine that cannot reach its prefill engine both fail the decode
// request with kv_transfer_failed, before its first byte.
func TestDisaggFaults(t *testing.T) {
	p := startEngine(t, Config{Model: "m", Role: RolePrefill, BootstrapAddr: "127.0.0.1:0", Faults: Faults{RefusePull: true}})
	d := startEngine(t, Config{Model: "m", Role: RoleDecode})
	c := newClient(t)
	body := completionBody("m", "A prompt for a prefill engine that will not give its KV.", map[string]any{"seed": 1})
	r := post(t, c, p.URL()+"/v1/completions", map[string]any{"model": "m", "prompt": body["prompt"], "seed": 1, "max_tokens": 1,
		"kv_transfer_params": map[string]any{"do_remote_decode": true}})
	params := decode[struct {
		KVTransferParams map[string]any `json:"kv_transfer_params"`
	}](t, r.body).KVTransferParams
	dec := map[string]any{"model": "m", "prompt": body["prompt"], "seed": 1, "kv_transfer_params": params}
	if r := post(t, c, d.URL()+"/v1/completions", dec); r.status != http.StatusServiceUnavailable || !strings.Contains(string(r.body), "kv_transfer_failed") {
		t.Fatalf("refused pull: %d %s", r.status, r.body)
	}
	if s := p.Stats(); s.HeldHandles != 1 {
		t.Fatalf("the refusing prefill engine holds %d handles, want 1 (freed by its timeout)", s.HeldHandles)
	}
	p.SetFaults(Faults{})
	if err := d.SetFaults(Faults{UnreachablePrefill: true}); err != nil {
		t.Fatal(err)
	}
	if r := post(t, c, d.URL()+"/v1/completions", dec); r.status != http.StatusServiceUnavailable || !strings.Contains(string(r.body), "unreachable") {
		t.Fatalf("unreachable prefill engine: %d %s", r.status, r.body)
	}
	d.SetFaults(Faults{})
	if got := complete(t, c, d.URL(), false, dec); got.Usage.CompletionTokens == 0 {
		t.Fatal("no answer once the faults are cleared")
	}
}

// TestNixlPrefillStops: with prefill_stops, a prefill engine's remote
// decode ends stopped at its one token, as vLLM's when it samples EOS or a
// stop token id: finish_reason "stop", no kv_transfer_params, nothing held
// (NixlConnector holds KV only for a request that finished length-capped).
func TestNixlPrefillStops(t *testing.T) {
	p := startEngine(t, Config{Model: "m", Role: RolePrefill, Faults: Faults{PrefillStops: true}})
	c := newClient(t)
	r := post(t, c, p.URL()+"/v1/completions", map[string]any{"model": "m", "prompt": "A prompt whose first token ends it.", "max_tokens": 1, "seed": 3,
		"kv_transfer_params": map[string]any{"do_remote_decode": true}})
	if r.status != http.StatusOK {
		t.Fatalf("prefill: %d %s", r.status, r.body)
	}
	a := decode[struct {
		Choices []struct {
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		KVTransferParams map[string]any `json:"kv_transfer_params"`
	}](t, r.body)
	if len(a.Choices) != 1 || a.Choices[0].FinishReason != "stop" || a.KVTransferParams != nil {
		t.Fatalf("prefill answer %s: want finish_reason stop and no kv_transfer_params", r.body)
	}
	if s := p.Stats(); s.HeldHandles != 0 || s.HeldBlocks != 0 {
		t.Fatalf("the prefill engine holds %d handles, %d blocks", s.HeldHandles, s.HeldBlocks)
	}
}
