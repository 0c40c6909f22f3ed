package router

import (
	"slices"
	"time"

	"github.com/tlgate/tlgate/internal/routing/fleet"
	"github.com/tlgate/tlgate/internal/routing/policy"
)

// Protocol is the disaggregation protocol of a pair (fleet.Protocol); ""
// for a target that is not a pair.
func (t Target) Protocol() fleet.Protocol {
	if t.Prefill == nil {
		return ""
	}
	p, _ := t.Prefill.Protocol()
	return p
}

// pickPair picks a disaggregated pair of model's workers for req into t: a
// prefill worker (t.Prefill) and a decode worker (t.Worker) that speak the
// same protocol (fleet.Pairs: heartbeating workers of one kv_format, or
// probed engines of one kind), never two that do not.
//
// The prompt's KV is computed, and cached, on the prefill worker, so that
// one is picked first, among those with a decode partner: the one that
// req.KeepPrefill names when it is a candidate (it holds the prompt's KV
// for the request), else by cache_aware under that policy (the prompt is
// indexed there), by affinity under affinity, and the least loaded
// otherwise. The decode worker is then picked among its partners by load
// (policy.DecodeByLoad: running sequences, free KV).
func (s *State) pickPair(t *Target, model string, req *Request, now time.Time) error {
	keys := s.decodeKeys(model, req, now)
	if len(keys) == 0 {
		return ErrNoCapacity
	}
	p, ok := s.candidates(s.cfg.Policy, model, fleet.RolePrefill, req, now, func(w *fleet.Worker) bool {
		k, ok := fleet.PairKeyOf(w)
		return ok && slices.Contains(keys, k)
	})
	if !ok {
		return ErrNoCapacity
	}
	i, reason := -1, ""
	if req.KeepPrefill != "" {
		for j, m := range s.members {
			if m.ID == req.KeepPrefill {
				i, reason = j, policy.ReasonKept
				break
			}
		}
	}
	pol := s.cfg.Policy
	if i < 0 {
		switch pol {
		case policy.NameCacheAware:
			i, reason = s.pickCacheAware(t, model, req, now)
		case policy.NameAffinity:
			i, reason = policy.Affinity(p.ring, req.PrefixKey, s.cands, s.cfg.LoadFactor)
		default:
			pol = policy.NameLeastOutstanding
			i, reason = policy.LeastOutstanding(s.cands), policy.ReasonLeastOutstanding
		}
	}
	if i < 0 {
		return ErrNoCapacity
	}
	pw := *s.members[i]
	t.Prefill, t.Reason, t.PrefillReason, t.Policy = &pw, reason, reason, string(pol)
	if reason == policy.ReasonKept {
		t.Indexing = Indexing{} // nothing new is computed there
	}
	return s.pickDecode(t, model, req, now)
}

// decodeKeys returns what the routable decode workers of model that may
// take req pair with (fleet.PairKeyOf), each once.
func (s *State) decodeKeys(model string, req *Request, now time.Time) []fleet.PairKey {
	if _, ok := s.candidates("", model, fleet.RoleDecode, req, now, nil); !ok {
		return nil
	}
	var keys []fleet.PairKey
	for _, w := range s.members {
		if k, ok := fleet.PairKeyOf(w); ok && !slices.Contains(keys, k) {
			keys = append(keys, k)
		}
	}
	return keys
}

// pickDecode picks t.Prefill's decode partner by load into t.Worker.
func (s *State) pickDecode(t *Target, model string, req *Request, now time.Time) error {
	pw := t.Prefill
	if _, ok := s.candidates("", model, fleet.RoleDecode, req, now, func(w *fleet.Worker) bool { return fleet.Pairs(pw, w) }); !ok {
		return ErrNoCapacity
	}
	s.dcands = s.dcands[:0]
	for i, c := range s.cands {
		w := s.members[i]
		s.dcands = append(s.dcands, policy.DecodeCandidate{Candidate: c, Running: slotLoad(s.loads[i]), FreeKV: w.KVFreeBlocks, TotalKV: w.KVTotalBlocks})
	}
	i, reason := policy.DecodeByLoad(s.dcands)
	if i < 0 {
		return ErrNoCapacity
	}
	t.Worker, t.DecodeReason, t.Candidates = *s.members[i], reason, len(s.cands)
	return nil
}
