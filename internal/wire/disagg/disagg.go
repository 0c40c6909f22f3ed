// Package disagg holds the wire of the disaggregation protocols the gateway
// drives over the engines' own HTTP surface: vLLM's KV connector proxy
// protocol (kv_transfer_params, as NixlConnector and vLLM's toy proxy
// server in tests/v1/kv_connector/nixl_integration use it) and SGLang's
// bootstrap rooms (bootstrap_host, bootstrap_port, bootstrap_room, as
// SGLang's router sets them). Every function rewrites a request body or
// reads an answer; none does I/O. tlgate's own contract (tl.engine.v1
// Prefill, X-TL-KV-Handle) is engineclient's.
//
// The rewrites splice values into the bytes they are given (every other
// byte as sent) and return a new slice; the input is never modified.
package disagg

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"
	"github.com/tlgate/tlgate/internal/wire/openai"
)

// Errors of the rewrites and reads.
var (
	// ErrNotObject: a body to rewrite is not a JSON object.
	ErrNotObject = errors.New("disagg: body is not a JSON object")
	// ErrNoKVTransferParams: a prefill engine's answer carries no
	// kv_transfer_params object though its one token did not end the
	// request (it finished "length", or answered no finish_reason): the
	// engine runs no KV connector that follows vLLM's proxy protocol, or
	// failed to hold the KV. A bad answer.
	ErrNoKVTransferParams = errors.New("disagg: the prefill answer carries no kv_transfer_params")
	// ErrPrefillStopped: a prefill engine's answer carries no
	// kv_transfer_params (null or absent) because its one token ended the
	// request (finish_reason "stop": the EOS token or one of
	// stop_token_ids). NixlConnector holds the KV only of a request that
	// finished length-capped and answers null params otherwise; vLLM's toy
	// proxy then sends the decode engine the request without
	// kv_transfer_params, and the decode engine prefills it itself. Not a
	// failure of the prefill engine.
	ErrPrefillStopped = errors.New("disagg: the prefill answer's one token ended the request; it holds no KV")
)

// remoteDecode is the kv_transfer_params of a prefill request, as vLLM's
// toy proxy sends them: the prefill engine is to keep the prompt's KV for a
// remote decode, and the remote_* fields are its to fill.
var remoteDecode = []byte(`{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`)

// VLLMPrefill returns the body of a vLLM prefill leg made from the body of
// the request: kv_transfer_params asking for a remote decode, stream false,
// max_tokens 1 (and max_completion_tokens 1 when the body has one), without
// stream_options, min_tokens and min_completion_tokens (a prefill engine
// computes one token whatever the request's minimum). Every other field is
// the request's.
func VLLMPrefill(body []byte) ([]byte, error) {
	return with(body, VLLMPrefillEdits()...)
}

// VLLMPrefillEdits are the edits VLLMPrefill makes to a request's body,
// for an attempt that builds its body with all its edits at once.
func VLLMPrefillEdits() []openai.Edit {
	return []openai.Edit{
		openai.Set("kv_transfer_params", remoteDecode), openai.Set("stream", falseJSON), openai.Set("max_tokens", one),
		{Key: "max_completion_tokens", Value: one, IfPresent: true},
		openai.Delete("stream_options"), openai.Delete("min_tokens"), openai.Delete("min_completion_tokens"),
	}
}

var (
	falseJSON = []byte("false")
	one       = []byte("1")
)

// with reads body as an object and returns it with edits applied.
func with(body []byte, edits ...openai.Edit) ([]byte, error) {
	if err := checkObject(body); err != nil {
		return nil, err
	}
	o, err := openai.ObjectOf(body)
	if err != nil {
		return nil, fmt.Errorf("disagg: %w", err)
	}
	return o.With(edits...), nil
}

// KVTransferParams returns the kv_transfer_params object of a prefill
// engine's answer, as raw JSON. An answer without one is ErrPrefillStopped
// when its params are null or absent and its (first) choice finished
// "stop", ErrNoKVTransferParams otherwise.
func KVTransferParams(answer []byte) ([]byte, error) {
	v := gjson.GetBytes(answer, "kv_transfer_params")
	if v.IsObject() {
		return []byte(v.Raw), nil
	}
	if (!v.Exists() || v.Type == gjson.Null) && gjson.GetBytes(answer, "choices.0.finish_reason").String() == "stop" {
		return nil, ErrPrefillStopped
	}
	return nil, ErrNoKVTransferParams
}

// RemoteEngine names the prefill engine a kv_transfer_params object points
// the decode engine at, for logs and traces: its remote_engine_id, else
// remote_host:remote_port.
func RemoteEngine(params []byte) string {
	if id := gjson.GetBytes(params, "remote_engine_id"); id.Type == gjson.String {
		return id.Str
	}
	h, p := gjson.GetBytes(params, "remote_host"), gjson.GetBytes(params, "remote_port")
	if h.Type == gjson.String && p.Exists() {
		return h.Str + ":" + p.Raw
	}
	return ""
}

// WithKVTransferParams returns the body of a vLLM decode leg: the request's
// body with kv_transfer_params set to the prefill answer's.
func WithKVTransferParams(body, params []byte) ([]byte, error) {
	return with(body, KVTransferEdit(params))
}

// KVTransferEdit is the edit WithKVTransferParams makes.
func KVTransferEdit(params []byte) openai.Edit { return openai.Set("kv_transfer_params", params) }

// MaxRoom bounds a bootstrap room: SGLang's router draws rooms in
// [0, 2^63), which every JSON reader takes as an integer exactly.
const MaxRoom = 1<<63 - 1

