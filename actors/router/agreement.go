package router

import "github.com/tlgate/tlgate/internal/routing/policy"

// Agreement: tokenizing a request costs its pick the tokenizer's round
// trip (about a millisecond for a 512-token prompt, more for longer ones),
// and where caches hold what the prefix index believes they hold, the
// exact view picks the worker the index would have picked anyway, or one
// as good. So a pick on the exact view is checked against the pick the
// prefix index alone would have made, per base model: it agrees when the
// index would have picked the same worker, or one that costs at most a
// request's load and a block more on what the exact pick saw, and it
// believed the worker it would have picked to hold no more of the prompt
// than the exact view saw there, within the same tolerance and a chunk of
// its own. Only picks on the whole prompt's tokens are checked (not on a
// conversation's earlier turn's alone: Request.Partial), and only of
// prompts one of the views believes partly cached somewhere. While the index agreed with at
// least Config.IndexAgreement of the last AgreementChecks checks, requests
// of that model are routed on the index without being tokenized, except
// one in Config.AgreementSample, which is still tokenized and picked on
// the exact view, to keep checking. One disagreement too many, and every
// request is tokenized again. A view never claims a hit from the index: a
// pick made so is an approximate one (its CacheView is ViewAgreed), as if
// the engines published nothing.

// AgreementChecks is how many of a model's latest exact picks the
// agreement is measured over.
const AgreementChecks = 64

// DefaultAgreementSample is Config.AgreementSample's default.
const DefaultAgreementSample = 8

// ViewAgreed is the CacheView of a pick made on the prefix index because
// it agreed with the exact view lately (the request was not tokenized).
const ViewAgreed = "agreed"

// agreement is one base model's latest checks.
type agreement struct {
	checks [AgreementChecks]bool // a ring; true: the index agreed
	n      int                   // checks made, at most AgreementChecks
	next   int                   // the ring's next slot
	agreed int                   // true checks in the ring
	// skipped counts requests routed on the index since the last sample.
	skipped int
}

// record adds a check.
func (a *agreement) record(agreed bool) {
	if a.n == AgreementChecks && a.checks[a.next] {
		a.agreed--
	}
	a.checks[a.next] = agreed
	if agreed {
		a.agreed++
	}
	a.next = (a.next + 1) % AgreementChecks
	a.n = min(a.n+1, AgreementChecks)
}

// trusted reports whether the index agreed with at least share of the
// last AgreementChecks checks (share 0: never).
func (a *agreement) trusted(share float64) bool {
	return share > 0 && a.n == AgreementChecks && float64(a.agreed) >= share*AgreementChecks
}

// skipTokens reports whether a request of base model, which brings no
// tokens and may be asked for them, routes on the prefix index instead:
// the index agrees lately and the request is not the sample. The answer is
// kept in req.Keys, so that every Route of one request (dispatch scans,
// failover) decides alike and counts once.
func (s *State) skipTokens(base string, req *Request) bool {
	if req.Keys != nil {
		if skip, ok := req.Keys.skip[base]; ok {
			return skip
		}
	}
	skip := false
	if a := s.agreements[base]; a != nil && a.trusted(s.cfg.IndexAgreement) {
		sample := s.cfg.AgreementSample
		if sample <= 0 {
			sample = DefaultAgreementSample
		}
		a.skipped++
		if skip = a.skipped < sample; !skip {
			a.skipped = 0
		}
	}
	if req.Keys != nil {
		if req.Keys.skip == nil {
			req.Keys.skip = map[string]bool{}
		}
		req.Keys.skip[base] = skip
	}
	return skip
}

