package enginesim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"

	"github.com/tlgate/tlgate/enginesim/tokenizer"
	"github.com/tlgate/tlgate/enginesim/toymodel"
)

// Sampling defaults, as in engine.proto's SamplingParams.
const (
	defaultMaxTokensCompletion = 16
	defaultMaxTokensChat       = 256
	maxTopLogprobs             = 20
)

// errBadRequest is wrapped by every request validation error (HTTP 400).
var errBadRequest = errors.New("invalid request")

// openAIRequest is the union of the completions and chat completions bodies
// (unknown fields are ignored, as engines do).
type openAIRequest struct {
	Model               string          `json:"model"`
	Prompt              json.RawMessage `json:"prompt"`
	Messages            []chatMessageIn `json:"messages"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Temperature         *float64        `json:"temperature"`
	TopP                *float64        `json:"top_p"`
	TopK                *int            `json:"top_k"`
	Seed                *json.Number    `json:"seed"`
	Stop                json.RawMessage `json:"stop"`
	Stream              bool            `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	Logprobs         json.RawMessage `json:"logprobs"`
	TopLogprobs      *int            `json:"top_logprobs"`
	PresencePenalty  *float64        `json:"presence_penalty"`
	FrequencyPenalty *float64        `json:"frequency_penalty"`
	N                *int            `json:"n"`
	CacheSalt        string          `json:"cache_salt"`
	// vLLM's disaggregation (NixlConnector) and SGLang's.
	KVTransferParams *kvTransferParams `json:"kv_transfer_params"`
	BootstrapHost    string            `json:"bootstrap_host"`
	BootstrapPort    *int              `json:"bootstrap_port"`
	BootstrapRoom    *json.Number      `json:"bootstrap_room"`
	// vLLM's chat template switches (chat only).
	AddGenerationPrompt  *bool `json:"add_generation_prompt"`
	ContinueFinalMessage bool  `json:"continue_final_message"`
}

type chatMessageIn struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// genRequest is a validated inference request.
type genRequest struct {
	chat        bool
	prompt      []uint32
	maxTokens   int
	params      toymodel.Params
	seed        uint64
	seeded      bool // the body carried a seed
	stop        []string
	logprobs    bool
	topLogprobs int
	stream      bool
	usageChunk  bool
	cacheSalt   string // vLLM's cache_salt: prefix blocks are shared only with the same salt
	lora        string // the LoRA adapter asked for ("" for the base model)
	// keepPrompt keeps the prompt's blocks after the request (result.kept)
	// for a remote decode engine.
	keepPrompt bool
	kvParams   *kvTransferParams // vLLM's kv_transfer_params
	room       *bootstrapRoom    // SGLang's bootstrap fields
}

// parseRequest validates body for chat or completions and tokenizes its
// prompt. The model id is checked by the caller.
func parseRequest(tok *tokenizer.Tokenizer, body []byte, chat bool) (*openAIRequest, *genRequest, error) {
	var req openAIRequest
	if err := decodeJSON(body, &req); err != nil {
		return nil, nil, err
	}
	if req.Model == "" {
		return nil, nil, fmt.Errorf("%w: model is required", errBadRequest)
	}
	g := &genRequest{chat: chat, stream: req.Stream, cacheSalt: req.CacheSalt}
	var err error
	if chat {
		var opts tokenizer.ChatOptions
		if opts, err = chatOptions(req.AddGenerationPrompt, req.ContinueFinalMessage); err == nil {
			g.prompt, err = chatPrompt(tok, req.Messages, opts)
		}
		g.maxTokens = defaultMaxTokensChat
	} else {
		g.prompt, err = completionPrompt(tok, req.Prompt)
		g.maxTokens = defaultMaxTokensCompletion
	}
	if err != nil {
		return nil, nil, err
	}
	if err := g.sampling(&req); err != nil {
		return nil, nil, err
	}
	if err := g.outputs(&req, chat); err != nil {
		return nil, nil, err
	}
	if err := g.disagg(&req); err != nil {
		return nil, nil, err
	}
	return &req, g, nil
}

