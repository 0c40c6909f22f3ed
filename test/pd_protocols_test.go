package test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/runtime/gateway"
)

// clientBody is a chat request's body with every field a vLLM prefill leg
// drops or rewrites, and some it keeps.
func clientBody(chat bool) (string, map[string]any) {
	b := map[string]any{"model": "big-pd", "stream": true, "stream_options": map[string]any{"include_usage": true},
		"min_tokens": 2, "seed": 5, "temperature": 0.7, "top_p": 0.9, "user": "u-1", "max_tokens": 24}
	if chat {
		b["messages"] = []map[string]string{{"role": "user", "content": "Say something about prefill."}}
		b["max_completion_tokens"], b["min_completion_tokens"] = 20, 2
		return "/v1/chat/completions", b
	}
	b["prompt"] = "Say something about prefill."
	return "/v1/completions", b
}

// asJSON is v through JSON, numbers as json.Number (as the front reads).
func asJSON(t *testing.T, v any) map[string]any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestVLLMPrefillSeesOneTokenNoStream checks the prefill leg's body field
// by field against vLLM's proxy protocol (toy_proxy_server.py): the
// client's body with kv_transfer_params asking for a remote decode (every
// remote_* field null), stream false, max_tokens 1, max_completion_tokens
// 1 when the client sent one, without stream_options, min_tokens and
// min_completion_tokens; the model the served id; every other field as
// sent. The decode leg gets the client's body (min_tokens kept) with the
// kv_transfer_params the prefill engine answered, and both legs carry the
// same X-Request-Id.
func TestVLLMPrefillSeesOneTokenNoStream(t *testing.T) {
	f := newPDFleet(t, pdOpts{}, pdSpec{id: "p", kind: "vllm", role: "prefill"}, pdSpec{id: "d", kind: "vllm", role: "decode"})
	p, d := f.byID["p"], f.byID["d"]
	for i, chat := range []bool{true, false} {
		path, body := clientBody(chat)
		r := f.post(path, "", body)
		if r.status != 200 || !strings.Contains(string(r.body), "data: [DONE]") {
			t.Fatalf("chat=%v: %d %s", chat, r.status, r.body)
		}
		id := r.header.Get("X-Request-Id")
		pr, dr := p.front.requests(), d.front.requests()
		if len(pr) != i+1 || len(dr) != i+1 {
			t.Fatalf("chat=%v: the prefill engine got %d requests, the decode engine %d", chat, len(pr), len(dr))
		}
		pb, db := pr[i], dr[i]
		if pb.path != path || db.path != path || pb.requestID != id || db.requestID != id {
			t.Fatalf("chat=%v: legs %s %q and %s %q, want %s with the request's id %q", chat, pb.path, pb.requestID, db.path, db.requestID, path, id)
		}
		want := asJSON(t, body)
		want["model"] = "big"
		want["stream"] = false
		want["max_tokens"] = json.Number("1")
		if chat {
			want["max_completion_tokens"] = json.Number("1")
		}
		delete(want, "stream_options")
		delete(want, "min_tokens")
		delete(want, "min_completion_tokens")
		want["kv_transfer_params"] = map[string]any{"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": nil,
			"remote_block_ids": nil, "remote_host": nil, "remote_port": nil}
		for k, v := range want {
			if !reflect.DeepEqual(pb.body[k], v) {
				t.Errorf("chat=%v: prefill leg's %s = %#v, want %#v", chat, k, pb.body[k], v)
			}
		}
		for k := range pb.body {
			if _, ok := want[k]; !ok {
				t.Errorf("chat=%v: prefill leg has %s = %#v, which vLLM's proxy protocol does not send", chat, k, pb.body[k])
			}
		}
		// The decode leg: the client's request, with the params.
		kv, _ := db.body["kv_transfer_params"].(map[string]any)
		_, grpcPort, _ := net.SplitHostPort(p.e.GRPCAddr())
		if kv["do_remote_prefill"] != true || kv["remote_engine_id"] != "p" || kv["remote_host"] != "127.0.0.1" ||
			fmt.Sprint(kv["remote_port"]) != grpcPort || kv["remote_block_ids"] == nil || kv["remote_request_id"] == nil {
			t.Errorf("chat=%v: decode leg's kv_transfer_params %v: want the prefill engine's answer", chat, kv)
		}
		for k, v := range asJSON(t, body) {
			if k == "model" {
				v = "big"
			}
			if !reflect.DeepEqual(db.body[k], v) {
				t.Errorf("chat=%v: decode leg's %s = %#v, want the client's %#v", chat, k, db.body[k], v)
			}
		}
	}
}

