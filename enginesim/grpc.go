package enginesim

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"slices"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/tlgate/tlgate/enginesim/toymodel"
	"github.com/tlgate/tlgate/internal/wire/tracectx"
	enginev1 "github.com/tlgate/tlgate/protos/tl/engine/v1"
	kvv1 "github.com/tlgate/tlgate/protos/tl/kv/v1"
)

// controlServer is tl.engine.v1.EngineControl on a prefill engine.
type controlServer struct {
	enginev1.UnimplementedEngineControlServer
	e *Engine
}

// gate applies the faults and draining to a gRPC call: stall, then
// Unavailable when unavailable or draining.
func (e *Engine) gate(ctx context.Context) error {
	f := e.Faults()
	if f.StallMS > 0 {
		e.hook(func(h *hooks) chan struct{} { return h.stalled })
		if err := sleepCtx(ctx, time.Duration(f.StallMS)*time.Millisecond); err != nil {
			return status.FromContextError(err).Err()
		}
	}
	if f.Unavailable {
		return status.Error(codes.Unavailable, "engine unavailable (injected fault)")
	}
	if e.Draining() {
		return status.Error(codes.Unavailable, "engine is draining")
	}
	return nil
}

// Prefill runs prefill of the prompt, samples the first token from the
// seed's PCG32 stream, pushes the prompt's KV blocks to decode_target and
// returns the handle the decode engine holds them under.
func (s *controlServer) Prefill(ctx context.Context, req *enginev1.PrefillRequest) (*enginev1.PrefillResponse, error) {
	e := s.e
	if err := e.gate(ctx); err != nil {
		return nil, err
	}
	switch {
	case req.GetModel() != e.cfg.Model:
		return nil, status.Errorf(codes.NotFound, "model %q is not served here (%q)", req.GetModel(), e.cfg.Model)
	case req.GetKvFormat() != 0 && req.GetKvFormat() != e.cfg.KVFormat:
		return nil, status.Errorf(codes.FailedPrecondition, "kv_format %d, this engine has %d", req.GetKvFormat(), e.cfg.KVFormat)
	case len(req.GetPromptIds()) == 0:
		return nil, status.Error(codes.InvalidArgument, "prompt_ids is empty")
	case req.GetDecodeTarget() == "":
		return nil, status.Error(codes.InvalidArgument, "decode_target is empty")
	}
	for _, id := range req.GetPromptIds() {
		if int(id) >= e.tok.VocabSize() {
			return nil, status.Errorf(codes.InvalidArgument, "prompt id %d outside the vocabulary (%d)", id, e.tok.VocabSize())
		}
	}
	prompt := req.GetPromptIds()
	sp := req.GetSampling()
	cached, done, err := e.prefill(ctx, prompt)
	if err != nil {
		return nil, err
	}
	defer done()
	g := e.model.NewGenerator(prompt, sp.GetSeed(), toymodel.Params{
		Temperature:      float64(sp.GetTemperature()),
		TopP:             float64(sp.GetTopP()),
		TopK:             int(sp.GetTopK()),
		PresencePenalty:  float64(sp.GetPresencePenalty()),
		FrequencyPenalty: float64(sp.GetFrequencyPenalty()),
	})
	first := g.Sample()
	handleID, err := newHandleID()
	if err != nil {
		return nil, status.Errorf(codes.Internal, "handle id: %v", err)
	}
	header := &kvv1.KvHeader{
		HandleId:         handleID,
		RequestId:        req.GetRequestId(),
		Model:            e.cfg.Model,
		KvFormat:         e.cfg.KVFormat,
		PromptIds:        prompt,
		FirstToken:       first.Token,
		FirstLogprob:     float32(first.Logprob),
		Seed:             sp.GetSeed(),
		RngDrawsConsumed: g.Draws(),
		NumBlocks:        uint32(blockCount(len(prompt))),
	}
	if err := e.push(ctx, req.GetDecodeTarget(), header, e.hash.promptBlocks(prompt)); err != nil {
		e.log.Warn().Err(err).Str("decode_target", req.GetDecodeTarget()).Msg("KV push failed")
		return nil, err
	}
	e.core.count(func(c *counters) {
		c.prefills++
		c.promptTokens += uint64(len(prompt))
	})
	return &enginev1.PrefillResponse{
		HandleId:         handleID,
		NumTokens:        uint32(len(prompt)),
		NumBlocks:        header.NumBlocks,
		FirstToken:       first.Token,
		RngDrawsConsumed: g.Draws(),
		CachedTokens:     uint32(cached),
	}, nil
}