// NewRoom draws a bootstrap room uniformly in [0, MaxRoom] from the
// system's secure source: a room is shared by one request's prefill and
// decode engines only, and two requests in one room would swap KV.
func NewRoom() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return binary.LittleEndian.Uint64(b[:]) & MaxRoom
}

// WithBootstrap returns the body of an SGLang leg: the request's body with
// bootstrap_host, bootstrap_port and bootstrap_room set, the same for the
// prefill and the decode engine.
func WithBootstrap(body []byte, host string, port int, room uint64) ([]byte, error) {
	return with(body, BootstrapEdits(host, port, room)...)
}

// BootstrapEdits are the edits WithBootstrap makes.
func BootstrapEdits(host string, port int, room uint64) []openai.Edit {
	return []openai.Edit{openai.SetString("bootstrap_host", host), openai.SetInt("bootstrap_port", port), openai.SetUint("bootstrap_room", room)}
}

// SGLangPrefill returns the body of an SGLang prefill leg made from the
// decode leg's: the same request (its room included), answered whole
// (stream false, no stream_options). The prefill engine answers with the
// one token it sampled; only its prompt logprobs are of use
// (MergePromptLogprobs).
func SGLangPrefill(body []byte) ([]byte, error) {
	return with(body, SGLangPrefillEdits()...)
}

// SGLangPrefillEdits are the edits SGLangPrefill makes.
func SGLangPrefillEdits() []openai.Edit {
	return []openai.Edit{openai.Set("stream", falseJSON), openai.Delete("stream_options")}
}

// Room returns a body's bootstrap_room, and false when it has none.
func Room(body []byte) (uint64, bool) {
	v := gjson.GetBytes(body, "bootstrap_room")
	if v.Type != gjson.Number {
		return 0, false
	}
	n, err := strconv.ParseUint(v.Raw, 10, 64)
	return n, err == nil
}

func checkObject(body []byte) error {
	if b := bytes.TrimLeft(body, " \t\r\n"); len(b) == 0 || b[0] != '{' {
		return ErrNotObject
	}
	return nil
}

// WantsPromptLogprobs reports whether a request body asks for logprobs
// over its prompt, which only the prefill engine of a disaggregated pair
// computes: vLLM's prompt_logprobs (a number), or SGLang's return_logprob
// with a logprob_start_len inside the prompt.
func WantsPromptLogprobs(body []byte) bool {
	if v := gjson.GetBytes(body, "prompt_logprobs"); v.Type == gjson.Number {
		return true
	}
	if gjson.GetBytes(body, "return_logprob").Type != gjson.True {
		return false
	}
	start := gjson.GetBytes(body, "logprob_start_len")
	return start.Type == gjson.Number && start.Int() >= 0
}

// MergePromptLogprobs returns a decode engine's whole answer with the
// prefill engine's logprobs over the prompt merged in, as SGLang's router
// merges them: meta_info.input_token_logprobs is the prefill answer's
// followed by the decode answer's; prompt_logprobs (top level, as chat
// answers carry them, and per choice, as completions do) are the prefill
// answer's where the decode answer has none. It reports whether anything
// was merged; an answer it cannot read comes back as it was.
func MergePromptLogprobs(prefill, decode []byte) ([]byte, bool) {
	if !gjson.ValidBytes(prefill) || !gjson.ValidBytes(decode) {
		return decode, false
	}
	out, merged := decode, false
	set := func(path string, raw []byte) {
		if b, err := sjson.SetRawBytes(out, path, raw); err == nil {
			out, merged = b, true
		}
	}
	if p := gjson.GetBytes(prefill, "meta_info.input_token_logprobs"); p.IsArray() {
		d := gjson.GetBytes(out, "meta_info.input_token_logprobs")
		if d.IsArray() || (!d.Exists() && gjson.GetBytes(out, "meta_info").IsObject()) {
			set("meta_info.input_token_logprobs", concatArrays(p, d))
		}
	}
	if p := gjson.GetBytes(prefill, "prompt_logprobs"); p.IsArray() && absent(gjson.GetBytes(out, "prompt_logprobs")) {
		set("prompt_logprobs", []byte(p.Raw))
	}
	pc, dcs := gjson.GetBytes(prefill, "choices"), gjson.GetBytes(out, "choices")
	if !pc.IsArray() || !dcs.IsArray() {
		return out, merged // gjson's Array would take any other value as one choice
	}
	pcs := pc.Array()
	for i, dc := range dcs.Array() {
		if i >= len(pcs) {
			break
		}
		if p := pcs[i].Get("prompt_logprobs"); p.IsArray() && dc.IsObject() && absent(dc.Get("prompt_logprobs")) {
			set("choices."+strconv.Itoa(i)+".prompt_logprobs", []byte(p.Raw))
		}
	}
	return out, merged
}

// absent reports whether v holds no value: missing, null or empty.
func absent(v gjson.Result) bool {
	return !v.Exists() || v.Type == gjson.Null || (v.IsArray() && len(v.Array()) == 0)
}

// concatArrays is the JSON array of a's elements then b's (b may be
// missing).
func concatArrays(a, b gjson.Result) []byte {
	out := []byte{'['}
	n := 0
	for _, arr := range []gjson.Result{a, b} {
		arr.ForEach(func(_, v gjson.Result) bool {
			if n > 0 {
				out = append(out, ',')
			}
			out = append(out, v.Raw...)
			n++
			return true
		})
	}
	return append(out, ']')
}
