package request

import (
	"context"
	"errors"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/internal/wire/tokenize"
)

// Tokenizer gets a prompt's tokens as an engine tokenizes them, for
// routing on the engines' KV cache events (a tokenize.Client).
type Tokenizer interface {
	// Lookup answers from what is kept, without asking anyone.
	Lookup(req tokenize.Request) (tokens []uint32, kind string, refresh bool)
	// Tokenize asks the tokenizer, within ctx.
	Tokenize(ctx context.Context, req tokenize.Request) ([]uint32, error)
	// Refresh tokenizes req off the request's path, within timeout.
	Refresh(req tokenize.Request, timeout time.Duration) bool
}

// Outcomes of a tokenization for routing (Deps.OnTokenized).
const (
	TokenizedOK      = "ok"
	TokenizedCached  = "cached"
	TokenizedTimeout = "timeout"
	TokenizedError   = "error"
)

// tokensFor is a tokenization's outcome, for base model base.
type tokensFor struct {
	base string
	ids  []uint32
	err  error
	took time.Duration
}

// refreshTimeout bounds a tokenization run off a request's path.
const refreshTimeout = 10 * time.Second

// needTokens answers the router's request for the prompt's tokens: from
// what the tokenizer keeps at once, else from the tokenizer within
// Deps.TokenizeTimeout, off the mailbox; then the request routes again
// (on the prefix index when no tokens came in time).
func (a *requestActor) needTokens(ctx actor.Context, nt *router.NeedTokensError) {
	if a.tokens == nil {
		a.tokens, a.noTokens = map[string][]uint32{}, map[string]bool{}
	}
	url := nt.URL
	if url == "" {
		scheme := a.d.Scheme
		if scheme == "" {
			scheme = "http"
		}
		url = scheme + "://" + nt.Worker
	}
	// Read once: a miss is looked up, then tokenized. The body is the one
	// the edge's parser validated.
	tr := tokenize.Read(tokenize.Request{URL: url, Model: nt.Model, Chat: a.ex.Req.Chat, Body: a.ex.Req.Object.Bytes(), Valid: true})
	if ids, kind, refresh := a.d.Tokenizer.Lookup(tr); kind != tokenize.Miss {
		a.tokenCache(kind)
		a.tokenized(TokenizedCached, 0)
		if refresh {
			a.d.Tokenizer.Refresh(tr, refreshTimeout)
		}
		a.tokens[nt.Base] = ids
		if kind == tokenize.Prefix {
			if a.partial == nil {
				a.partial = map[string]bool{}
			}
			a.partial[nt.Base] = true
		}
		a.route(ctx)
		return
	}
	a.tokenCache(tokenize.Miss)
	self, root, tok := ctx.Self(), ctx.ActorSystem().Root, a.d.Tokenizer
	tctx, cancel := context.WithTimeout(a.ex.Ctx, a.d.TokenizeTimeout)
	start := time.Now()
	var ids []uint32
	var err error
	a.ex.spawn(func() {
		defer cancel()
		ids, err = tok.Tokenize(tctx, tr)
		if err == nil && tctx.Err() != nil {
			err = tctx.Err()
		}
	}, func() {
		root.Send(self, &tokensFor{base: nt.Base, ids: ids, err: err, took: time.Since(start)})
	})
}

// onTokens routes again with the tokens, or without them.
func (a *requestActor) onTokens(ctx actor.Context, m *tokensFor) {
	switch {
	case m.err == nil:
		a.tokenized(TokenizedOK, m.took)
		a.tokens[m.base] = m.ids
	case errors.Is(m.err, context.DeadlineExceeded):
		a.tokenized(TokenizedTimeout, m.took)
		a.noTokens[m.base] = true
	default:
		a.tokenized(TokenizedError, m.took)
		a.noTokens[m.base] = true
	}
	a.route(ctx)
}

func (a *requestActor) tokenized(outcome string, d time.Duration) {
	if a.d.OnTokenized != nil {
		a.d.OnTokenized(outcome, d)
	}
}

func (a *requestActor) tokenCache(kind string) {
	if a.d.OnTokenCache != nil {
		a.d.OnTokenCache(kind)
	}
}

// noAsk reports whether the router may not ask this request for tokens:
// no tokenizer, an API whose body is no chat or completions request, or a
// chat with media, whose tokens would not name the engines' blocks
// (openai.Request.HasMedia): it is routed on the prefix index.
func (a *requestActor) noAsk() bool {
	if a.d.Tokenizer == nil || !a.dialect.Completions() {
		return true
	}
	if a.media == 0 {
		a.media = 1
		if a.ex.Req.HasMedia() {
			a.media = 2
		}
	}
	return a.media == 2
}