// disagg reads the disaggregation fields: vLLM's kv_transfer_params and
// SGLang's bootstrap_host, bootstrap_port and bootstrap_room.
func (g *genRequest) disagg(req *openAIRequest) error {
	if p := req.KVTransferParams; p != nil && (p.DoRemoteDecode || p.DoRemotePrefill) {
		g.kvParams = p
	}
	if req.BootstrapRoom == nil {
		if req.BootstrapHost != "" || req.BootstrapPort != nil {
			return fmt.Errorf("%w: bootstrap_host and bootstrap_port need bootstrap_room", errBadRequest)
		}
		return nil
	}
	id, err := strconv.ParseUint(req.BootstrapRoom.String(), 10, 64)
	if err != nil {
		return fmt.Errorf("%w: bootstrap_room %s is not an unsigned 64-bit integer", errBadRequest, req.BootstrapRoom)
	}
	g.room = &bootstrapRoom{host: req.BootstrapHost, room: id}
	if p := req.BootstrapPort; p != nil {
		if *p <= 0 || *p > 65535 {
			return fmt.Errorf("%w: bootstrap_port %d outside 1..65535", errBadRequest, *p)
		}
		g.room.port = *p
	}
	return nil
}

func decodeJSON(body []byte, v any) error {
	if len(bytes.TrimSpace(body)) == 0 {
		return fmt.Errorf("%w: empty body", errBadRequest)
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("%w: %w", errBadRequest, err)
	}
	return nil
}

func (g *genRequest) sampling(req *openAIRequest) error {
	g.params = toymodel.Params{Temperature: 1, TopP: 1}
	if m := req.MaxCompletionTokens; m != nil {
		g.maxTokens = *m
	} else if m := req.MaxTokens; m != nil {
		g.maxTokens = *m
	}
	if g.maxTokens < 1 {
		return fmt.Errorf("%w: max_tokens must be at least 1, got %d", errBadRequest, g.maxTokens)
	}
	if t := req.Temperature; t != nil {
		if *t < 0 || *t > 2 {
			return fmt.Errorf("%w: temperature %v outside [0, 2]", errBadRequest, *t)
		}
		g.params.Temperature = f32(*t)
	}
	if p := req.TopP; p != nil {
		if *p <= 0 || *p > 1 {
			return fmt.Errorf("%w: top_p %v outside (0, 1]", errBadRequest, *p)
		}
		g.params.TopP = f32(*p)
	}
	if k := req.TopK; k != nil {
		if *k < -1 {
			return fmt.Errorf("%w: top_k %d must be -1, 0 (off) or positive", errBadRequest, *k)
		}
		g.params.TopK = max(*k, 0)
	}
	for _, pen := range []struct {
		name string
		v    *float64
		dst  *float64
	}{
		{"presence_penalty", req.PresencePenalty, &g.params.PresencePenalty},
		{"frequency_penalty", req.FrequencyPenalty, &g.params.FrequencyPenalty},
	} {
		if pen.v == nil {
			continue
		}
		if *pen.v < -2 || *pen.v > 2 {
			return fmt.Errorf("%w: %s %v outside [-2, 2]", errBadRequest, pen.name, *pen.v)
		}
		*pen.dst = f32(*pen.v)
	}
	if n := req.N; n != nil && *n != 1 {
		return fmt.Errorf("%w: n must be 1, got %d", errBadRequest, *n)
	}
	if req.Seed != nil {
		seed, err := parseSeed(*req.Seed)
		if err != nil {
			return err
		}
		g.seed, g.seeded = seed, true
	} else {
		g.seed = rand.Uint64()
	}
	stop, err := parseStop(req.Stop)
	if err != nil {
		return err
	}
	g.stop = stop
	return nil
}

// f32 rounds a sampling parameter to float32, the precision of
// SamplingParams in engine.proto, so a prefill engine (which receives
// float32) and a unified or decode engine (which parse the JSON body) sample
// with exactly the same values.
func f32(v float64) float64 { return float64(float32(v)) }

// parseSeed accepts any integer in int64 or uint64 range; negative seeds are
// taken as their two's complement.
func parseSeed(n json.Number) (uint64, error) {
	if u, err := strconv.ParseUint(n.String(), 10, 64); err == nil {
		return u, nil
	}
	if i, err := strconv.ParseInt(n.String(), 10, 64); err == nil {
		return uint64(i), nil
	}
	return 0, fmt.Errorf("%w: seed %s is not a 64-bit integer", errBadRequest, n)
}

