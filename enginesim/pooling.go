package enginesim

import (
	"cmp"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"slices"
	"time"

	"github.com/tlgate/tlgate/enginesim/toymodel"
)

// DefaultEmbeddingDim is the length of the toy model's embeddings.
const DefaultEmbeddingDim = 64

// The pooling endpoints, as vLLM serves them for an embedding or a
// cross-encoder model: the toy model embeds a text as the normalised sum
// of one pseudo-random vector per token (derived from the model's weights
// seed and the token id), so equal texts embed equally, a text and its
// token ids embed equally, and texts sharing words lie close. Rerank and
// score rate a pair by the cosine of the two embeddings mapped to [0, 1].

func (e *Engine) poolingRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/embeddings", e.traced("enginesim.embeddings", e.handleEmbeddings))
	for _, p := range []string{"/rerank", "/v1/rerank", "/v2/rerank"} {
		mux.HandleFunc("POST "+p, e.traced("enginesim.rerank", e.handleRerank))
	}
	for _, p := range []string{"/score", "/v1/score"} {
		mux.HandleFunc("POST "+p, e.traced("enginesim.score", e.handleScore))
	}
}

// embedder is one model's toy embedding.
type embedder struct {
	seed uint64
	dim  int
}

// embed returns the normalised embedding of ids (all zero for none).
func (m embedder) embed(ids []uint32) []float64 {
	v := make([]float64, m.dim)
	for _, id := range ids {
		h := m.seed ^ uint64(id)*0x9e3779b97f4a7c15
		for i := range v {
			h = splitmix(h)
			v[i] += float64(int64(h>>11)-(1<<52)) / (1 << 52)
		}
	}
	return renormalised(v)
}

func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// relevance maps the cosine of two normalised embeddings to [0, 1].
func relevance(a, b []float64) float64 {
	var dot float64
	for i := range a {
		dot += a[i] * b[i]
	}
	return math.Max(0, math.Min(1, (dot+1)/2))
}

// embedderFor is the embedding of a served model id (the base model or one
// of its adapters): each id has its own weights.
func (e *Engine) embedderFor(model string) embedder {
	seed := e.cfg.WeightsSeed
	if seed == 0 || model != e.cfg.Model {
		seed = toymodel.SeedOf(model)
	}
	return embedder{seed: seed, dim: e.cfg.EmbeddingDim}
}

// poolingBody reads a pooling request's body into v, checks its model and
// answers the error itself when it cannot; ok is false then.
func (e *Engine) poolingBody(w http.ResponseWriter, r *http.Request, v any, model func() string) bool {
	if id := r.Header.Get("X-Request-Id"); id != "" {
		w.Header().Set("X-Request-Id", id)
	}
	if !e.readJSON(w, r, v) {
		return false
	}
	if m := model(); m != "" && !e.serves(m) {
		writeModelNotFound(w, m)
		return false
	}
	if e.Draining() {
		writeError(w, http.StatusServiceUnavailable, "server_error", "draining", "engine is draining")
		return false
	}
	return true
}

// servedOr is model, or the base model when model is empty (vLLM's default).
func (e *Engine) servedOr(model string) string { return cmp.Or(model, e.cfg.Model) }

type embeddingsRequest struct {
	Model          string          `json:"model"`
	Input          json.RawMessage `json:"input"`
	EncodingFormat string          `json:"encoding_format"`
	Dimensions     *int            `json:"dimensions"`
}

// inputs reads an embeddings input (a string, strings, token ids, arrays
// of token ids) as token id sequences.
func (e *Engine) inputs(raw json.RawMessage) ([][]uint32, error) {
	var one string
	if json.Unmarshal(raw, &one) == nil {
		return [][]uint32{e.tok.Encode(one)}, nil
	}
	var texts []string
	if json.Unmarshal(raw, &texts) == nil && len(texts) > 0 {
		out := make([][]uint32, len(texts))
		for i, s := range texts {
			out[i] = e.tok.Encode(s)
		}
		return out, nil
	}
	var ids []uint32
	if json.Unmarshal(raw, &ids) == nil && len(ids) > 0 {
		return [][]uint32{ids}, e.checkIDs(ids)
	}
	var batches [][]uint32
	if json.Unmarshal(raw, &batches) == nil && len(batches) > 0 {
		for _, b := range batches {
			if err := e.checkIDs(b); err != nil {
				return nil, err
			}
		}
		return batches, nil
	}
	return nil, fmt.Errorf("%w: input must be a string, an array of strings, an array of token ids or an array of arrays of token ids", errBadRequest)
}

func (e *Engine) checkIDs(ids []uint32) error {
	for _, id := range ids {
		if int(id) >= e.tok.VocabSize() {
			return fmt.Errorf("%w: token id %d is outside the vocabulary (%d tokens)", errBadRequest, id, e.tok.VocabSize())
		}
	}
	return nil
}