// TestVLLMPrefillStoppedDecodesWithoutParams: a vLLM prefill engine whose
// one token ends the request (EOS or a stop token id: the reference
// engine's prefill_stops fault) holds no KV and answers 200 with no
// kv_transfer_params (NixlConnector gives params only to a request that
// finished length-capped). That is not a bad answer: as vLLM's toy proxy
// does, the decode leg goes without kv_transfer_params and the decode
// engine prefills the prompt itself, so the answer is the unified
// engine's, on the first pair, with no leg failed and no worker blamed.
func TestVLLMPrefillStoppedDecodesWithoutParams(t *testing.T) {
	var reps pdReports
	f := newPDFleet(t, pdOpts{deps: reps.hook}, pdSpec{id: "u", kind: "vllm"},
		pdSpec{id: "p", kind: "vllm", role: "prefill", cfg: enginesim.Config{Faults: enginesim.Faults{PrefillStops: true}}},
		pdSpec{id: "d", kind: "vllm", role: "decode"})
	for i, chat := range []bool{false, true} {
		path, body := pdBody("big-pd", chat, chat, 5)
		f.unifiedEquals(t, path, body, f.post(path, "", body))
		if pr := f.byID["p"].front.requests(); len(pr) != i+1 {
			t.Fatalf("chat=%v: %d prefill legs for %d requests", chat, len(pr), i+1)
		}
		dr := f.byID["d"].front.requests()
		if len(dr) != i+1 {
			t.Fatalf("chat=%v: %d decode legs for %d requests", chat, len(dr), i+1)
		}
		if kv, ok := dr[i].body["kv_transfer_params"]; ok {
			t.Fatalf("chat=%v: the decode leg carried kv_transfer_params %v, want none", chat, kv)
		}
	}
	reps.wantProtocol(t, "vllm", 2)
	reps.mu.Lock()
	defer reps.mu.Unlock()
	for _, r := range reps.reps {
		if len(r.Failures) != 0 {
			t.Fatalf("legs failed: %v", r.Failures)
		}
	}
	if s := f.byID["p"].e.Stats(); s.HeldHandles != 0 {
		t.Fatalf("the prefill engine holds %d handles", s.HeldHandles)
	}
}

// TestVLLMPairTakesOnePromptAndChoice: a vLLM prefill engine answers one
// request's kv_transfer_params (a batch's first prompt's, one of n
// choices'), so a vLLM pair refuses a batch of prompts and n above 1 with
// 400 invalid_request naming the field, as tlgate's own contract refuses a
// batch, before either leg is sent: the request's fault, no worker blamed.
// One prompt in an array, token ids and n = 1 are served.
func TestVLLMPairTakesOnePromptAndChoice(t *testing.T) {
	f := newPDFleet(t, pdOpts{}, pdSpec{id: "p", kind: "vllm", role: "prefill"}, pdSpec{id: "d", kind: "vllm", role: "decode"})
	msgs := []map[string]string{{"role": "user", "content": "Hello there"}}
	cases := []struct {
		name, path string
		body       map[string]any
		param      string // "" for served
	}{
		{"a batch of texts", "/v1/completions", map[string]any{"prompt": []string{"Hello there", "Another prompt entirely"}}, "prompt"},
		{"a batch of token arrays", "/v1/completions", map[string]any{"prompt": [][]int{{5, 6, 7}, {8, 9}}}, "prompt"},
		{"n of 2", "/v1/completions", map[string]any{"prompt": "Hello there", "n": 2}, "n"},
		{"chat n of 3", "/v1/chat/completions", map[string]any{"messages": msgs, "n": 3}, "n"},
		{"one text in an array", "/v1/completions", map[string]any{"prompt": []string{"Hello there"}}, ""},
		{"token ids", "/v1/completions", map[string]any{"prompt": []int{5, 6, 7, 8}}, ""},
		{"n of 1", "/v1/chat/completions", map[string]any{"messages": msgs, "n": 1}, ""},
	}
	legs := 0
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.body["model"], tc.body["max_tokens"] = "big-pd", 4
			r := f.post(tc.path, "", tc.body)
			if tc.param == "" {
				legs++
			}
			if p, d := len(f.byID["p"].front.requests()), len(f.byID["d"].front.requests()); p != legs || d != legs {
				t.Fatalf("%d prefill and %d decode legs, want %d of each (%d %s)", p, d, legs, r.status, r.body)
			}
			if tc.param == "" {
				if r.status != http.StatusOK {
					t.Fatalf("%d %s", r.status, r.body)
				}
			} else {
				var e struct {
					Error struct {
						Code  string `json:"code"`
						Param string `json:"param"`
					} `json:"error"`
				}
				if r.status != http.StatusBadRequest || json.Unmarshal(r.body, &e) != nil || e.Error.Code != "invalid_request" || e.Error.Param != tc.param {
					t.Fatalf("%d %s, want 400 invalid_request naming %s", r.status, r.body, tc.param)
				}
			}
		})
	}
}

