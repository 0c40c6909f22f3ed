package enginesim

import (
	"bytes"
	"context"
	"slices"
	"time"

	"github.com/tlgate/tlgate/enginesim/toymodel"
)

// Finish reasons.
const (
	finishLength = "length"
	finishStop   = "stop"
)

// step is one generated token as the client sees it. The engine reuses it:
// emit must not keep it.
type step struct {
	index   int
	token   uint32
	piece   string
	logprob float64
	top     []toymodel.Candidate // the most likely tokens, if asked for
	delta   string               // text to show now (stop strings held back)
	offset  int                  // offset of delta in the completion text
	finish  string               // "" until the last token
	topBuf  [maxTopLogprobs]toymodel.Candidate
}

// result sums up a generation.
type result struct {
	promptTokens, completionTokens int
	cached                         int
	finish                         string
	// first is the first token sampled and draws the PCG32 draws it took.
	first toymodel.Candidate
	draws uint64
	// kept are the prompt's blocks, when the request asked to keep them
	// (genRequest.keepPrompt) and succeeded: the caller owns them.
	kept blockSet
}

// generate admits the request, runs prefill (or adopts the resumed handle's
// KV) and decodes, calling emit for every token. The sequence's blocks are
// freed when it returns, also on error.
func (e *Engine) generate(ctx context.Context, r *genRequest, h *handle, emit func(*step) error) (res result, err error) {
	res.promptTokens = len(r.prompt)
	if h == nil {
		if hk := e.cfg.hooks; hk != nil && hk.prefilled != nil {
			hk.prefilled(r.prompt)
		}
	}
	// wait blocks until token i may be sampled: the flat mode sleeps the
	// prefill (i == 0) or a decode time, the step mode waits for the step
	// that computes it.
	var wait func(i int) error
	// accept tells the step scheduler the token sampled (done: the last).
	accept := func(uint32, bool) {}
	if sched := e.core.sched; sched != nil {
		q := &stepSeq{tokens: slices.Clone(r.prompt), promptLen: len(r.prompt), maxTokens: r.maxTokens, lora: r.lora, salt: r.cacheSalt,
			keepPrompt: r.keepPrompt}
		if err := e.api.request(ctx); err != nil {
			e.core.drop(h) // submit would have taken it
			return res, err
		}
		if err := sched.submit(q, h); err != nil {
			return res, err
		}
		finished := false
		defer func() {
			if !finished {
				sched.abort(q)
			}
		}()
		wait = func(i int) error {
			if err := sched.next(ctx, q); err != nil {
				return err
			}
			if i == 0 {
				res.cached = q.cached
			}
			return nil
		}
		accept = func(token uint32, done bool) {
			finished = done
			sched.accept(q, token, done)
			if done && r.keepPrompt {
				res.kept = sched.takeBlocks(q)
			}
		}
	} else {
		s, aerr := e.admitFlat(ctx, r, h)
		if aerr != nil {
			return res, aerr
		}
		defer func() {
			if r.keepPrompt && res.finish != "" {
				res.kept = e.core.finishKeeping(s, len(r.prompt))
				return
			}
			e.core.finish(s)
		}()
		res.cached = s.cached
		last := time.Now()
		wait = func(i int) error {
			var err error
			switch {
			case i > 0:
				err = sleepCtx(ctx, e.cfg.DecodePerToken)
			case h == nil:
				err = sleepCtx(ctx, time.Duration(len(r.prompt)-s.cached)*e.cfg.PrefillPerToken)
			}
			now := time.Now()
			e.latency.observe(i == 0, now.Sub(last))
			last = now
			return err
		}
	}

	g := e.model.NewGenerator(r.prompt, r.seed, r.params)
	maxStop := 0
	for _, st := range r.stop {
		maxStop = max(maxStop, len(st))
	}
	text := make([]byte, 0, 5*r.maxTokens)
	sent := 0
	var st step
	defer func() {
		e.core.count(func(c *counters) {
			c.promptTokens += uint64(res.promptTokens)
			c.generationTokens += uint64(res.completionTokens)
			switch res.finish {
			case finishLength:
				c.finishedLength++
			case finishStop:
				c.finishedStop++
			}
		})
	}()
	for i := range r.maxTokens {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		if err := wait(i); err != nil {
			return res, err
		}
		d := g.Dist()
		var c toymodel.Candidate
		if i == 0 && h != nil && !h.sampleFirst {
			g.Skip(h.header.RngDrawsConsumed)
			var ok bool
			if c, ok = d.Find(h.header.FirstToken); !ok {
				c = toymodel.Candidate{Token: h.header.FirstToken, Logprob: float64(h.header.FirstLogprob)}
			}
		} else {
			c = g.Sample()
		}
		st.top = nil
		if r.logprobs && r.topLogprobs > 0 {
			st.top = st.topBuf[:copy(st.topBuf[:r.topLogprobs], d.Cands)]
		}
		g.Accept(c.Token)
		if i == 0 {
			res.first, res.draws = c, g.Draws()
		}
		res.completionTokens++
		e.sampled.Add(1)

		st.index, st.token, st.logprob = i, c.Token, c.Logprob
		st.piece = e.tok.Piece(c.Token)
		prevLen := len(text)
		text = append(text, st.piece...)
		end := len(text)
		st.finish = ""
		if maxStop > 0 {
			if p := firstStop(text, max(0, prevLen-maxStop+1), r.stop); p >= 0 {
				text, end, st.finish = text[:p], p, finishStop
			} else {
				end = max(sent, len(text)-(maxStop-1))
			}
		}
		if st.finish == "" && i == r.maxTokens-1 {
			st.finish, end = finishLength, len(text)
		}
		st.delta, st.offset = string(text[sent:end]), sent
		sent = end
		res.finish = st.finish
		accept(c.Token, st.finish != "")
		if err := e.api.token(ctx); err != nil {
			return res, err
		}
		if err := emit(&st); err != nil {
			return res, err
		}
		if st.finish != "" {
			break
		}
	}
	return res, nil
}

// admitFlat admits a request in the flat mode: a running slot and every
// block it may need (prompt and max_tokens), first come, first served.
func (e *Engine) admitFlat(ctx context.Context, r *genRequest, h *handle) (*seq, error) {
	need := blockCount(len(r.prompt) + r.maxTokens)
	a := &admission{handle: h}
	if h == nil {
		// cache_salt is vLLM's cache namespace: blocks are shared only
		// within the salt; an adapter's blocks only within the adapter.
		a.want.blocks = e.hash.blocks(r.prompt, r.lora, r.cacheSalt)
		a.want.private = need - len(a.want.blocks)
		a.promptLen = len(r.prompt)
	} else {
		a.want.private = max(0, need-h.blocks.size())
	}
	return e.core.admit(ctx, a)
}

// firstStop returns where the earliest stop string starting at or after
// from begins in text, or -1.
func firstStop(text []byte, from int, stops []string) int {
	best := -1
	for _, s := range stops {
		if i := bytes.Index(text[from:], []byte(s)); i >= 0 && (best < 0 || from+i < best) {
			best = from + i
		}
	}
	return best
}

// sleepCtx waits d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
