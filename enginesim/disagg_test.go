package enginesim

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/tlgate/tlgate/enginesim/tokenizer"
	enginev1 "github.com/tlgate/tlgate/protos/tl/engine/v1"
	kvv1 "github.com/tlgate/tlgate/protos/tl/kv/v1"
)

func dial(t testing.TB, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// samplingOf fills every SamplingParams field from an OpenAI body, with
// engine.proto's defaults for the omitted ones, as the gateway does.
func samplingOf(body map[string]any, chat bool) *enginev1.SamplingParams {
	num := func(k string, def float64) float64 {
		switch v := body[k].(type) {
		case float64:
			return v
		case int:
			return float64(v)
		}
		return def
	}
	sp := &enginev1.SamplingParams{
		Temperature:      float32(num("temperature", 1)),
		TopP:             float32(num("top_p", 1)),
		TopK:             uint32(num("top_k", 0)),
		PresencePenalty:  float32(num("presence_penalty", 0)),
		FrequencyPenalty: float32(num("frequency_penalty", 0)),
	}
	if chat {
		sp.MaxTokens = uint32(num("max_tokens", defaultMaxTokensChat))
	} else {
		sp.MaxTokens = uint32(num("max_tokens", defaultMaxTokensCompletion))
	}
	switch s := body["seed"].(type) {
	case int:
		sp.Seed = uint64(s)
	case uint64:
		sp.Seed = s
	}
	return sp
}

// unsurePrompt returns a prompt the engine's model is unsure about, both as a
// completion and as a chat, so sampling has real choices to make.
func unsurePrompt(t testing.TB, e *Engine) string {
	t.Helper()
	for i := range 1000 {
		p := fmt.Sprintf("The history of the town by the river, part %d", i)
		chat, err := chatPrompt(e.tok, []chatMessageIn{
			{Role: "system", Content: []byte(`"You are a helpful assistant."`)},
			{Role: "user", Content: []byte(fmt.Sprintf("%q", p))},
		}, tokenizer.ChatOptions{AddGenerationPrompt: true})
		if err != nil {
			t.Fatal(err)
		}
		if e.model.Certainty(e.tok.Encode(p)) < 0.3 && e.model.Certainty(chat) < 0.3 {
			return p
		}
	}
	t.Fatal("no unsure prompt found")
	return ""
}

type pd struct {
	p, d    *Engine
	control enginev1.EngineControlClient
	kv      kvv1.KvTransferServiceClient
	client  *http.Client
}

func startPD(t testing.TB, p, d Config) *pd {
	p.Role, d.Role = RolePrefill, RoleDecode
	x := &pd{p: startEngine(t, p), d: startEngine(t, d), client: newClient(t)}
	x.control = enginev1.NewEngineControlClient(dial(t, x.p.GRPCAddr()))
	x.kv = kvv1.NewKvTransferServiceClient(dial(t, x.d.KVAddr()))
	return x
}

// tokenize asks P for the prompt's token ids, as the gateway does.
func (x *pd) tokenize(t testing.TB, chat bool, body map[string]any) []uint32 {
	t.Helper()
	req := map[string]any{"prompt": body["prompt"]}
	if chat {
		req = map[string]any{"messages": body["messages"]}
	}
	r := post(t, x.client, x.p.URL()+"/v1/tokenize", req)
	if r.status != http.StatusOK {
		t.Fatalf("tokenize: %d %s", r.status, r.body)
	}
	return decode[struct {
		Tokens []uint32 `json:"tokens"`
	}](t, r.body).Tokens
}

func (x *pd) prefill(t testing.TB, chat bool, body map[string]any) *enginev1.PrefillResponse {
	t.Helper()
	resp, err := x.control.Prefill(context.Background(), &enginev1.PrefillRequest{
		RequestId:    "r-1",
		Model:        x.p.Model(),
		PromptIds:    x.tokenize(t, chat, body),
		Sampling:     samplingOf(body, chat),
		DecodeTarget: x.d.KVAddr(),
		KvFormat:     x.p.Status().KvFormat,
	})
	if err != nil {
		t.Fatalf("Prefill: %v", err)
	}
	return resp
}

func TestEngineDisaggregatedEqualsUnified(t *testing.T) {
	u := startEngine(t, Config{Model: "m"})
	x := startPD(t, Config{Model: "m"}, Config{Model: "m"})
	tok := tokenizer.Default()
	prompt := unsurePrompt(t, u)
	n := 0
	for _, chat := range []bool{false, true} {
		for _, seed := range []any{1, 42, uint64(1<<63 + 5)} {
			for _, temp := range []float64{0, 0.7, 1} {
				for _, stream := range []bool{false, true} {
					name := fmt.Sprintf("chat=%v/seed=%v/temperature=%v/stream=%v", chat, seed, temp, stream)
					t.Run(name, func(t *testing.T) {
						extra := map[string]any{"seed": seed, "temperature": temp, "max_tokens": 24,
							"logprobs": 2, "stream": stream, "stream_options": map[string]any{"include_usage": true}}
						if temp == 0.7 {
							extra["top_p"], extra["top_k"], extra["frequency_penalty"] = 0.9, 8, 0.4
						}
						body := completionBody("m", prompt, extra)
						if chat {
							extra["logprobs"], extra["top_logprobs"] = true, 2
							body = chatBody("m", prompt, extra)
						}
						want := complete(t, x.client, u.URL(), chat, body)
						resp := x.prefill(t, chat, body)
						got := complete(t, x.client, x.d.URL(), chat, body, HeaderKVHandle, resp.HandleId)
						if !reflect.DeepEqual(got, want) {
							t.Fatalf("disaggregated differs from unified:\nunified        %+v\ndisaggregated  %+v", want, got)
						}
						first, _ := tok.ID(want.Tokens[0])
						ids := x.tokenize(t, chat, body)
						if resp.FirstToken != first || resp.NumTokens != uint32(len(ids)) ||
							resp.NumBlocks != uint32(blockCount(len(ids))) || resp.RngDrawsConsumed != 1 || resp.HandleId == "" {
							t.Fatalf("PrefillResponse %v (first token %d, %d prompt tokens)", resp, first, len(ids))
						}
						if s := x.d.Stats(); s.HeldHandles != 0 || s.HeldBlocks != 0 || s.FreeBlocks != s.TotalBlocks || s.Running != 0 {
							t.Fatalf("decode engine after the request: %+v", s)
						}
						n++
					})
				}
			}
		}
	}
	p := x.p.Stats()
	if p.Prefills != uint64(n) || p.Running != 0 || p.FreeBlocks != p.TotalBlocks || p.PrefixHits == 0 {
		t.Fatalf("prefill engine after %d prefills: %+v", n, p)
	}
	if d := x.d.Stats(); d.Pushes != uint64(n) || d.Completed != uint64(n) {
		t.Fatalf("decode engine after %d requests: %+v", n, d)
	}
	// A decode engine serves plain requests too.
	body := completionBody("m", prompt, map[string]any{"seed": 3, "max_tokens": 10})
	if a, b := complete(t, x.client, u.URL(), false, body), complete(t, x.client, x.d.URL(), false, body); !reflect.DeepEqual(a, b) {
		t.Fatalf("plain request on decode engine: %+v vs %+v", b, a)
	}
}

func TestPrefillReportsCachedTokens(t *testing.T) {
	x := startPD(t, Config{Model: "m"}, Config{Model: "m"})
	body := completionBody("m", "A prompt long enough to fill more than one block of sixteen tokens, surely.", map[string]any{"seed": 1})
	if first := x.prefill(t, false, body); first.CachedTokens != 0 {
		t.Fatalf("cold prefill: %d cached tokens", first.CachedTokens)
	}
	second := x.prefill(t, false, body)
	if second.CachedTokens == 0 || second.CachedTokens%BlockTokens != 0 || second.CachedTokens >= second.NumTokens {
		t.Fatalf("warm prefill: %d cached of %d", second.CachedTokens, second.NumTokens)
	}
	for _, h := range []string{second.HandleId} {
		if _, err := x.kv.Release(context.Background(), &kvv1.ReleaseRequest{HandleId: h}); err != nil {
			t.Fatal(err)
		}
	}
}

func TestReleaseFreesBlocksIdempotent(t *testing.T) {
	x := startPD(t, Config{Model: "m"}, Config{Model: "m", KVBlocks: 32})
	ctx := context.Background()
	body := completionBody("m", "Release me: a prompt of a few dozen tokens, which takes up more than two blocks of KV in all.", map[string]any{"seed": 1})
	resp := x.prefill(t, false, body)
	s := x.d.Stats()
	if s.HeldHandles != 1 || s.HeldBlocks != int(resp.NumBlocks) || s.FreeBlocks != 32-int(resp.NumBlocks) || resp.NumBlocks < 2 {
		t.Fatalf("after push (%d blocks): %+v", resp.NumBlocks, s)
	}
	rel, err := x.kv.Release(ctx, &kvv1.ReleaseRequest{HandleId: resp.HandleId})
	if err != nil || !rel.Released || rel.BlocksFreed != resp.NumBlocks {
		t.Fatalf("Release: %v, %v", rel, err)
	}
	if s := x.d.Stats(); s.HeldHandles != 0 || s.HeldBlocks != 0 || s.FreeBlocks != 32 {
		t.Fatalf("after release: %+v", s)
	}
	for _, id := range []string{resp.HandleId, "never-pushed"} {
		rel, err := x.kv.Release(ctx, &kvv1.ReleaseRequest{HandleId: id})
		if err != nil || rel.Released || rel.BlocksFreed != 0 {
			t.Fatalf("Release(%q) again: %v, %v", id, rel, err)
		}
	}
	// A released handle cannot be resumed: 503, so the gateway retries.
	r := post(t, x.client, x.d.URL()+"/v1/completions", body, HeaderKVHandle, resp.HandleId)
	if r.status != http.StatusServiceUnavailable || decode[errorJSON](t, r.body).Error.Code != "kv_handle_not_found" {
		t.Fatalf("resume released handle: %d %s", r.status, r.body)
	}
	// A used handle is not released either.
	resp = x.prefill(t, false, body)
	complete(t, x.client, x.d.URL(), false, body, HeaderKVHandle, resp.HandleId)
	if rel, err := x.kv.Release(ctx, &kvv1.ReleaseRequest{HandleId: resp.HandleId}); err != nil || rel.Released {
		t.Fatalf("Release(used): %v, %v", rel, err)
	}
	if s := x.d.Stats(); s.Releases != 4 || s.HandlesReleased != 1 || s.FreeBlocks != 32 {
		t.Fatalf("final: %+v", s)
	}
}

func TestKVHandleMismatch(t *testing.T) {
	x := startPD(t, Config{Model: "m"}, Config{Model: "m"})
	body := completionBody("m", "the pushed prompt", map[string]any{"seed": 1})
	tests := []struct {
		name string
		body map[string]any
	}{
		{"other prompt", completionBody("m", "another prompt", map[string]any{"seed": 1})},
		{"other seed", completionBody("m", "the pushed prompt", map[string]any{"seed": 2})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := x.prefill(t, false, body)
			r := post(t, x.client, x.d.URL()+"/v1/completions", tt.body, HeaderKVHandle, resp.HandleId)
			if r.status != http.StatusBadRequest || decode[errorJSON](t, r.body).Error.Code != "kv_handle_mismatch" {
				t.Fatalf("%d %s", r.status, r.body)
			}
			if s := x.d.Stats(); s.HeldHandles != 0 || s.FreeBlocks != s.TotalBlocks {
				t.Fatalf("after mismatch: %+v", s)
			}
		})
	}
	// A body without a seed is refused and counted: a real engine would
	// sample it with a seed of its own.
	resp := x.prefill(t, false, body)
	noSeed := completionBody("m", "the pushed prompt", nil)
	r := post(t, x.client, x.d.URL()+"/v1/completions", noSeed, HeaderKVHandle, resp.HandleId)
	if r.status != http.StatusBadRequest || decode[errorJSON](t, r.body).Error.Code != "kv_handle_mismatch" || !strings.Contains(string(r.body), "seed") {
		t.Fatalf("seedless resume: %d %s, want 400 kv_handle_mismatch naming the seed", r.status, r.body)
	}
	if s := x.d.Stats(); s.ResumesUnseeded != 1 || s.HeldHandles != 0 {
		t.Fatalf("after a seedless resume: %+v", s)
	}
}