func parseStop(raw json.RawMessage) ([]string, error) {
	if isNull(raw) {
		return nil, nil
	}
	var one string
	if err := json.Unmarshal(raw, &one); err == nil {
		if one == "" {
			return nil, nil
		}
		return []string{one}, nil
	}
	var many []string
	if err := json.Unmarshal(raw, &many); err != nil {
		return nil, fmt.Errorf("%w: stop must be a string or an array of strings", errBadRequest)
	}
	out := many[:0]
	for _, s := range many {
		if s != "" {
			out = append(out, s)
		}
	}
	return out, nil
}

// outputs parses the logprobs options: on completions logprobs is the
// number of top logprobs (true means 0); on chat it is a bool with
// top_logprobs beside it.
func (g *genRequest) outputs(req *openAIRequest, chat bool) error {
	g.usageChunk = req.StreamOptions != nil && req.StreamOptions.IncludeUsage
	if !isNull(req.Logprobs) {
		var on bool
		var n int
		if err := json.Unmarshal(req.Logprobs, &on); err != nil {
			if err := json.Unmarshal(req.Logprobs, &n); err != nil {
				return fmt.Errorf("%w: logprobs must be a boolean or an integer", errBadRequest)
			}
			on = true
			if chat {
				n = 0
			}
		}
		g.logprobs = on
		if !chat {
			g.topLogprobs = n
		}
	}
	if chat && req.TopLogprobs != nil {
		g.topLogprobs = *req.TopLogprobs
	}
	if g.topLogprobs < 0 || g.topLogprobs > maxTopLogprobs {
		return fmt.Errorf("%w: top logprobs %d outside [0, %d]", errBadRequest, g.topLogprobs, maxTopLogprobs)
	}
	return nil
}

func isNull(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) == 0 || string(t) == "null"
}

// completionPrompt accepts a string, a one-element array of strings, an
// array of token ids or a one-element array of such arrays.
func completionPrompt(tok *tokenizer.Tokenizer, raw json.RawMessage) ([]uint32, error) {
	if isNull(raw) {
		return nil, fmt.Errorf("%w: prompt is required", errBadRequest)
	}
	var ids []uint32
	var s string
	var ss []string
	var idss [][]uint32
	switch {
	case json.Unmarshal(raw, &s) == nil:
		ids = tok.Encode(s)
	case json.Unmarshal(raw, &ids) == nil:
	case json.Unmarshal(raw, &ss) == nil && len(ss) == 1:
		ids = tok.Encode(ss[0])
	case json.Unmarshal(raw, &idss) == nil && len(idss) == 1:
		ids = idss[0]
	default:
		return nil, fmt.Errorf("%w: prompt must be a string, token ids, or a one-element array of either", errBadRequest)
	}
	if len(ids) == 0 {
		return nil, fmt.Errorf("%w: prompt is empty", errBadRequest)
	}
	for _, id := range ids {
		if int(id) >= tok.VocabSize() {
			return nil, fmt.Errorf("%w: token id %d outside the vocabulary (%d)", errBadRequest, id, tok.VocabSize())
		}
	}
	return ids, nil
}

// chatPrompt renders messages with the fixed template and tokenizes them.
func chatPrompt(tok *tokenizer.Tokenizer, msgs []chatMessageIn, opts tokenizer.ChatOptions) ([]uint32, error) {
	rendered, err := renderMessages(msgs, opts)
	if err != nil {
		return nil, err
	}
	return tok.Encode(rendered), nil
}

// chatOptions reads vLLM's add_generation_prompt (default true) and
// continue_final_message, which exclude each other.
func chatOptions(addGenerationPrompt *bool, continueFinal bool) (tokenizer.ChatOptions, error) {
	opts := tokenizer.ChatOptions{AddGenerationPrompt: true, ContinueFinalMessage: continueFinal}
	if addGenerationPrompt != nil {
		opts.AddGenerationPrompt = *addGenerationPrompt
	}
	if opts.AddGenerationPrompt && continueFinal {
		if addGenerationPrompt == nil {
			opts.AddGenerationPrompt = false // continuing the last message asks for no generation prompt
		} else {
			return opts, fmt.Errorf("%w: cannot set both continue_final_message and add_generation_prompt to true", errBadRequest)
		}
	}
	return opts, nil
}