// TestSGLangRoomIsRandomAndShared: each request goes to its prefill and its
// decode engine with one bootstrap room, the prefill engine's host and
// bootstrap port; rooms are drawn at random, never twice, within SGLang's
// [0, 2^63), and differ between requests, streamed or not.
func TestSGLangRoomIsRandomAndShared(t *testing.T) {
	f := newPDFleet(t, pdOpts{}, pdSpec{id: "p", kind: "sglang", role: "prefill"}, pdSpec{id: "d", kind: "sglang", role: "decode"})
	p, d := f.byID["p"], f.byID["d"]
	_, bootPort, _ := net.SplitHostPort(p.e.BootstrapAddr())
	const n = 16
	for i := range n {
		path, body := pdBody("big-pd", i%2 == 0, i%3 == 0, i)
		if r := f.post(path, "", body); r.status != 200 {
			t.Fatalf("request %d: %d %s", i, r.status, r.body)
		}
	}
	rooms := map[string]uint64{}
	for _, q := range p.front.requests() {
		if q.body["bootstrap_host"] != "127.0.0.1" || fmt.Sprint(q.body["bootstrap_port"]) != bootPort || q.body["stream"] != false {
			t.Fatalf("prefill leg %v: want host 127.0.0.1, the bootstrap port %s, whole", q.body, bootPort)
		}
		room, err := strconv.ParseUint(fmt.Sprint(q.body["bootstrap_room"]), 10, 64)
		if err != nil || room >= 1<<63 {
			t.Fatalf("room %v: %v, want an integer in [0, 2^63)", q.body["bootstrap_room"], err)
		}
		rooms[q.requestID] = room
	}
	dr := d.front.requests()
	if len(rooms) != n || len(dr) != n {
		t.Fatalf("%d prefill legs, %d decode legs for %d requests", len(rooms), len(dr), n)
	}
	var all []uint64
	for _, q := range dr {
		room, _ := strconv.ParseUint(fmt.Sprint(q.body["bootstrap_room"]), 10, 64)
		if want, ok := rooms[q.requestID]; !ok || room != want || q.body["bootstrap_host"] != "127.0.0.1" || fmt.Sprint(q.body["bootstrap_port"]) != bootPort {
			t.Fatalf("decode leg of %s: room %d, host %v, port %v; its prefill leg's room %d", q.requestID, room, q.body["bootstrap_host"], q.body["bootstrap_port"], want)
		}
		all = append(all, room)
	}
	slices.Sort(all)
	for i := 1; i < len(all); i++ {
		// 16 rooms drawn uniformly from 2^63 fall closer than 2^40 with
		// a chance of about 1 in 30000; counted rooms always would.
		if all[i]-all[i-1] < 1<<40 {
			t.Fatalf("rooms %d and %d are %d apart: not drawn at random", all[i-1], all[i], all[i]-all[i-1])
		}
	}
}

// TestSGLangIPv6PrefillBootstrapHost: an SGLang prefill engine at an IPv6
// address is named to both legs with its host bracketed ("[::1]"), as
// SGLang's routers send it: the decode engine joins the room at
// f"{bootstrap_host}:{bootstrap_port}", which a bare "::1" would make
// "::1:port", an address nobody can dial.
func TestSGLangIPv6PrefillBootstrapHost(t *testing.T) {
	if l, err := net.Listen("tcp", "[::1]:0"); err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	} else {
		l.Close()
	}
	f := newPDFleet(t, pdOpts{},
		pdSpec{id: "p", kind: "sglang", role: "prefill", direct: true, cfg: enginesim.Config{HTTPAddr: "[::1]:0", BootstrapAddr: "[::1]:0"}},
		pdSpec{id: "d", kind: "sglang", role: "decode"})
	path, body := pdBody("big-pd", false, false, 3)
	if r := f.post(path, "", body); r.status != 200 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	dr := f.byID["d"].front.requests()
	if len(dr) != 1 || dr[0].body["bootstrap_host"] != "[::1]" {
		t.Fatalf("decode legs %v, want one with bootstrap_host [::1]", dr)
	}
}

// pdFailoverFleet is one protocol's fleet for the failover tests: a
// unified engine, prefill engines p1 and p2, decode engines d1 and d2.
func pdFailoverFleet(t *testing.T, kind string, o pdOpts, cfg map[string]enginesim.Config) *pdFleet {
	specs := []pdSpec{{id: "u", kind: kind}, {id: "p1", kind: kind, role: "prefill"}, {id: "p2", kind: kind, role: "prefill"},
		{id: "d1", kind: kind, role: "decode"}, {id: "d2", kind: kind, role: "decode"}}
	for i := range specs {
		specs[i].cfg = cfg[specs[i].id]
	}
	return newPDFleet(t, o, specs...)
}

// unifiedEquals checks that answer r of a disaggregated request equals the
// unified engine's answer to the same body.
func (f *pdFleet) unifiedEquals(t *testing.T, path string, body map[string]any, r reply) {
	t.Helper()
	ub := map[string]any{}
	for k, v := range body {
		ub[k] = v
	}
	ub["model"] = "big"
	u := f.post(path, "", ub)
	if r.status != 200 || u.status != 200 {
		t.Fatalf("disaggregated %d %s, unified %d %s", r.status, r.body, u.status, u.body)
	}
	if gd, gu := generationOf(t, r.body), generationOf(t, u.body); !reflect.DeepEqual(gd, gu) {
		t.Fatalf("disaggregated %+v\nunified %+v", gd, gu)
	}
}