// pushRaw pushes a hand-made stream to a decode engine.
func pushRaw(kv kvv1.KvTransferServiceClient, chunks ...*kvv1.KvChunk) error {
	stream, err := kv.Push(context.Background())
	if err != nil {
		return err
	}
	for _, c := range chunks {
		if err := stream.Send(c); err != nil {
			break // the server ended the stream; CloseAndRecv has its status
		}
	}
	_, err = stream.CloseAndRecv()
	return err
}

func headerChunk(h *kvv1.KvHeader) *kvv1.KvChunk {
	return &kvv1.KvChunk{Part: &kvv1.KvChunk_Header{Header: h}}
}
func blockChunk(i int, data []byte, sum uint64) *kvv1.KvChunk {
	return &kvv1.KvChunk{Part: &kvv1.KvChunk_Block{Block: &kvv1.KvBlock{Index: uint32(i), Data: data, Checksum: sum}}}
}

func TestPushValidation(t *testing.T) {
	x := startPD(t, Config{Model: "m"}, Config{Model: "m", KVBlocks: 2})
	prompt := tokenizer.Default().Encode("a prompt of some twenty tokens or so, enough for two blocks of KV")
	if len(prompt) <= BlockTokens || len(prompt) > 2*BlockTokens {
		t.Fatalf("prompt of %d tokens", len(prompt))
	}
	blocks := x.d.hash.promptBlocks(prompt)
	header := func(id string, mod func(*kvv1.KvHeader)) *kvv1.KvChunk {
		h := &kvv1.KvHeader{HandleId: id, Model: "m", KvFormat: DefaultKVFormat, PromptIds: prompt,
			Seed: 1, RngDrawsConsumed: 1, NumBlocks: uint32(len(blocks))}
		if mod != nil {
			mod(h)
		}
		return headerChunk(h)
	}
	good := func(id string) []*kvv1.KvChunk {
		return []*kvv1.KvChunk{header(id, nil), blockChunk(0, blocks[0], blockChecksum(blocks[0])), blockChunk(1, blocks[1], blockChecksum(blocks[1]))}
	}
	long := append(append([]uint32{}, prompt...), prompt...)
	tests := []struct {
		name   string
		chunks []*kvv1.KvChunk
		code   codes.Code
	}{
		{"block first", []*kvv1.KvChunk{blockChunk(0, blocks[0], 0)}, codes.InvalidArgument},
		{"no handle id", good("")[:1], codes.InvalidArgument},
		{"wrong model", []*kvv1.KvChunk{header("h", func(h *kvv1.KvHeader) { h.Model = "x" })}, codes.FailedPrecondition},
		{"wrong kv_format", []*kvv1.KvChunk{header("h", func(h *kvv1.KvHeader) { h.KvFormat = 9 })}, codes.FailedPrecondition},
		{"wrong num_blocks", []*kvv1.KvChunk{header("h", func(h *kvv1.KvHeader) { h.NumBlocks = 5 })}, codes.InvalidArgument},
		{"bad checksum", []*kvv1.KvChunk{header("h", nil), blockChunk(0, blocks[0], 1)}, codes.DataLoss},
		{"other prompt's data", []*kvv1.KvChunk{header("h", nil), blockChunk(0, blocks[1], blockChecksum(blocks[1]))}, codes.DataLoss},
		{"out of order", []*kvv1.KvChunk{header("h", nil), blockChunk(1, blocks[1], blockChecksum(blocks[1]))}, codes.InvalidArgument},
		{"missing block", good("h")[:2], codes.InvalidArgument},
		{"extra block", append(good("h"), blockChunk(2, blocks[1], blockChecksum(blocks[1]))), codes.InvalidArgument},
		{"more blocks than the engine has", func() []*kvv1.KvChunk {
			lb := x.d.hash.promptBlocks(long)
			cs := []*kvv1.KvChunk{header("big", func(h *kvv1.KvHeader) { h.PromptIds, h.NumBlocks = long, uint32(len(lb)) })}
			for i, b := range lb {
				cs = append(cs, blockChunk(i, b, blockChecksum(b)))
			}
			return cs
		}(), codes.ResourceExhausted},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := pushRaw(x.kv, tt.chunks...); status.Code(err) != tt.code {
				t.Fatalf("push: %v, want %v", err, tt.code)
			}
			if s := x.d.Stats(); s.HeldHandles != 0 || s.FreeBlocks != 2 {
				t.Fatalf("after a rejected push: %+v", s)
			}
		})
	}
	if err := pushRaw(x.kv, good("dup")...); err != nil {
		t.Fatalf("good push: %v", err)
	}
	if err := pushRaw(x.kv, good("dup")...); status.Code(err) != codes.AlreadyExists {
		t.Fatalf("duplicate push: %v", err)
	}
	if s := x.d.Stats(); s.HeldHandles != 1 || s.HeldBlocks != 2 || s.FreeBlocks != 0 {
		t.Fatalf("after the good push: %+v", s)
	}
}