func renderMessages(msgs []chatMessageIn, opts tokenizer.ChatOptions) (string, error) {
	if len(msgs) == 0 {
		return "", fmt.Errorf("%w: messages must not be empty", errBadRequest)
	}
	out := make([]tokenizer.Message, len(msgs))
	for i, m := range msgs {
		if m.Role == "" {
			return "", fmt.Errorf("%w: messages[%d].role is required", errBadRequest, i)
		}
		text, err := contentText(m.Content)
		if err != nil {
			return "", fmt.Errorf("%w: messages[%d].content: %w", errBadRequest, i, err)
		}
		out[i] = tokenizer.Message{Role: m.Role, Content: text}
	}
	return tokenizer.RenderChatWith(out, opts), nil
}

// contentText accepts a string, null, or an array of text parts.
func contentText(raw json.RawMessage) (string, error) {
	if isNull(raw) {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", errors.New("must be a string or an array of text parts")
	}
	var b bytes.Buffer
	for _, p := range parts {
		if p.Type != "text" {
			return "", fmt.Errorf("part type %q is not supported", p.Type)
		}
		b.WriteString(p.Text)
	}
	return b.String(), nil
}

// tokenizeRequest is the body of POST /tokenize (and /v1/tokenize),
// vLLM's: prompt, or messages with the chat template's switches.
// add_special_tokens is accepted and changes nothing: the toy tokenizer
// has no special tokens.
type tokenizeRequest struct {
	Model                string          `json:"model"`
	Prompt               *string         `json:"prompt"`
	Messages             []chatMessageIn `json:"messages"`
	AddGenerationPrompt  *bool           `json:"add_generation_prompt"`
	ContinueFinalMessage bool            `json:"continue_final_message"`
	AddSpecialTokens     *bool           `json:"add_special_tokens"`
	ReturnTokenStrs      bool            `json:"return_token_strs"`
}

// Response shapes.

type usageJSON struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

type completionLogprobsJSON struct {
	Tokens        []string             `json:"tokens"`
	TokenLogprobs []float64            `json:"token_logprobs"`
	TopLogprobs   []map[string]float64 `json:"top_logprobs"`
	TextOffset    []int                `json:"text_offset"`
}

type completionChoiceJSON struct {
	Index        int                     `json:"index"`
	Text         string                  `json:"text"`
	Logprobs     *completionLogprobsJSON `json:"logprobs"`
	FinishReason *string                 `json:"finish_reason"`
}

type completionJSON struct {
	ID               string                 `json:"id"`
	Object           string                 `json:"object"`
	Created          int64                  `json:"created"`
	Model            string                 `json:"model"`
	Choices          []completionChoiceJSON `json:"choices"`
	Usage            *usageJSON             `json:"usage,omitempty"`
	KVTransferParams *kvTransferParams      `json:"kv_transfer_params,omitempty"`
}

type chatTopLogprobJSON struct {
	Token   string  `json:"token"`
	Logprob float64 `json:"logprob"`
	Bytes   []int   `json:"bytes"`
}

type chatTokenLogprobJSON struct {
	Token       string               `json:"token"`
	Logprob     float64              `json:"logprob"`
	Bytes       []int                `json:"bytes"`
	TopLogprobs []chatTopLogprobJSON `json:"top_logprobs"`
}

type chatLogprobsJSON struct {
	Content []chatTokenLogprobJSON `json:"content"`
}

type chatMessageJSON struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

type chatChoiceJSON struct {
	Index        int               `json:"index"`
	Message      *chatMessageJSON  `json:"message,omitempty"`
	Delta        *chatMessageJSON  `json:"delta,omitempty"`
	Logprobs     *chatLogprobsJSON `json:"logprobs"`
	FinishReason *string           `json:"finish_reason"`
}

type chatJSON struct {
	ID               string            `json:"id"`
	Object           string            `json:"object"`
	Created          int64             `json:"created"`
	Model            string            `json:"model"`
	Choices          []chatChoiceJSON  `json:"choices"`
	Usage            *usageJSON        `json:"usage,omitempty"`
	KVTransferParams *kvTransferParams `json:"kv_transfer_params,omitempty"`
}

// errorJSON is OpenAI's error shape.
type errorJSON struct {
	Error errorBody `json:"error"`
}

type errorBody struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    string  `json:"code"`
}

func byteInts(s string) []int {
	out := make([]int, len(s))
	for i := range len(s) {
		out[i] = int(s[i])
	}
	return out
}