// checkAgreement records, once per request, whether the prefix index
// alone would have picked s.cands[picked], or a worker that costs no more
// than agreementTolerance beyond it on what the pick saw, and believed its
// own pick to hold no more than agreementTolerance beyond what the pick
// saw there (overclaim), the pick on the exact view of a request of base
// model, of prompt tokens (the index estimating est);
// s.prefix.indexOnly[i] is what candidate i would prefill by the index
// alone, s.prefix.prefill[i] what it prefills by the pick. A prompt neither
// view believes cached anywhere is no check: most requests of a workload
// under eviction are such, and both views pick them alike by load, while
// the index is wrong about the others.
func (s *State) checkAgreement(base string, req *Request, picked, prompt, est int) {
	if s.cfg.IndexAgreement <= 0 {
		return
	}
	if req.Keys != nil {
		if req.Keys.checked[base] {
			return
		}
		if req.Keys.checked == nil {
			req.Keys.checked = map[string]bool{}
		}
		req.Keys.checked[base] = true
	}
	ca := s.prefix
	cached := false // does either view believe some of the prompt is cached?
	for i := range s.cands {
		cached = cached || ca.indexOnly[i] < est || ca.prefill[i] < prompt
	}
	if !cached {
		// Neither view knows any of the prompt: both pick by load alike,
		// which says nothing of whether the index knows what is cached.
		return
	}
	j, _ := policy.CacheAware(s.cands, ca.indexOnly, ca.cfg)
	agreed := (j == picked || s.regret(j, picked) <= s.agreementTolerance(picked)) &&
		s.overclaim(j, prompt, est) <= s.agreementTolerance(j)+s.chunkTolerance(prompt, est)
	a := s.agreements[base]
	if a == nil {
		if s.agreements == nil {
			s.agreements = map[string]*agreement{}
		}
		a = &agreement{}
		s.agreements[base] = a
	}
	a.record(agreed)
	if s.cfg.Observe.OnAgreement != nil {
		s.cfg.Observe.OnAgreement(base, agreed)
	}
}

// regret is what picking candidate j instead of picked costs, by the
// policy's cost (policy.CacheAware) on what the pick saw (the exact
// views): the prompt tokens j would prefill beyond picked's, and the load
// it carries beyond picked's, weighed.
func (s *State) regret(j, picked int) float64 {
	ca := s.prefix
	return ca.cfg.Cost(ca.prefill[j], s.cands[j].Load) - ca.cfg.Cost(ca.prefill[picked], s.cands[picked].Load)
}

// overclaim is by how much more the prefix index believes candidate j
// holds of the prompt than what the pick saw there (the exact view, where
// j's is usable), weighed as policy.CacheAware weighs prefill: the index's
// estimate is in its own tokens (est for the whole prompt), scaled to the
// prompt's. An index that believes a prompt cached where the engine
// evicted it can still pick as the exact view does, where the events see
// the prompt cached nowhere and every worker is as good; it is wrong all
// the same, and its next picks will send requests after hits that are not
// there.
func (s *State) overclaim(j, prompt, est int) float64 {
	ca := s.prefix
	if est <= 0 {
		return 0
	}
	believed := float64(est-ca.indexOnly[j]) * float64(prompt) / float64(est)
	seen := float64(prompt - ca.prefill[j])
	return ca.cfg.PrefillWeight * max(0, believed-seen)
}

// chunkTolerance is a chunk of the prefix index's, weighed as prefill in
// the prompt's tokens: the index counts what a worker holds in whole
// chunks, so its belief is that coarse.
func (s *State) chunkTolerance(prompt, est int) float64 {
	ca := s.prefix
	if est <= 0 {
		return 0
	}
	chunk := ca.index.Tokens(ca.index.Config().ChunkBytes)
	return ca.cfg.PrefillWeight * float64(chunk) * float64(prompt) / float64(est)
}

// agreementTolerance is the regret at which the index's pick still agrees
// with the exact one: a request's slot of load and a block of the picked
// worker's prompt (the views estimate a prompt in blocks of their own, and
// close costs tip either way between equally good workers).
func (s *State) agreementTolerance(picked int) float64 {
	ca := s.prefix
	bs := s.exactBlockSize(s.cands[picked].ID, s.members[picked].KVBlockTokens)
	return ca.cfg.LoadWeight + ca.cfg.PrefillWeight*float64(bs)
}
