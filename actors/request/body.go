package request

import (
	"github.com/tlgate/tlgate/internal/wire/openai"
)

// body is an attempt's body: the client's, as the edge read it once
// (Request.Object), with the attempt's edits and extra spliced in, in one
// copy; none for a GET or DELETE.
func (a *requestActor) body(seed *uint64, extra ...openai.Edit) []byte {
	if a.retrieval() {
		return nil
	}
	a.rewrites++
	return a.ex.Req.Object.With(append(a.edits(seed), extra...)...)
}

// edits are what an attempt changes in the client's body: the model (the
// served id) and the key's cache_salt (as ex.Salt says); on completions
// and chat also, for a cascade step that is not the last, logprobs forced
// on, the seed a prefill leg was sent (seed not nil), and for a stream the
// ask for its usage chunk.
func (a *requestActor) edits(seed *uint64) []openai.Edit {
	req := &a.ex.Req
	edits := make([]openai.Edit, 0, 6)
	edits = append(edits, openai.SetString("model", a.target.ServedModel))
	if a.saltAdded() {
		edits = append(edits, openai.SetString("cache_salt", req.CacheSalt))
	}
	if !a.dialect.Completions() {
		return edits
	}
	if a.target.CascadeStep < a.target.CascadeSteps-1 && !req.Stream {
		if e, ok := req.Object.ForceLogprobs(req.Chat, openai.LeastLogprobs(a.target.Worker.Kind)); ok {
			edits = append(edits, e)
		}
	}
	if seed != nil {
		edits = append(edits, openai.SetUint("seed", *seed))
	}
	if req.Stream {
		if e, ok := req.Object.AskUsage(); ok {
			edits = append(edits, e)
		}
	}
	return edits
}

// saltAdded reports whether the body carries the request's cache_salt in
// place of what the client sent, as ex.Salt says.
func (a *requestActor) saltAdded() bool {
	switch a.ex.Salt {
	case SaltReplace:
		return true
	case SaltAdd:
		return !a.ex.Req.Endpoint.Tokenizer() && openai.TakesCacheSalt(a.target.Worker.Kind)
	}
	return false
}
