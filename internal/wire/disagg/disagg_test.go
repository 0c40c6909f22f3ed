package disagg

import (
	"encoding/json"
	"errors"
	"reflect"
	"testing"
)

func obj(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	return m
}

// TestVLLMPrefill checks the prefill leg's body field by field against
// vLLM's toy proxy: the remote-decode kv_transfer_params, stream false,
// max_tokens 1, max_completion_tokens 1 only when the request has one, no
// stream_options, min_tokens or min_completion_tokens, every other field
// as sent; the request's body untouched.
func TestVLLMPrefill(t *testing.T) {
	in := []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true},"max_completion_tokens":50,"max_tokens":60,"min_tokens":3,"min_completion_tokens":2,"seed":7,"temperature":0.5}`)
	orig := string(in)
	out, err := VLLMPrefill(in)
	if err != nil {
		t.Fatal(err)
	}
	if string(in) != orig {
		t.Fatal("the request's body was modified")
	}
	got := obj(t, out)
	want := map[string]any{
		"model": "m", "messages": []any{map[string]any{"role": "user", "content": "hi"}}, "stream": false,
		"max_completion_tokens": 1.0, "max_tokens": 1.0, "seed": 7.0, "temperature": 0.5,
		"kv_transfer_params": map[string]any{"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": nil,
			"remote_block_ids": nil, "remote_host": nil, "remote_port": nil},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("prefill body\n %v\nwant\n %v", got, want)
	}
	out, err = VLLMPrefill([]byte(`{"model":"m","prompt":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	if m := obj(t, out); m["max_completion_tokens"] != nil || m["max_tokens"] != 1.0 || m["stream"] != false {
		t.Fatalf("completions prefill body %v", m)
	}
	if _, err := VLLMPrefill([]byte(`[1]`)); !errors.Is(err, ErrNotObject) {
		t.Fatalf("an array: %v", err)
	}
}

// TestKVTransferParams: a prefill answer's kv_transfer_params object is
// read as sent; null params with a choice that finished "stop" (vLLM's
// answer when the one token ended the request) are ErrPrefillStopped, and
// every other answer without an object is ErrNoKVTransferParams.
func TestKVTransferParams(t *testing.T) {
	p, err := KVTransferParams([]byte(`{"id":"x","kv_transfer_params":{"do_remote_prefill":true,"remote_engine_id":"p1","remote_host":"10.0.0.1","remote_port":5600}}`))
	if err != nil {
		t.Fatal(err)
	}
	if RemoteEngine(p) != "p1" {
		t.Fatalf("remote engine %q", RemoteEngine(p))
	}
	if got := RemoteEngine([]byte(`{"remote_host":"h","remote_port":1}`)); got != "h:1" {
		t.Fatalf("remote engine %q", got)
	}
	for _, a := range []string{`{"id":"x"}`, `{"kv_transfer_params":null}`, `{"kv_transfer_params":[1]}`, `not json`,
		`{"choices":[{"finish_reason":"length"}],"kv_transfer_params":null}`,
		`{"choices":[{"finish_reason":"stop"}],"kv_transfer_params":[1]}`} {
		if _, err := KVTransferParams([]byte(a)); !errors.Is(err, ErrNoKVTransferParams) {
			t.Errorf("%s: %v", a, err)
		}
	}
	// vLLM's answer when the prefill's one token is EOS or a stop token:
	// NixlConnector held no KV, the decode engine prefills.
	for _, a := range []string{`{"choices":[{"index":0,"text":"","finish_reason":"stop","stop_reason":null}],"kv_transfer_params":null}`,
		`{"choices":[{"message":{"content":""},"finish_reason":"stop"}]}`} {
		if p, err := KVTransferParams([]byte(a)); p != nil || !errors.Is(err, ErrPrefillStopped) {
			t.Errorf("%s: %s %v, want ErrPrefillStopped", a, p, err)
		}
	}
	b, err := WithKVTransferParams([]byte(`{"model":"m","prompt":"x","kv_transfer_params":{"do_remote_decode":true}}`), p)
	if err != nil {
		t.Fatal(err)
	}
	if kv := obj(t, b)["kv_transfer_params"].(map[string]any); kv["remote_engine_id"] != "p1" || kv["do_remote_decode"] != nil {
		t.Fatalf("decode body %s", b)
	}
}

