package enginesim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	kvv1 "github.com/tlgate/tlgate/protos/tl/kv/v1"
)

// kvTransferParams is vLLM's kv_transfer_params as NixlConnector and
// vLLM's toy proxy (examples/online_serving/disaggregated_serving) use
// them: the proxy asks the prefill engine with do_remote_decode, whose
// answer names itself (do_remote_prefill and the remote_* fields), and
// hands that to the decode engine.
type kvTransferParams struct {
	DoRemoteDecode  bool            `json:"do_remote_decode"`
	DoRemotePrefill bool            `json:"do_remote_prefill"`
	RemoteEngineID  *string         `json:"remote_engine_id"`
	RemoteBlockIDs  json.RawMessage `json:"remote_block_ids"`
	RemoteRequestID *string         `json:"remote_request_id"`
	RemoteHost      *string         `json:"remote_host"`
	RemotePort      *int            `json:"remote_port"`
	TPSize          *int            `json:"tp_size,omitempty"`
}

// nixlHandlePrefix marks the handles of remote decodes on a prefill
// engine and of pulled KV on a decode engine.
const nixlHandlePrefix = "nixl-"

// errKVTransfer is wrapped by the failures to fetch KV from a prefill
// engine (it cannot be reached, holds nothing, or sends wrong blocks).
var errKVTransfer = errors.New("KV transfer failed")

// blockIDs reads remote_block_ids: a list of ids, or a list of them per
// KV cache group (newer vLLM); one group is all a reference engine has.
func (p *kvTransferParams) blockIDs() ([]uint64, error) {
	if isNull(p.RemoteBlockIDs) {
		return nil, nil
	}
	var flat []uint64
	if err := json.Unmarshal(p.RemoteBlockIDs, &flat); err == nil {
		return flat, nil
	}
	var groups [][]uint64
	if err := json.Unmarshal(p.RemoteBlockIDs, &groups); err != nil || len(groups) > 1 {
		return nil, fmt.Errorf("%w: kv_transfer_params.remote_block_ids must be a list of block ids (or one list per group, one group)", errBadRequest)
	}
	if len(groups) == 0 {
		return nil, nil
	}
	return groups[0], nil
}

// checkDisagg validates the disaggregation fields of a request for this
// engine's role.
func (e *Engine) checkDisagg(g *genRequest) error {
	p := g.kvParams
	switch {
	case p != nil && p.DoRemoteDecode && p.DoRemotePrefill:
		return fmt.Errorf("%w: kv_transfer_params cannot ask for both do_remote_decode and do_remote_prefill", errBadRequest)
	case p != nil && p.DoRemoteDecode && e.cfg.Role != RolePrefill:
		return fmt.Errorf("%w: kv_transfer_params.do_remote_decode needs a prefill engine; this one is %s", errBadRequest, e.cfg.Role)
	case p != nil && p.DoRemoteDecode && g.stream:
		return fmt.Errorf("%w: kv_transfer_params.do_remote_decode answers with the transfer parameters: stream must be false", errBadRequest)
	case p != nil && p.DoRemotePrefill && e.cfg.Role != RoleDecode:
		return fmt.Errorf("%w: kv_transfer_params.do_remote_prefill needs a decode engine; this one is %s", errBadRequest, e.cfg.Role)
	case p != nil && p.DoRemotePrefill && (p.RemoteHost == nil || p.RemotePort == nil || p.RemoteRequestID == nil):
		return fmt.Errorf("%w: kv_transfer_params with do_remote_prefill needs remote_host, remote_port and remote_request_id", errBadRequest)
	case g.room != nil && p != nil && (p.DoRemoteDecode || p.DoRemotePrefill):
		return fmt.Errorf("%w: bootstrap_room (SGLang) and kv_transfer_params (vLLM) are two protocols; send one", errBadRequest)
	case g.room != nil && e.cfg.Role == RoleUnified:
		return fmt.Errorf("%w: bootstrap_room needs a prefill or decode engine; this one is unified", errBadRequest)
	case g.room != nil && e.cfg.Role == RolePrefill && e.bootLis == nil:
		return fmt.Errorf("%w: bootstrap_room on a prefill engine without a bootstrap port", errBadRequest)
	case g.room != nil && e.cfg.Role == RoleDecode && (g.room.host == "" || g.room.port == 0):
		return fmt.Errorf("%w: bootstrap_room needs bootstrap_host and bootstrap_port on a decode engine", errBadRequest)
	}
	if p != nil && p.DoRemotePrefill {
		if _, err := p.blockIDs(); err != nil {
			return err
		}
	}
	return nil
}