func TestPrefillErrors(t *testing.T) {
	x := startPD(t, Config{Model: "m"}, Config{Model: "m", KVFormat: 2})
	ids := tokenizer.Default().Encode("hello there")
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := lis.Addr().String()
	lis.Close()
	tests := []struct {
		name string
		req  *enginev1.PrefillRequest
		code codes.Code
	}{
		{"unknown model", &enginev1.PrefillRequest{Model: "x", PromptIds: ids, DecodeTarget: x.d.KVAddr()}, codes.NotFound},
		{"empty prompt", &enginev1.PrefillRequest{Model: "m", DecodeTarget: x.d.KVAddr()}, codes.InvalidArgument},
		{"no decode target", &enginev1.PrefillRequest{Model: "m", PromptIds: ids}, codes.InvalidArgument},
		{"kv_format mismatch with prefill", &enginev1.PrefillRequest{Model: "m", PromptIds: ids, DecodeTarget: x.d.KVAddr(), KvFormat: 7}, codes.FailedPrecondition},
		{"kv_format mismatch with decode", &enginev1.PrefillRequest{Model: "m", PromptIds: ids, DecodeTarget: x.d.KVAddr()}, codes.FailedPrecondition},
		{"decode target down", &enginev1.PrefillRequest{Model: "m", PromptIds: ids, DecodeTarget: closed}, codes.Unavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := x.control.Prefill(context.Background(), tt.req)
			if status.Code(err) != tt.code {
				t.Fatalf("Prefill: %v, want %v", err, tt.code)
			}
			if s := x.p.Stats(); s.Running != 0 || s.FreeBlocks != s.TotalBlocks || s.Prefills != 0 {
				t.Fatalf("prefill engine after failure: %+v", s)
			}
		})
	}
}