// TestDisaggregatedPrefillFailover: a prefill engine that fails its leg
// (answers 503, drops the connection, or, under vLLM, sends nothing within
// first_byte_timeout) is excluded and the request prefills on the other;
// the answer equals the unified engine's. The idle fleet's first pick is
// p1 (ties go to the smallest id).
func TestDisaggregatedPrefillFailover(t *testing.T) {
	for _, kind := range []string{"vllm", "sglang"} {
		modes := []string{"503", "drop"}
		if kind == "vllm" {
			modes = append(modes, "stall")
		}
		for _, mode := range modes {
			t.Run(kind+"/"+mode, func(t *testing.T) {
				o := pdOpts{cfg: []clusterOpt{func(c *config.Config) { c.Gateway.FirstByteTimeout = config.D(time.Second) }}}
				f := pdFailoverFleet(t, kind, o, nil)
				f.byID["p1"].front.setMode(mode)
				path, body := pdBody("big-pd", kind == "sglang", true, 3)
				r := f.post(path, "", body)
				f.unifiedEquals(t, path, body, r)
				p1, p2 := f.byID["p1"].front.requests(), f.byID["p2"].front.requests()
				d := len(f.byID["d1"].front.requests()) + len(f.byID["d2"].front.requests())
				if len(p1) != 1 || len(p2) != 1 {
					t.Fatalf("prefill legs: p1 %d, p2 %d; want one each (p1 failed, p2 served)", len(p1), len(p2))
				}
				// Under SGLang the first pair's decode leg is canceled with
				// its prefill leg, maybe before it was sent.
				if want := map[string]int{"vllm": 1, "sglang": 2}[kind]; d != want && (kind == "vllm" || d != 1) {
					t.Fatalf("%d decode legs, want %d", d, want)
				}
			})
		}
	}
}

// TestDisaggregatedDecodeFailoverBeforeFirstByte: a decode engine that fails
// before its first byte is excluded and another tried. vLLM: a decode
// engine that did not take the request (refused connections, answered 503)
// is followed by another with the same kv_transfer_params while the
// prefill engine still holds the KV (one prefill leg); one that took it
// and broke (dropped the connection) is followed by a new prefill leg.
// SGLang: a new room on both.
func TestDisaggregatedDecodeFailoverBeforeFirstByte(t *testing.T) {
	for _, tc := range []struct {
		kind, mode string
		prefills   int
	}{{"vllm", "refuse", 1}, {"vllm", "503", 1}, {"vllm", "drop", 2}, {"sglang", "503", 2}, {"sglang", "drop", 2}} {
		t.Run(tc.kind+"/"+tc.mode, func(t *testing.T) {
			o := pdOpts{}
			if tc.mode == "refuse" {
				// d1 is probed at its own address (its refusals are the
				// gateway's to see) and seldom, so that the request meets
				// its closed port before the probes drop it.
				o.probe = "1s"
			}
			specs := []pdSpec{{id: "u", kind: tc.kind}, {id: "p1", kind: tc.kind, role: "prefill"},
				{id: "d1", kind: tc.kind, role: "decode", direct: tc.mode == "refuse"}, {id: "d2", kind: tc.kind, role: "decode"}}
			f := newPDFleet(t, o, specs...)
			if tc.mode == "refuse" {
				if err := f.byID["d1"].e.SetFaults(enginesim.Faults{Refuse: true}); err != nil {
					t.Fatal(err)
				}
			} else {
				f.byID["d1"].front.setMode(tc.mode)
			}
			for _, stream := range []bool{true, false} {
				path, body := pdBody("big-pd", true, stream, 9)
				before := len(f.byID["p1"].front.requests())
				r := f.post(path, "", body)
				f.unifiedEquals(t, path, body, r)
				pr := f.byID["p1"].front.requests()[before:]
				d2 := f.byID["d2"].front.requests()
				last := d2[len(d2)-1]
				switch tc.kind {
				case "vllm":
					if len(pr) != tc.prefills {
						t.Fatalf("stream=%v: %d prefill legs, want %d", stream, len(pr), tc.prefills)
					}
					kv, _ := last.body["kv_transfer_params"].(map[string]any)
					if kv["remote_engine_id"] != "p1" || kv["do_remote_prefill"] != true {
						t.Fatalf("d2's params %v", kv)
					}
				case "sglang":
					// A new room on both; the first pair's prefill leg is
					// canceled with its decode leg, maybe before it was sent.
					d1 := f.byID["d1"].front.requests()
					room := last.body["bootstrap_room"]
					got := slices.IndexFunc(pr, func(q frontRequest) bool { return q.body["bootstrap_room"] == room })
					if len(pr) < 1 || len(pr) > 2 || got < 0 || d1[len(d1)-1].body["bootstrap_room"] == room {
						t.Fatalf("stream=%v: rooms: prefill legs %v, d1 %v, d2 %v: want a new room on both", stream, pr, d1[len(d1)-1].body["bootstrap_room"], room)
					}
				}
			}
			if tc.prefills == 1 {
				eventually(t, 5*eventuallyUnit, func() bool { return f.byID["p1"].e.Stats().HeldHandles == 0 },
					"the prefill engine holds no KV: d2 read it with the same params")
			}
		})
	}
}