func TestBootstrap(t *testing.T) {
	seen := map[uint64]bool{}
	for range 1000 {
		r := NewRoom()
		if r > MaxRoom || seen[r] {
			t.Fatalf("room %d out of range or drawn twice", r)
		}
		seen[r] = true
	}
	room := uint64(MaxRoom)
	b, err := WithBootstrap([]byte(`{"model":"m","prompt":"x","stream":true,"stream_options":{"include_usage":true}}`), "10.0.0.1", 8998, room)
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := Room(b); !ok || got != room {
		t.Fatalf("room %d %v in %s", got, ok, b)
	}
	m := obj(t, b)
	if m["bootstrap_host"] != "10.0.0.1" || m["bootstrap_port"] != 8998.0 || m["stream"] != true {
		t.Fatalf("decode body %v", m)
	}
	p, err := SGLangPrefill(b)
	if err != nil {
		t.Fatal(err)
	}
	pm := obj(t, p)
	if pm["stream"] != false || pm["stream_options"] != nil || pm["bootstrap_room"] != m["bootstrap_room"] || pm["bootstrap_host"] != "10.0.0.1" {
		t.Fatalf("prefill body %v", pm)
	}
	if got, _ := Room(p); got != room {
		t.Fatalf("the prefill body's room %d, the decode body's %d", got, room)
	}
}

func TestMergePromptLogprobs(t *testing.T) {
	if !WantsPromptLogprobs([]byte(`{"prompt_logprobs":1}`)) || !WantsPromptLogprobs([]byte(`{"return_logprob":true,"logprob_start_len":0}`)) ||
		WantsPromptLogprobs([]byte(`{"logprobs":2}`)) || WantsPromptLogprobs([]byte(`{"return_logprob":true}`)) {
		t.Fatal("WantsPromptLogprobs")
	}
	cases := []struct{ name, prefill, decode, want string }{
		{"sglang meta_info", `{"meta_info":{"input_token_logprobs":[[-1,1],[-2,2]]}}`, `{"text":"a","meta_info":{"input_token_logprobs":[[-3,3]]}}`,
			`{"text":"a","meta_info":{"input_token_logprobs":[[-1,1],[-2,2],[-3,3]]}}`},
		{"chat prompt_logprobs", `{"prompt_logprobs":[null,{"5":{"logprob":-1}}]}`, `{"choices":[{"message":{"content":"a"}}],"prompt_logprobs":null}`,
			`{"choices":[{"message":{"content":"a"}}],"prompt_logprobs":[null,{"5":{"logprob":-1}}]}`},
		{"completions prompt_logprobs", `{"choices":[{"prompt_logprobs":[null,{"5":{"logprob":-1}}]}]}`, `{"choices":[{"text":"a"}]}`,
			`{"choices":[{"text":"a","prompt_logprobs":[null,{"5":{"logprob":-1}}]}]}`},
		{"the decode answer's own kept", `{"prompt_logprobs":[null,{"1":{}}]}`, `{"prompt_logprobs":[null,{"2":{}}]}`, `{"prompt_logprobs":[null,{"2":{}}]}`},
		{"nothing to merge", `{"choices":[{"text":"t"}]}`, `{"choices":[{"text":"a"}]}`, `{"choices":[{"text":"a"}]}`},
		{"unreadable", `{`, `{"a":1}`, `{"a":1}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, _ := MergePromptLogprobs([]byte(tc.prefill), []byte(tc.decode))
			if !reflect.DeepEqual(obj(t, got), obj(t, []byte(tc.want))) {
				t.Fatalf("merged %s, want %s", got, tc.want)
			}
		})
	}
}