func TestHoldTimeoutFreesBlocks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCore(8, 4, time.Minute)
		held := func() (int, int, int) {
			c.mu.Lock()
			defer c.mu.Unlock()
			return len(c.handles), c.heldBlocks, c.pool.total - c.pool.referenced()
		}
		h := &handle{id: "h", header: &kvv1.KvHeader{}, blocks: blockSet{blocks: keyed(1, 2), private: 1}}
		if err := c.hold(h); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Minute - time.Nanosecond)
		synctest.Wait()
		if n, b, free := held(); n != 1 || b != 3 || free != 5 {
			t.Fatalf("just before the timeout: %d handles, %d blocks held, %d free", n, b, free)
		}
		time.Sleep(time.Nanosecond)
		synctest.Wait()
		if n, b, free := held(); n != 0 || b != 0 || free != 8 || c.counters.handlesExpired != 1 {
			t.Fatalf("at the timeout: %d handles, %d blocks held, %d free, %d expired", n, b, free, c.counters.handlesExpired)
		}
		if ok, _ := c.release("h"); ok {
			t.Fatal("released an expired handle")
		}

		// A taken handle does not expire: its request owns the blocks.
		h2 := &handle{id: "h2", header: &kvv1.KvHeader{}, blocks: blockSet{private: 2}}
		if err := c.hold(h2); err != nil {
			t.Fatal(err)
		}
		if c.take("h2") != h2 {
			t.Fatal("take failed")
		}
		time.Sleep(2 * time.Minute)
		synctest.Wait()
		if _, b, free := held(); b != 2 || free != 6 || c.counters.handlesExpired != 1 {
			t.Fatalf("taken handle after 2 minutes: %d held, %d free", b, free)
		}
		c.drop(h2)
		if _, b, free := held(); b != 0 || free != 8 {
			t.Fatalf("after drop: %d held, %d free", b, free)
		}
	})
}

