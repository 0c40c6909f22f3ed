package gateway

import (
	"net/http"
	"sync"
	"time"
)

// handlers counts the HTTP handlers running, so that a stop which cuts
// the server off (http.Server.Close returns while handlers still run) can
// wait for them before it stops the actors they wait on. A handler cut off
// that way sees its client gone and its request actor answers at once; one
// left waiting on an actor system already shut down would wait forever.
type handlers struct {
	mu   sync.Mutex
	n    int
	idle chan struct{} // closed while n == 0; replaced when n leaves 0
}

func newHandlers() *handlers {
	h := &handlers{idle: make(chan struct{})}
	close(h.idle)
	return h
}

// wrap counts next's calls.
func (h *handlers) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.enter()
		defer h.leave()
		next.ServeHTTP(w, r)
	})
}

func (h *handlers) enter() {
	h.mu.Lock()
	if h.n == 0 {
		h.idle = make(chan struct{})
	}
	h.n++
	h.mu.Unlock()
}

func (h *handlers) leave() {
	h.mu.Lock()
	h.n--
	if h.n == 0 {
		close(h.idle)
	}
	h.mu.Unlock()
}

// wait returns true once no handler runs, or false after limit.
func (h *handlers) wait(limit time.Duration) bool {
	h.mu.Lock()
	idle := h.idle
	h.mu.Unlock()
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case <-idle:
		return true
	case <-t.C:
		return false
	}
}

// handlersCutOffWait bounds the wait for handlers cut off by a forced stop.
const handlersCutOffWait = 10 * time.Second
