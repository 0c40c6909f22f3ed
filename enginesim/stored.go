package enginesim

import (
	"sync"

	"github.com/tlgate/tlgate/enginesim/tokenizer"
)

// maxStoredResponses bounds the responses an engine keeps (oldest first
// out), as vLLM's in-memory store is bounded by the engine's memory.
const maxStoredResponses = 4096

// storedResponse is a Responses API response kept in the engine's memory:
// its answer, and the conversation a follow-up continues (the input
// messages and the answer's).
type storedResponse struct {
	body []byte
	conv []tokenizer.Message
}

// responseStore is the engine's store of responses (store: true).
type responseStore struct {
	mu    sync.Mutex
	byID  map[string]*storedResponse
	order []string
}

func (s *responseStore) put(id string, r *storedResponse) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.byID == nil {
		s.byID = map[string]*storedResponse{}
	}
	if _, ok := s.byID[id]; !ok {
		s.order = append(s.order, id)
	}
	s.byID[id] = r
	for len(s.order) > maxStoredResponses {
		delete(s.byID, s.order[0])
		s.order = s.order[1:]
	}
}

func (s *responseStore) get(id string) (*storedResponse, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.byID[id]
	return r, ok
}

func (s *responseStore) remove(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.byID[id]; !ok {
		return false
	}
	delete(s.byID, id)
	for i, x := range s.order {
		if x == id {
			s.order = append(s.order[:i], s.order[i+1:]...)
			break
		}
	}
	return true
}
