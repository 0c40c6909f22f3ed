package gateway

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"testing/synctest"
	"time"
)

// TestHandlersWait: wait returns at once with no handler running, waits
// for a running one to return, and gives up after its limit when one does
// not.
func TestHandlersWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHandlers()
		if !h.wait(time.Second) {
			t.Fatal("wait with no handler running: false")
		}
		release := make(chan struct{})
		entered := make(chan struct{})
		srv := h.wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
			close(entered)
			<-release
		}))
		go srv.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
		<-entered
		start := time.Now()
		if h.wait(3 * time.Second) {
			t.Fatal("wait with a handler running: true")
		}
		if d := time.Since(start); d != 3*time.Second {
			t.Fatalf("wait gave up after %v, want its limit 3s", d)
		}
		go func() {
			time.Sleep(time.Second)
			close(release)
		}()
		start = time.Now()
		if !h.wait(time.Minute) {
			t.Fatal("wait for a handler that returns: false")
		}
		if d := time.Since(start); d != time.Second {
			t.Fatalf("wait returned after %v, want 1s, when the handler returned", d)
		}
	})
}