// holdForRemoteDecode holds a finished prefill's prompt blocks for a
// decode engine to pull (until RemoteDecodeTimeout, vLLM's
// VLLM_NIXL_ABORT_REQUEST_TIMEOUT) and returns the kv_transfer_params
// naming them.
func (e *Engine) holdForRemoteDecode(r *genRequest, res result) (*kvTransferParams, error) {
	id, err := newHandleID()
	if err != nil {
		return nil, err
	}
	id = nixlHandlePrefix + id
	ids := make([]uint64, res.kept.size())
	base := e.blockIDs.Add(uint64(len(ids))) - uint64(len(ids))
	for i := range ids {
		ids[i] = base + uint64(i)
	}
	h := &handle{
		id: id,
		header: &kvv1.KvHeader{HandleId: id, Model: e.cfg.Model, KvFormat: e.cfg.KVFormat, PromptIds: r.prompt,
			Seed: r.seed, NumBlocks: uint32(blockCount(len(r.prompt)))},
		blocks:   res.kept,
		blockIDs: ids,
	}
	if err := e.core.holdAcquired(h, e.cfg.RemoteDecodeTimeout); err != nil {
		return nil, err
	}
	host, portStr, _ := net.SplitHostPort(e.advertised(e.GRPCAddr()))
	port, _ := strconv.Atoi(portStr)
	raw, _ := json.Marshal(ids)
	engineID, tp := e.cfg.ID, 1
	return &kvTransferParams{
		DoRemotePrefill: true, RemoteEngineID: &engineID, RemoteBlockIDs: raw, RemoteRequestID: &id,
		RemoteHost: &host, RemotePort: &port, TPSize: &tp,
	}, nil
}

// Pull streams a remote decode's KV to the decode engine and frees it.
func (s *kvServer) Pull(req *kvv1.PullRequest, stream grpc.ServerStreamingServer[kvv1.KvChunk]) error {
	e := s.e
	if err := e.gate(stream.Context()); err != nil {
		return err
	}
	if e.Faults().RefusePull {
		return status.Error(codes.Unavailable, "engine refuses KV pulls (injected fault)")
	}
	if e.cfg.Role != RolePrefill {
		return status.Errorf(codes.FailedPrecondition, "pull: only prefill engines hold KV for remote decodes; this one is %s", e.cfg.Role)
	}
	if !strings.HasPrefix(req.GetHandleId(), nixlHandlePrefix) {
		return status.Errorf(codes.NotFound, "pull: %q is not a remote decode's handle", req.GetHandleId())
	}
	h := e.core.take(req.GetHandleId())
	if h == nil {
		return status.Errorf(codes.NotFound, "pull: no KV held under %q (unknown, already read or timed out)", req.GetHandleId())
	}
	defer e.core.drop(h) // read once: freed whether or not the read succeeds
	switch {
	case req.GetModel() != "" && req.GetModel() != e.cfg.Model:
		return status.Errorf(codes.FailedPrecondition, "pull: model %q, this engine serves %q", req.GetModel(), e.cfg.Model)
	case len(req.GetBlockIds()) > 0 && !slices.Equal(req.GetBlockIds(), h.blockIDs):
		return status.Errorf(codes.InvalidArgument, "pull: remote_block_ids %v are not the blocks of %q", req.GetBlockIds(), h.id)
	}
	if err := stream.Send(&kvv1.KvChunk{Part: &kvv1.KvChunk_Header{Header: h.header}}); err != nil {
		return err
	}
	for i, data := range e.hash.promptBlocks(h.header.GetPromptIds()) {
		block := &kvv1.KvBlock{Index: uint32(i), Data: data, Checksum: blockChecksum(data)}
		if err := stream.Send(&kvv1.KvChunk{Part: &kvv1.KvChunk_Block{Block: block}}); err != nil {
			return err
		}
	}
	e.core.count(func(c *counters) { c.pulls++ })
	return nil
}