func TestEngineHoldTimeout(t *testing.T) {
	h := &hooks{expired: make(chan struct{}, 1)}
	x := startPD(t, Config{Model: "m"}, Config{Model: "m", HoldTimeout: 20 * time.Millisecond, hooks: h})
	body := completionBody("m", "nobody resumes this", map[string]any{"seed": 1})
	resp := x.prefill(t, false, body)
	<-h.expired
	if s := x.d.Stats(); s.HeldHandles != 0 || s.FreeBlocks != s.TotalBlocks || s.HandlesExpired != 1 {
		t.Fatalf("after the hold timeout: %+v", s)
	}
	r := post(t, x.client, x.d.URL()+"/v1/completions", body, HeaderKVHandle, resp.HandleId)
	if r.status != http.StatusServiceUnavailable {
		t.Fatalf("resume expired handle: %d %s", r.status, r.body)
	}
}

func TestCloseFreesHeldHandles(t *testing.T) {
	x := startPD(t, Config{Model: "m"}, Config{Model: "m"})
	x.prefill(t, false, completionBody("m", "held at close", map[string]any{"seed": 1}))
	if err := x.d.Close(); err != nil {
		t.Fatal(err)
	}
	if s := x.d.Stats(); s.HeldHandles != 0 || s.FreeBlocks != s.TotalBlocks {
		t.Fatalf("after Close: %+v", s)
	}
	if err := x.d.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	var st interface{ GRPCStatus() *status.Status }
	_, err := x.kv.Release(context.Background(), &kvv1.ReleaseRequest{HandleId: "x"})
	if !errors.As(err, &st) || st.GRPCStatus().Code() != codes.Unavailable {
		t.Fatalf("Release on a closed engine: %v", err)
	}
}
