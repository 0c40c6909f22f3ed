// Package engineclient calls engines for disaggregated serving: the prompt's
// token ids from a prefill worker's POST /v1/tokenize, EngineControl/Prefill
// on the prefill worker, and KvTransferService/Release on the decode worker.
// gRPC connections are pooled per address; every call has a deadline.
package engineclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tlgate/tlgate/internal/wire/tracectx"
	enginev1 "github.com/tlgate/tlgate/protos/tl/engine/v1"
	kvv1 "github.com/tlgate/tlgate/protos/tl/kv/v1"
)

// Errors of the client.
var (
	ErrTokenize = errors.New("tokenize failed")
	ErrClosed   = errors.New("engine client closed")
)

// Tokenizer turns a request body into the prompt's token ids.
type Tokenizer interface {
	Tokenize(ctx context.Context, httpAddr, model string, body []byte, chat bool) ([]uint32, error)
}

// Options configure the client.
type Options struct {
	HTTP    *http.Client
	Timeout time.Duration // per call (default 10 s)
	// TLS, when set, is used for gRPC connections to engines.
	TLS credentials.TransportCredentials
	// Scheme of engines' HTTP surface: "http" (default) or "https".
	Scheme string
	// DialControl, when set, runs for every address a gRPC dial to an
	// engine tries, after name resolution and before connecting; an error
	// refuses the address (fleet.AddressPolicy.DialControl). HTTP's dials
	// are the HTTP client's.
	DialControl func(network, address string, c syscall.RawConn) error
	// ReconnectMaxDelay caps gRPC's reconnect backoff towards an engine
	// (gRPC's default grows to 120 s); the gateway sets its heartbeat
	// interval, so a restarted engine is reached again within about one
	// interval. Zero keeps gRPC's default.
	ReconnectMaxDelay time.Duration
}

// Client implements the calls; it is safe for concurrent use.
type Client struct {
	o     Options
	mu    sync.Mutex
	conns map[string]*grpc.ClientConn
	done  bool
}

// New returns a client.
func New(o Options) *Client {
	if o.HTTP == nil {
		o.HTTP = http.DefaultClient
	}
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Second
	}
	if o.Scheme == "" {
		o.Scheme = "http"
	}
	return &Client{o: o, conns: map[string]*grpc.ClientConn{}}
}

func (c *Client) conn(addr string) (*grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done {
		return nil, ErrClosed
	}
	if cc, ok := c.conns[addr]; ok {
		return cc, nil
	}
	creds := c.o.TLS
	if creds == nil {
		creds = insecure.NewCredentials()
	}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(creds)}
	if d := c.o.ReconnectMaxDelay; d > 0 {
		opts = append(opts, grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: min(time.Second, d/10), Multiplier: 1.6, Jitter: 0.2, MaxDelay: d},
			MinConnectTimeout: max(d, time.Second),
		}))
	}
	if c.o.DialControl != nil {
		d := &net.Dialer{Control: c.o.DialControl}
		opts = append(opts, grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) {
			return d.DialContext(ctx, "tcp", a)
		}))
	}
	cc, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("engineclient: dial %s: %w", addr, err)
	}
	c.conns[addr] = cc
	return cc, nil
}

// Close closes every pooled connection.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.done = true
	var errs []error
	for _, cc := range c.conns {
		errs = append(errs, cc.Close())
	}
	c.conns = nil
	return errors.Join(errs...)
}

// PromptError is Tokenize's error when the request is at fault, not the
// engine: its prompt is a batch (one Prefill serves one prompt), holds a
// token id out of range or no tokens at all, or the engine refused it with
// a client error. Status is the HTTP status to answer with, Message what
// the client is told.
type PromptError struct {
	Status  int
	Message string
}

func (e *PromptError) Error() string { return "engineclient: " + e.Message }

// Tokenize returns the token ids of the body's prompt (completions) or
// messages (chat, rendered with the body's chat template switches:
// chatTemplateFields). A completions prompt that is token ids (an array of
// them, or a one-element array of one) is its own answer; text (a string,
// or a one-element array of one) is tokenized by the engine at httpAddr,
// serving model. Errors the request is at fault for are *PromptError.
func (c *Client) Tokenize(ctx context.Context, httpAddr, model string, body []byte, chat bool) ([]uint32, error) {
	var in map[string]json.RawMessage
	if err := json.Unmarshal(body, &in); err != nil {
		return nil, fmt.Errorf("engineclient: %w: %v", ErrTokenize, err)
	}
	out := map[string]json.RawMessage{}
	if chat {
		out["messages"] = in["messages"]
		for _, k := range chatTemplateFields {
			if v, ok := in[k]; ok {
				out[k] = v
			}
		}
	} else {
		text, ids, err := promptOf(in["prompt"])
		if err != nil || ids != nil {
			return ids, err
		}
		out["prompt"] = text
	}
	out["model"], _ = json.Marshal(model)
	b, _ := json.Marshal(out)
	ctx, cancel := context.WithTimeout(ctx, c.o.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.o.Scheme+"://"+httpAddr+"/v1/tokenize", bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("engineclient: %w: %v", ErrTokenize, err)
	}
	req.Header.Set("Content-Type", "application/json")
	tracectx.Inject(ctx, req.Header)
	resp, err := c.o.HTTP.Do(req)
	if err != nil {
		return nil, fmt.Errorf("engineclient: %w: %v", ErrTokenize, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("engineclient: %w: %v", ErrTokenize, err)
	}
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusUnprocessableEntity:
		// The engine read the prompt and refused it: any engine of the
		// model would.
		return nil, &PromptError{Status: resp.StatusCode, Message: "The prefill engine refused the prompt: " + refusal(data)}
	default:
		return nil, fmt.Errorf("engineclient: %w: status %d", ErrTokenize, resp.StatusCode)
	}
	var tr struct {
		Tokens []uint32 `json:"tokens"`
	}
	if err := json.Unmarshal(data, &tr); err != nil {
		return nil, fmt.Errorf("engineclient: %w: %v", ErrTokenize, err)
	}
	if len(tr.Tokens) == 0 {
		return nil, &PromptError{Status: http.StatusBadRequest, Message: "The prompt has no tokens."}
	}
	return tr.Tokens, nil
}