// TestDisaggregatedNoSpliceAfterFirstByte: a decode engine that dies after
// three tokens: the client gets them and one SSE error event, no [DONE];
// no other decode engine, and no second prefill, is asked.
func TestDisaggregatedNoSpliceAfterFirstByte(t *testing.T) {
	for _, kind := range []string{"vllm", "sglang"} {
		t.Run(kind, func(t *testing.T) {
			f := pdFailoverFleet(t, kind, pdOpts{}, map[string]enginesim.Config{"d1": {Faults: enginesim.Faults{Die: true, DieAfterTokens: 3}}})
			path, body := pdBody("big-pd", false, true, 1)
			r := f.post(path, "", body)
			if r.status != 200 || strings.Contains(string(r.body), "data: [DONE]") || !strings.Contains(string(r.body), "upstream_failed") {
				t.Fatalf("%d %s", r.status, r.body)
			}
			tokens := 0
			for _, p := range sseEvents(r.body) {
				if strings.Contains(p, `"text"`) {
					tokens++
				}
			}
			if tokens != 3 {
				t.Fatalf("%d tokens before the error event, want 3: %s", tokens, r.body)
			}
			if n := len(f.byID["d2"].front.requests()); n != 0 {
				t.Fatalf("d2 was asked %d times after d1 committed", n)
			}
			if n := len(f.byID["p1"].front.requests()) + len(f.byID["p2"].front.requests()); n != 1 {
				t.Fatalf("%d prefill legs, want 1", n)
			}
		})
	}
}

// TestDisaggregatedClientGoneCancelsBoth: a client that goes away cancels
// both engines' requests at once: under SGLang the prefill engine's (still
// prefilling) and the decode engine's (waiting in the room); under vLLM the
// prefill leg (the decode engine never asked) or the decode leg.
func TestDisaggregatedClientGoneCancelsBoth(t *testing.T) {
	cases := []struct {
		name, kind string
		cfg        map[string]enginesim.Config
		readFirst  bool // cancel after the first streamed line (decode under way)
		decodeLegs int
	}{
		{"sglang prefilling", "sglang", map[string]enginesim.Config{"p1": {Faults: enginesim.Faults{StallMS: 600000}}}, false, 1},
		{"vllm prefilling", "vllm", map[string]enginesim.Config{"p1": {Faults: enginesim.Faults{StallMS: 600000}}}, false, 0},
		{"vllm decoding", "vllm", map[string]enginesim.Config{"d1": {DecodePerToken: 50 * time.Millisecond}}, true, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			specs := []pdSpec{{id: "p1", kind: tc.kind, role: "prefill", cfg: tc.cfg["p1"]}, {id: "d1", kind: tc.kind, role: "decode", cfg: tc.cfg["d1"]}}
			f := newPDFleet(t, pdOpts{}, specs...)
			p, d := f.byID["p1"], f.byID["d1"]
			var read func(io.Reader)
			if tc.readFirst {
				read = func(r io.Reader) {
					line, _ := bufio.NewReader(r).ReadString('\n')
					if !strings.HasPrefix(line, "data: ") {
						t.Errorf("first line %q", line)
					}
				}
			}
			cancel, done := f.goneClient(true, "", read)
			defer cancel()
			if !tc.readFirst {
				// The decode leg waits for its KV in the engine, past reading
				// its body: a leg canceled before that never counts aborted.
				eventually(t, 10*eventuallyUnit, func() bool {
					return p.e.Stats().Requests >= 1 && d.e.Stats().WaitingForKV >= tc.decodeLegs
				}, "the legs reached the engines")
				cancel()
			}
			<-done
			// The engines see their requests end: canceled, never answered.
			eventually(t, 10*eventuallyUnit, func() bool {
				ps, ds := p.e.Stats(), d.e.Stats()
				prefillGone := tc.readFirst || ps.Aborted == 1
				decodeGone := tc.decodeLegs == 0 || ds.Aborted == 1
				return prefillGone && decodeGone && ps.Running == 0 && ps.Waiting == 0 && ds.Running == 0 && ds.Waiting == 0 && ds.WaitingForKV == 0 && ds.HeldHandles == 0
			}, "both engines' requests canceled")
			if ps, ds := p.e.Stats(), d.e.Stats(); ds.Completed != 0 || (!tc.readFirst && ps.Completed != 0) {
				t.Fatalf("completed: prefill engine %d, decode engine %d; want the requests canceled", ps.Completed, ds.Completed)
			}
			if n := len(d.front.requests()); n != tc.decodeLegs {
				t.Fatalf("%d decode legs, want %d", n, tc.decodeLegs)
			}
		})
	}
}

// goneClient sends a big-pd completion of 2,000 tokens (streamed or not,
// with X-Request-Id id when set) from a client that goes away when cancel
// is called, or, with read set, once read has read the answer's start.
// done closes when the client is gone.
func (f *pdFleet) goneClient(stream bool, id string, read func(io.Reader)) (cancel func(), done <-chan struct{}) {
	ctx, cancel := context.WithCancel(context.Background())
	_, body := pdBody("big-pd", false, stream, 1)
	body["max_tokens"] = 2000
	b, _ := json.Marshal(body)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, f.url+"/v1/completions", strings.NewReader(string(b)))
	if id != "" {
		req.Header.Set("X-Request-Id", id)
	}
	gone := make(chan struct{})
	go func() {
		defer close(gone)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return
		}
		defer resp.Body.Close()
		if read != nil {
			read(resp.Body)
			cancel()
		}
	}()
	return cancel, gone
}