// prefill computes a prompt's KV (the flat mode's admission and sleep, or
// a prefill-only sequence on the step scheduler) and returns the prompt
// tokens found cached and the function that frees its blocks.
func (e *Engine) prefill(ctx context.Context, prompt []uint32) (cached int, done func(), err error) {
	if sched := e.core.sched; sched != nil {
		q := &stepSeq{tokens: slices.Clone(prompt), promptLen: len(prompt), maxTokens: 1, prefillOnly: true}
		if err := sched.submit(q, nil); err != nil {
			return 0, nil, admitStatus(err)
		}
		if err := sched.next(ctx, q); err != nil {
			sched.abort(q)
			return 0, nil, admitStatus(err)
		}
		blocks := sched.takeBlocks(q)
		return q.cached, func() { e.core.releaseBlocks(blocks) }, nil
	}
	full := e.hash.blocks(prompt, "", "")
	a := &admission{
		want:      blockSet{blocks: full, private: blockCount(len(prompt)) - len(full)},
		promptLen: len(prompt),
	}
	sq, err := e.core.admit(ctx, a)
	if err != nil {
		return 0, nil, admitStatus(err)
	}
	if err := sleepCtx(ctx, time.Duration(len(prompt)-sq.cached)*e.cfg.PrefillPerToken); err != nil {
		e.core.finish(sq)
		return 0, nil, status.FromContextError(err).Err()
	}
	return sq.cached, func() { e.core.finish(sq) }, nil
}

func admitStatus(err error) error {
	switch {
	case errors.Is(err, errTooLarge):
		return status.Error(codes.ResourceExhausted, err.Error())
	case errors.Is(err, errCoreClosed):
		return status.Error(codes.Unavailable, err.Error())
	}
	return status.FromContextError(err).Err()
}

func newHandleID() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return "kv-" + hex.EncodeToString(b[:]), nil
}

// push streams the header and blocks to the decode engine at target.
func (e *Engine) push(ctx context.Context, target string, header *kvv1.KvHeader, blocks [][]byte) error {
	conn, err := e.kvConn(target)
	if err != nil {
		return status.Errorf(codes.InvalidArgument, "decode_target %q: %v", target, err)
	}
	ctx, span := e.startSpan(ctx, "enginesim.kv_push", trace.SpanKindClient, attribute.String("tlgate.kv.target", target),
		attribute.String("tlgate.kv.handle", header.GetHandleId()), attribute.Int("tlgate.kv.blocks", len(blocks)))
	defer span.End()
	stream, err := kvv1.NewKvTransferServiceClient(conn).Push(tracectx.OutgoingGRPC(ctx))
	if err != nil {
		return pushStatus(target, err)
	}
	if err := stream.Send(&kvv1.KvChunk{Part: &kvv1.KvChunk_Header{Header: header}}); err != nil {
		return pushStatus(target, ioEOFToRecv(stream, err))
	}
	for i, data := range blocks {
		block := &kvv1.KvBlock{Index: uint32(i), Data: data, Checksum: blockChecksum(data)}
		if err := stream.Send(&kvv1.KvChunk{Part: &kvv1.KvChunk_Block{Block: block}}); err != nil {
			return pushStatus(target, ioEOFToRecv(stream, err))
		}
	}
	ack, err := stream.CloseAndRecv()
	if err != nil {
		return pushStatus(target, err)
	}
	if ack.GetHandleId() != header.GetHandleId() || ack.GetBlocksHeld() != header.GetNumBlocks() {
		return status.Errorf(codes.Internal, "push to %s: ack %q with %d blocks for %q with %d",
			target, ack.GetHandleId(), ack.GetBlocksHeld(), header.GetHandleId(), header.GetNumBlocks())
	}
	return nil
}

// ioEOFToRecv turns Send's io.EOF (the server ended the stream) into the
// server's status.
func ioEOFToRecv(stream grpc.ClientStreamingClient[kvv1.KvChunk, kvv1.PushAck], err error) error {
	if errors.Is(err, io.EOF) {
		if _, rerr := stream.CloseAndRecv(); rerr != nil {
			return rerr
		}
	}
	return err
}