// pullKV reads a remote prefill's KV for a request (vLLM's NixlConnector
// read, over tl.kv.v1 Pull) and holds it under a handle the request
// resumes from, computing the last prompt token and sampling the first.
func (e *Engine) pullKV(ctx context.Context, g *genRequest) (*handle, error) {
	p := g.kvParams
	ids, _ := p.blockIDs()
	target := net.JoinHostPort(*p.RemoteHost, strconv.Itoa(*p.RemotePort))
	if e.Faults().UnreachablePrefill {
		return nil, fmt.Errorf("%w: prefill engine %s unreachable (injected fault)", errKVTransfer, target)
	}
	conn, err := e.kvConn(target)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", errKVTransfer, target, err)
	}
	stream, err := kvv1.NewKvTransferServiceClient(conn).Pull(ctx, &kvv1.PullRequest{
		HandleId: *p.RemoteRequestID, BlockIds: ids, Model: e.cfg.Model})
	if err != nil {
		return nil, fmt.Errorf("%w: pull from %s: %w", errKVTransfer, target, err)
	}
	first, err := stream.Recv()
	if err != nil {
		return nil, fmt.Errorf("%w: pull from %s: %s", errKVTransfer, target, status.Convert(err).Message())
	}
	header := first.GetHeader()
	switch {
	case header == nil:
		return nil, fmt.Errorf("%w: %s sent no header", errKVTransfer, target)
	case header.GetModel() != e.cfg.Model || header.GetKvFormat() != e.cfg.KVFormat:
		return nil, fmt.Errorf("%w: %s holds model %q kv_format %d; this engine has %q %d", errKVTransfer, target,
			header.GetModel(), header.GetKvFormat(), e.cfg.Model, e.cfg.KVFormat)
	case !slices.Equal(header.GetPromptIds(), g.prompt):
		return nil, fmt.Errorf("%w: the KV of %s is of another prompt (%d tokens, the request has %d)", errBadRequest,
			*p.RemoteRequestID, len(header.GetPromptIds()), len(g.prompt))
	}
	want := e.hash.promptBlocks(g.prompt)
	for i := range want {
		chunk, err := stream.Recv()
		if err != nil {
			return nil, fmt.Errorf("%w: block %d of %d from %s: %w", errKVTransfer, i, len(want), target, err)
		}
		b := chunk.GetBlock()
		if b == nil || int(b.GetIndex()) != i || blockChecksum(b.GetData()) != b.GetChecksum() || !bytes.Equal(b.GetData(), want[i]) {
			return nil, fmt.Errorf("%w: block %d from %s is corrupt", errKVTransfer, i, target)
		}
	}
	if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: %s sent more than %d blocks", errKVTransfer, target, len(want))
	}
	full := e.hash.blocks(g.prompt, "", "")
	h := &handle{id: nixlHandlePrefix + "pulled-" + *p.RemoteRequestID, header: header,
		blocks: blockSet{blocks: full, private: len(want) - len(full)}, sampleFirst: true}
	if err := e.core.hold(h); err != nil {
		return nil, err
	}
	return e.core.take(h.id), nil
}