// TestDisaggregatedPairsOnlyOneKind: in a fleet of vLLM, SGLang and
// heartbeating (tlgate's contract) prefill and decode engines, every pair
// is of one kind, and every answer is right: with every engine up, when the
// heartbeating decode engine drains (its prefill partner is left alone),
// and when the SGLang decode engine then fails the request (its prefill
// engine is not paired with another kind's decode engine). A prefill
// engine of one kind with a decode engine of another is no pair at all
// (503 no_capacity, saying so).
func TestDisaggregatedPairsOnlyOneKind(t *testing.T) {
	pl := &pairLog{}
	kinds := map[string]string{}
	var specs []pdSpec
	for _, k := range []string{"vllm", "sglang", "heartbeat"} {
		for _, role := range []string{"prefill", "decode"} {
			id := k + "-" + role
			kinds[id] = k
			specs = append(specs, pdSpec{id: id, kind: k, role: role})
		}
	}
	specs = append(specs, pdSpec{id: "u", kind: "vllm"})
	f := newPDFleet(t, pdOpts{deps: pl.hook}, specs...)
	seen := map[string]bool{}
	round := func(name string) {
		t.Helper()
		from := len(pl.snapshot())
		for i := range 6 {
			path, body := pdBody("big-pd", i%2 == 0, i%3 == 0, i)
			f.unifiedEquals(t, path, body, f.post(path, "", body))
		}
		for _, pair := range pl.snapshot()[from:] {
			pp, dd, _ := strings.Cut(pair, "/")
			if kinds[pp] != kinds[dd] {
				t.Fatalf("%s: pair %s of a %s prefill and a %s decode engine", name, pair, kinds[pp], kinds[dd])
			}
			seen[kinds[pp]] = true
		}
	}
	round("all up")
	f.engine("heartbeat-decode").SetDraining(true)
	eventually(t, 10*eventuallyUnit, func() bool {
		for _, w := range f.workers() {
			if w.ID == "heartbeat-decode" {
				return !w.Routable
			}
		}
		return false
	}, "the heartbeating decode engine drains")
	round("heartbeating decode engine draining")
	f.byID["sglang-decode"].front.setMode("503")
	round("SGLang decode engine failing")
	if len(seen) != 3 {
		t.Fatalf("pairs of kinds %v, want each kind's", seen)
	}

	g := newPDFleet(t, pdOpts{}, pdSpec{id: "p", kind: "vllm", role: "prefill"}, pdSpec{id: "d", kind: "sglang", role: "decode"})
	path, body := pdBody("big-pd", true, false, 1)
	r := g.post(path, "", body)
	if r.status != http.StatusServiceUnavailable || errorCode(t, r.body) != "no_capacity" || !strings.Contains(string(r.body), "protocol") {
		t.Fatalf("a vLLM prefill and an SGLang decode engine: %d %s", r.status, r.body)
	}
	if n := len(g.byID["p"].front.requests()) + len(g.byID["d"].front.requests()); n != 0 {
		t.Fatalf("%d legs sent to engines that do not pair", n)
	}
}

// TestDisaggregatedCacheAwarePrefill: under cache_aware the prefill engine
// is picked where the prompt's KV is cached: requests sharing a long system
// prompt all prefill on the engine that prefilled the first (reason cache),
// whose prefix cache then serves them, while their decode engines go by
// load.
func TestDisaggregatedCacheAwarePrefill(t *testing.T) {
	pl := &pairLog{}
	specs := []pdSpec{{id: "p1", kind: "vllm", role: "prefill"}, {id: "p2", kind: "vllm", role: "prefill"},
		{id: "d1", kind: "vllm", role: "decode", cfg: enginesim.Config{DecodePerToken: 20 * time.Millisecond}},
		{id: "d2", kind: "vllm", role: "decode", cfg: enginesim.Config{DecodePerToken: 20 * time.Millisecond}}}
	f := newPDFleet(t, pdOpts{deps: pl.hook}, specs...)
	system := strings.Repeat("The shared system prompt describes the gateway, its routes and its engines at length. ", 40)
	ask := func(i int) reply {
		return f.post("/v1/chat/completions", "", map[string]any{"model": "big-pd", "max_tokens": 8, "seed": i,
			"messages": []map[string]string{{"role": "system", "content": system}, {"role": "user", "content": fmt.Sprintf("Question %d?", i)}}})
	}
	if r := ask(0); r.status != 200 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	first := pl.reasons()[0]
	home := first.prefill
	hits := f.byID[home].e.Stats().PrefixHits
	// Four more at once: their decodes overlap.
	done := make(chan reply, 4)
	for i := 1; i <= 4; i++ {
		go func() { done <- ask(i) }()
	}
	for range 4 {
		if r := <-done; r.status != 200 {
			t.Fatalf("%d %s", r.status, r.body)
		}
	}
	decodes := map[string]bool{}
	for _, p := range pl.reasons()[1:] {
		if p.prefill != home || p.prefillReason != "cache" {
			t.Fatalf("prefill on %s (%s), want %s by cache: it holds the shared prompt", p.prefill, p.prefillReason, home)
		}
		if !strings.HasPrefix(p.decodeReason, "decode_") {
			t.Fatalf("decode reason %q", p.decodeReason)
		}
		decodes[p.decode] = true
	}
	if len(decodes) != 2 {
		t.Fatalf("overlapping decodes all on %v: the decode engine goes by load", decodes)
	}
	if got := f.byID[home].e.Stats().PrefixHits; got-hits < 4*400 {
		t.Fatalf("%s's prefix cache served %d tokens of the four requests, want most of their shared prompt", home, got-hits)
	}
}