// chatTemplateFields are the fields of a chat request that change the
// prompt its chat template renders, which vLLM's /tokenize takes beside the
// messages (TokenizeChatRequest): a Messages request with an assistant
// prefill, for one, is bridged with continue_final_message true and
// add_generation_prompt false, and the prefill engine must tokenize the
// prompt the decode engine renders.
var chatTemplateFields = []string{
	"add_generation_prompt", "continue_final_message", "add_special_tokens",
	"chat_template", "chat_template_kwargs", "tools", "mm_processor_kwargs", "media_io_kwargs",
}

// promptOf reads a completions prompt: the text to tokenize, or the token
// ids it is.
func promptOf(raw json.RawMessage) (text json.RawMessage, ids []uint32, err error) {
	var one []json.RawMessage
	if json.Unmarshal(raw, &one) != nil { // not an array: a string
		return raw, nil, nil
	}
	if json.Unmarshal(raw, &ids) == nil { // token ids
		if len(ids) == 0 {
			return nil, nil, &PromptError{Status: http.StatusBadRequest, Message: "The prompt has no tokens."}
		}
		return nil, ids, nil
	}
	var n []json.Number
	if json.Unmarshal(raw, &n) == nil {
		return nil, nil, &PromptError{Status: http.StatusBadRequest, Message: fmt.Sprintf("prompt: token ids must be from 0 to %d.", uint32(math.MaxUint32))}
	}
	if len(one) != 1 {
		return nil, nil, &PromptError{Status: http.StatusBadRequest,
			Message: fmt.Sprintf("prompt: this model is served disaggregated, which takes one prompt per request; send the %d prompts one by one.", len(one))}
	}
	if len(one[0]) > 0 && one[0][0] == '"' {
		return one[0], nil, nil
	}
	return promptOf(one[0])
}

// refusal is the message of an engine's error answer (OpenAI's
// {"error":{"message"}}, vLLM's {"message"}, FastAPI's {"detail"}), or
// its start.
func refusal(body []byte) string {
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
		Message string `json:"message"`
		Detail  any    `json:"detail"`
	}
	_ = json.Unmarshal(body, &e)
	msg := e.Error.Message
	if msg == "" {
		msg = e.Message
	}
	if msg == "" {
		if d, ok := e.Detail.(string); ok {
			msg = d
		}
	}
	if msg == "" {
		msg = string(body)
	}
	if r := []rune(msg); len(r) > 300 {
		msg = string(r[:300]) + "..."
	}
	return msg
}

// Prefill calls EngineControl/Prefill on the prefill worker at grpcAddr.
func (c *Client) Prefill(ctx context.Context, grpcAddr string, req *enginev1.PrefillRequest) (*enginev1.PrefillResponse, error) {
	cc, err := c.conn(grpcAddr)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(tracectx.OutgoingGRPC(ctx), c.o.Timeout)
	defer cancel()
	resp, err := enginev1.NewEngineControlClient(cc).Prefill(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("engineclient: prefill on %s: %w", grpcAddr, err)
	}
	return resp, nil
}

// Release calls KvTransferService/Release on the decode worker at kvAddr.
// It uses its own deadline and ignores ctx's cancellation, so a handle is
// released even when the client's request was canceled; ctx carries the
// trace context (traceparent in the call's metadata).
func (c *Client) Release(ctx context.Context, kvAddr, handle string) (*kvv1.ReleaseResponse, error) {
	cc, err := c.conn(kvAddr)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(tracectx.OutgoingGRPC(tracectx.Detached(ctx)), c.o.Timeout)
	defer cancel()
	resp, err := kvv1.NewKvTransferServiceClient(cc).Release(ctx, &kvv1.ReleaseRequest{HandleId: handle})
	if err != nil {
		return nil, fmt.Errorf("engineclient: release on %s: %w", kvAddr, err)
	}
	return resp, nil
}