// pushStatus keeps the decode engine's status code (so the gateway sees,
// e.g., ResourceExhausted) and names the target.
func pushStatus(target string, err error) error {
	st := status.Convert(err)
	return status.Errorf(st.Code(), "push KV to %s: %s", target, st.Message())
}

// kvConn returns a (cached) client connection to a decode engine.
func (e *Engine) kvConn(target string) (*grpc.ClientConn, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if c := e.kvConns[target]; c != nil {
		return c, nil
	}
	c, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	e.kvConns[target] = c
	return c, nil
}

// kvServer is tl.kv.v1.KvTransferService on a decode engine.
type kvServer struct {
	kvv1.UnimplementedKvTransferServiceServer
	e *Engine
}

// Push receives a prompt's KV blocks, verifies them and holds them under the
// header's handle.
func (s *kvServer) Push(stream grpc.ClientStreamingServer[kvv1.KvChunk, kvv1.PushAck]) error {
	e := s.e
	if err := e.gate(stream.Context()); err != nil {
		return err
	}
	if e.cfg.Role != RoleDecode {
		return status.Errorf(codes.FailedPrecondition, "push: only decode engines hold pushed KV; this one is %s", e.cfg.Role)
	}
	first, err := stream.Recv()
	if err != nil {
		return status.Errorf(codes.InvalidArgument, "push: reading the header: %v", err)
	}
	header := first.GetHeader()
	if header == nil {
		return status.Error(codes.InvalidArgument, "push: the first message must carry the header")
	}
	prompt := header.GetPromptIds()
	switch {
	case header.GetHandleId() == "":
		return status.Error(codes.InvalidArgument, "push: handle_id is empty")
	case header.GetModel() != e.cfg.Model:
		return status.Errorf(codes.FailedPrecondition, "push: model %q, this engine serves %q", header.GetModel(), e.cfg.Model)
	case header.GetKvFormat() != e.cfg.KVFormat:
		return status.Errorf(codes.FailedPrecondition, "push: kv_format %d, this engine has %d", header.GetKvFormat(), e.cfg.KVFormat)
	case len(prompt) == 0:
		return status.Error(codes.InvalidArgument, "push: prompt_ids is empty")
	case int(header.GetNumBlocks()) != blockCount(len(prompt)):
		return status.Errorf(codes.InvalidArgument, "push: num_blocks %d for %d prompt tokens, want %d",
			header.GetNumBlocks(), len(prompt), blockCount(len(prompt)))
	}
	want := e.hash.promptBlocks(prompt)
	for i := range want {
		chunk, err := stream.Recv()
		if err != nil {
			return status.Errorf(codes.InvalidArgument, "push: block %d of %d: %v", i, len(want), err)
		}
		b := chunk.GetBlock()
		switch {
		case b == nil:
			return status.Errorf(codes.InvalidArgument, "push: message %d is not a block", i+1)
		case int(b.GetIndex()) != i:
			return status.Errorf(codes.InvalidArgument, "push: block index %d, want %d", b.GetIndex(), i)
		case blockChecksum(b.GetData()) != b.GetChecksum():
			return status.Errorf(codes.DataLoss, "push: block %d checksum mismatch", i)
		case !slices.Equal(b.GetData(), want[i]):
			return status.Errorf(codes.DataLoss, "push: block %d does not hold the prompt's KV", i)
		}
	}
	if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
		return status.Error(codes.InvalidArgument, "push: more messages than num_blocks")
	}
	full := e.hash.blocks(prompt, "", "")
	h := &handle{
		id:     header.GetHandleId(),
		header: header,
		blocks: blockSet{blocks: full, private: len(want) - len(full)},
	}
	if err := e.core.hold(h); err != nil {
		switch {
		case errors.Is(err, errHandleExists):
			return status.Error(codes.AlreadyExists, err.Error())
		case errors.Is(err, errNoBlocks):
			return status.Error(codes.ResourceExhausted, err.Error())
		}
		return status.Error(codes.Unavailable, err.Error())
	}
	e.kvArrived(h.id)
	return stream.SendAndClose(&kvv1.PushAck{HandleId: h.id, BlocksHeld: uint32(h.blocks.size())})
}

// Release frees a held handle's blocks; idempotent.
func (s *kvServer) Release(_ context.Context, req *kvv1.ReleaseRequest) (*kvv1.ReleaseResponse, error) {
	released, freed := s.e.core.release(req.GetHandleId())
	return &kvv1.ReleaseResponse{Released: released, BlocksFreed: uint32(freed)}, nil
}