// pairReason is one pick of a disaggregated pair, with its reasons.
type pairReason struct{ prefill, decode, prefillReason, decodeReason string }

func (p *pairLog) reasons() []pairReason {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]pairReason(nil), p.why...)
}

// TestDisaggregatedAccessLogAndUsage: a request a vLLM or an SGLang pair
// served is logged with its protocol, its prefill engine, the pairs tried
// and why each engine of the pair was chosen, and charged its tokens
// once: the access log's usage (what the key's tokens limit is settled
// with) equals the unified engine's for the same body and seed, streamed
// or not, so the prefill leg's own answer is never counted.
func TestDisaggregatedAccessLogAndUsage(t *testing.T) {
	for _, kind := range []string{"vllm", "sglang"} {
		t.Run(kind, func(t *testing.T) {
			var logs syncBuffer
			f := newPDFleet(t, pdOpts{gw: func(o *gateway.Options) { o.Logger = zerolog.New(&logs) }},
				pdSpec{id: "u", kind: kind}, pdSpec{id: "p", kind: kind, role: "prefill"}, pdSpec{id: "d", kind: kind, role: "decode"})
			for _, stream := range []bool{false, true} {
				path, ub := pdBody("big", false, stream, 11)
				_, db := pdBody("big-pd", false, stream, 11)
				id := fmt.Sprintf("%s-stream-%v", kind, stream)
				if r := f.post(path, "", ub, "X-Request-Id", "unified-"+id); r.status != 200 {
					t.Fatalf("unified: %d %s", r.status, r.body)
				}
				if r := f.post(path, "", db, "X-Request-Id", "pd-"+id); r.status != 200 {
					t.Fatalf("disaggregated: %d %s", r.status, r.body)
				}
				var u, d map[string]any
				eventually(t, 5*eventuallyUnit, func() bool {
					u, d = accessLine(logs.String(), "unified-"+id), accessLine(logs.String(), "pd-"+id)
					return u != nil && d != nil
				}, "the access log lines of %s", id)
				for _, k := range []string{"prompt_tokens", "completion_tokens"} {
					if d[k] != u[k] || u[k] == nil || u[k].(float64) <= 0 {
						t.Errorf("%s: %s %v disaggregated, %v unified: want the decode answer's usage alone", id, k, d[k], u[k])
					}
				}
				if d["protocol"] != kind || d["prefill"] != "p" || d["worker"] != "d" || d["pairs"] != 1.0 ||
					d["prefill_reason"] == nil || d["prefill_reason"] == "" || d["decode_reason"] == nil || d["decode_reason"] == "" {
					t.Errorf("%s: access log %v, want protocol %s, prefill p, worker d, one pair and both reasons", id, d, kind)
				}
			}
		})
	}
}

// accessLine returns the access-log line (JSON) of the request whose
// client request id is id (nil: none yet).
func accessLine(logs, id string) map[string]any {
	for _, l := range strings.Split(logs, "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil && m["client_request_id"] == id && m["outcome"] != nil {
			return m
		}
	}
	return nil
}

// TestCascadeStepOverEnginePairs: a cascade whose later step is a route
// served disaggregated by vLLM engines escalates to it: step 0's answer
// is judged and refused (no answer has a logprob above 0), and step 1's
// request is prefilled on the prefill engine over vLLM's protocol and
// answered by the decode engine.
func TestCascadeStepOverEnginePairs(t *testing.T) {
	var reps pdReports
	f := newPDFleet(t, pdOpts{deps: reps.hook, extra: `
[[gateway.routes]]
model = "auto"
cascade = [{ model = "big", accept_if = "min_logprob > 0" }, { model = "big-pd" }]
`}, pdSpec{id: "u", kind: "vllm"},
		pdSpec{id: "p", kind: "vllm", role: "prefill"}, pdSpec{id: "d", kind: "vllm", role: "decode"})
	r := f.post("/v1/completions", "", map[string]any{"model": "auto", "prompt": "Escalate this one.", "max_tokens": 6, "seed": 3})
	if r.status != 200 || r.header.Get("X-TL-Cascade-Step") != "1" || r.header.Get("X-TL-Route") != "d" {
		t.Fatalf("%d step %q route %q %s: want step 1 answered by the decode engine d", r.status, r.header.Get("X-TL-Cascade-Step"), r.header.Get("X-TL-Route"), r.body)
	}
	reps.wantProtocol(t, "vllm", 1)
	var prefilled bool
	for _, got := range f.byID["p"].front.requests() {
		if ktp, ok := got.body["kv_transfer_params"].(map[string]any); ok && ktp["do_remote_decode"] == true {
			prefilled = true
		}
	}
	if !prefilled {
		t.Fatal("the prefill engine was not asked over vLLM's protocol (kv_transfer_params with do_remote_decode)")
	}
}