func (e *Engine) handleEmbeddings(w http.ResponseWriter, r *http.Request) {
	var req embeddingsRequest
	if !e.poolingBody(w, r, &req, func() string { return req.Model }) {
		return
	}
	seqs, err := e.inputs(req.Input)
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_request", err.Error())
		return
	}
	dim := e.cfg.EmbeddingDim
	if d := req.Dimensions; d != nil && (*d < 1 || *d > dim) {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_request",
			fmt.Sprintf("dimensions must be between 1 and %d", dim))
		return
	} else if d != nil {
		dim = *d
	}
	if f := req.EncodingFormat; f != "" && f != "float" && f != "base64" {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_request",
			fmt.Sprintf("encoding_format %q is not float or base64", f))
		return
	}
	model := e.servedOr(req.Model)
	em := e.embedderFor(model)
	data := make([]map[string]any, len(seqs))
	tokens := 0
	for i, ids := range seqs {
		tokens += len(ids)
		v := em.embed(ids)
		if dim < len(v) { // Matryoshka-style: the leading dimensions, renormalised
			v = renormalised(v[:dim])
		}
		var out any = v
		if req.EncodingFormat == "base64" {
			out = base64Floats(v)
		}
		data[i] = map[string]any{"object": "embedding", "index": i, "embedding": out}
	}
	e.core.count(func(c *counters) { c.completed++ })
	writeJSON(w, http.StatusOK, map[string]any{
		"id": "embd-" + newID(false)[5:], "object": "list", "created": time.Now().Unix(), "model": model, "data": data,
		"usage": usageJSON{PromptTokens: tokens, TotalTokens: tokens},
	})
}

// renormalised scales v to unit length in place (a zero vector stays
// zero) and returns it.
func renormalised(v []float64) []float64 {
	var n float64
	for _, x := range v {
		n += x * x
	}
	if n > 0 {
		n = math.Sqrt(n)
		for i := range v {
			v[i] /= n
		}
	}
	return v
}

// base64Floats is OpenAI's base64 encoding: little-endian float32s.
func base64Floats(v []float64) string {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(x)))
	}
	return base64.StdEncoding.EncodeToString(b)
}

// document is a rerank document: a string, or an object with a "text".
type document struct{ Text string }

func (d *document) UnmarshalJSON(b []byte) error {
	if json.Unmarshal(b, &d.Text) == nil {
		return nil
	}
	var obj struct {
		Text *string `json:"text"`
	}
	if err := json.Unmarshal(b, &obj); err != nil || obj.Text == nil {
		return fmt.Errorf("a document must be a string or an object with a text string")
	}
	d.Text = *obj.Text
	return nil
}

type rerankRequest struct {
	Model     string     `json:"model"`
	Query     *string    `json:"query"`
	Documents []document `json:"documents"`
	TopN      int        `json:"top_n"`
}

func (e *Engine) handleRerank(w http.ResponseWriter, r *http.Request) {
	var req rerankRequest
	if !e.poolingBody(w, r, &req, func() string { return req.Model }) {
		return
	}
	switch {
	case req.Query == nil:
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_request", "query is required")
		return
	case len(req.Documents) == 0:
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_request", "documents must not be empty")
		return
	case req.TopN < 0:
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_request", "top_n must be >= 0")
		return
	}
	model := e.servedOr(req.Model)
	em := e.embedderFor(model)
	qids := e.tok.Encode(*req.Query)
	q := em.embed(qids)
	type result struct {
		Index          int               `json:"index"`
		Document       map[string]string `json:"document"`
		RelevanceScore float64           `json:"relevance_score"`
	}
	results := make([]result, len(req.Documents))
	tokens := 0
	for i, d := range req.Documents {
		ids := e.tok.Encode(d.Text)
		tokens += len(qids) + len(ids) // a cross-encoder reads the pair
		results[i] = result{Index: i, Document: map[string]string{"text": d.Text}, RelevanceScore: relevance(q, em.embed(ids))}
	}
	slices.SortStableFunc(results, func(a, b result) int { return cmp.Compare(b.RelevanceScore, a.RelevanceScore) })
	if req.TopN > 0 && req.TopN < len(results) {
		results = results[:req.TopN]
	}
	e.core.count(func(c *counters) { c.completed++ })
	writeJSON(w, http.StatusOK, map[string]any{
		"id": "rerank-" + newID(false)[5:], "model": model, "results": results,
		"usage": map[string]int{"total_tokens": tokens},
	})
}

// texts is a score side: a string or an array of strings.
type texts []string

func (t *texts) UnmarshalJSON(b []byte) error {
	var one string
	if json.Unmarshal(b, &one) == nil {
		*t = texts{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return fmt.Errorf("text_1 and text_2 must be strings or arrays of strings")
	}
	*t = many
	return nil
}

type scoreRequest struct {
	Model string `json:"model"`
	Text1 texts  `json:"text_1"`
	Text2 texts  `json:"text_2"`
}

func (e *Engine) handleScore(w http.ResponseWriter, r *http.Request) {
	var req scoreRequest
	if !e.poolingBody(w, r, &req, func() string { return req.Model }) {
		return
	}
	n1, n2 := len(req.Text1), len(req.Text2)
	switch {
	case n1 == 0 || n2 == 0:
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_request", "text_1 and text_2 must not be empty")
		return
	case n1 > 1 && n1 != n2:
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_request",
			fmt.Sprintf("text_1 has %d texts and text_2 %d: give one text_1, or as many as text_2", n1, n2))
		return
	}
	model := e.servedOr(req.Model)
	em := e.embedderFor(model)
	data := make([]map[string]any, n2)
	tokens := 0
	for i, t2 := range req.Text2 {
		t1 := req.Text1[min(i, n1-1)]
		a, b := e.tok.Encode(t1), e.tok.Encode(t2)
		tokens += len(a) + len(b)
		data[i] = map[string]any{"index": i, "object": "score", "score": relevance(em.embed(a), em.embed(b))}
	}
	e.core.count(func(c *counters) { c.completed++ })
	writeJSON(w, http.StatusOK, map[string]any{
		"id": "score-" + newID(false)[5:], "object": "list", "created": time.Now().Unix(), "model": model, "data": data,
		"usage": usageJSON{PromptTokens: tokens, TotalTokens: tokens},
	})
}