// TestCascadeStepsOnOneVLLMPrefill: a cascade whose two steps are both
// served disaggregated by the same vLLM prefill engine prefills each step
// anew: the params step 0's decode leg took are not sent again (the engine
// freed their blocks once read), so step 1 is answered by the decode
// engine without a failure, and nobody is blamed.
func TestCascadeStepsOnOneVLLMPrefill(t *testing.T) {
	var reps pdReports
	f := newPDFleet(t, pdOpts{deps: reps.hook, extra: `
[[gateway.routes]]
model = "big-pd-2"
backends = [{ model = "big", weight = 1 }]
targets = ["disaggregated"]

[[gateway.routes]]
model = "auto"
cascade = [{ model = "big-pd", accept_if = "min_logprob > 0" }, { model = "big-pd-2" }]
`}, pdSpec{id: "p", kind: "vllm", role: "prefill"}, pdSpec{id: "d", kind: "vllm", role: "decode"})
	r := f.post("/v1/completions", "", map[string]any{"model": "auto", "prompt": "Escalate this one too.", "max_tokens": 6, "seed": 4})
	if r.status != 200 || r.header.Get("X-TL-Cascade-Step") != "1" || r.header.Get("X-TL-Cascade-Escalation") != "" {
		t.Fatalf("%d step %q escalation %q %s: want step 1's answer", r.status, r.header.Get("X-TL-Cascade-Step"), r.header.Get("X-TL-Cascade-Escalation"), r.body)
	}
	prefills := 0
	for _, got := range f.byID["p"].front.requests() {
		if ktp, ok := got.body["kv_transfer_params"].(map[string]any); ok && ktp["do_remote_decode"] == true {
			prefills++
		}
	}
	if prefills != 2 {
		t.Fatalf("the prefill engine was asked %d prefill legs, want one per step", prefills)
	}
	eventually(t, 5*eventuallyUnit, func() bool {
		reps.mu.Lock()
		defer reps.mu.Unlock()
		return len(reps.reps) == 1
	}, "the request's report")
	if rep := reps.reps[0]; rep.Protocol != "vllm" || rep.Pairs != 2 || len(rep.Failures) != 0 {
		t.Fatalf("report %+v: want two vLLM pairs (one a step) and no leg failure", rep)
	}
}

// TestCascadeLogNamesTheAnsweringWorker: a cascade whose disaggregated
// step 0 is refused and whose unified step 1 answers is logged with step
// 1's worker and no pair: the prefill engine, protocol and reasons of step
// 0's pair are not left on the line.
func TestCascadeLogNamesTheAnsweringWorker(t *testing.T) {
	var logs syncBuffer
	f := newPDFleet(t, pdOpts{gw: func(o *gateway.Options) { o.Logger = zerolog.New(&logs) }, extra: `
[[gateway.routes]]
model = "auto"
cascade = [{ model = "big-pd", accept_if = "min_logprob > 0" }, { model = "big" }]
`}, pdSpec{id: "u", kind: "vllm"}, pdSpec{id: "p", kind: "vllm", role: "prefill"}, pdSpec{id: "d", kind: "vllm", role: "decode"})
	r := f.post("/v1/completions", "", map[string]any{"model": "auto", "prompt": "Escalate to the unified one.", "max_tokens": 6, "seed": 5},
		"X-Request-Id", "cascade-to-unified")
	if r.status != 200 || r.header.Get("X-TL-Cascade-Step") != "1" || r.header.Get("X-TL-Route") != "u" {
		t.Fatalf("%d step %q route %q %s: want step 1 answered by u", r.status, r.header.Get("X-TL-Cascade-Step"), r.header.Get("X-TL-Route"), r.body)
	}
	var line map[string]any
	eventually(t, 5*eventuallyUnit, func() bool {
		line = accessLine(logs.String(), "cascade-to-unified")
		return line != nil
	}, "the access log line")
	for _, k := range []string{"prefill", "protocol", "prefill_reason", "decode_reason"} {
		if v, ok := line[k]; ok {
			t.Errorf("the access log line of a request u answered has %s %v (step 0's pair): %v", k, v, line)
		}
	}
	if line["worker"] != "u" {
		t.Errorf("access log worker %v, want u", line["worker"])
	}
}

// TestDisaggregatedClientGoneDuringPrefillCharged: a non-streamed request
// whose client goes away while its vLLM prefill leg runs is charged what
// that leg asked the engine for (the prompt and one token), not the
// client's max_tokens: no decode leg ever ran.
func TestDisaggregatedClientGoneDuringPrefillCharged(t *testing.T) {
	var logs syncBuffer
	f := newPDFleet(t, pdOpts{gw: func(o *gateway.Options) { o.Logger = zerolog.New(&logs) }},
		pdSpec{id: "p1", kind: "vllm", role: "prefill", cfg: enginesim.Config{Faults: enginesim.Faults{StallMS: 600000}}},
		pdSpec{id: "d1", kind: "vllm", role: "decode"})
	cancel, done := f.goneClient(false, "gone-while-prefilling", nil)
	defer cancel()
	eventually(t, 10*eventuallyUnit, func() bool { return f.byID["p1"].e.Stats().Requests >= 1 }, "the prefill leg to reach p1")
	cancel()
	<-done
	var line map[string]any
	eventually(t, 10*eventuallyUnit, func() bool {
		line = accessLine(logs.String(), "gone-while-prefilling")
		return line != nil
	}, "the access log line")
	if line["completion_tokens"] != 1.0 || line["usage_estimated"] != true || len(f.byID["d1"].front.requests()) != 0 {
		t.Fatalf("access log %v: want one estimated completion token charged (the prefill leg's), and no decode leg", line)
	}
}
