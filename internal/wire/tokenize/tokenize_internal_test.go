package tokenize

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestTokenizeMergesIdenticalCalls: a burst of requests with the same
// prompt for the same endpoint makes one /tokenize call, whose tokens each
// of them gets.
func TestTokenizeMergesIdenticalCalls(t *testing.T) {
	var calls atomic.Int32
	const n = 16
	arrived, release := make(chan struct{}, n), make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		arrived <- struct{}{}
		<-release
		_, _ = w.Write([]byte(`{"tokens":[7,8,9],"count":3,"max_model_len":8192}`))
	}))
	defer srv.Close()
	c := New(Options{CacheTokens: 1 << 10})
	defer c.Close()
	req := Request{URL: srv.URL, Model: "m", Body: []byte(`{"prompt":"the same prompt"}`)}
	var wg sync.WaitGroup
	errs := make(chan error, n)
	ask := func() {
		defer wg.Done()
		toks, err := c.Tokenize(context.Background(), req)
		if err == nil && len(toks) != 3 {
			t.Errorf("tokens %v", toks)
		}
		errs <- err
	}
	wg.Add(n)
	go ask()
	<-arrived // the first call is in flight
	for range n - 1 {
		go ask()
	}
	// Until every other request waits for the first call (or, merging
	// nothing, makes a call of its own).
	for joined := 0; joined < n-1 && calls.Load() == 1; time.Sleep(time.Millisecond) {
		c.mu.Lock()
		for _, f := range c.flights {
			joined = f.joined
		}
		c.mu.Unlock()
	}
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if got := calls.Load(); got != 1 {
		t.Fatalf("%d requests of one prompt made %d calls, want 1", n, got)
	}
}

// TestCacheCountsEntryOverhead: CacheTokens bounds memory, not token ids:
// short prompts are held at most CacheTokens/(EntryOverhead+their length)
// at once.
func TestCacheCountsEntryOverhead(t *testing.T) {
	const fit = 10
	c := New(Options{CacheTokens: fit * (EntryOverhead + 2)})
	defer c.Close()
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range 1000 {
		c.put("m", uint64(i), []uint32{1, uint32(i)})
	}
	if n := c.lru.Len(); n > fit {
		t.Fatalf("%d prompts of 2 tokens held under a bound of %d tokens, want at most %d", n, c.o.CacheTokens, fit)
	}
	if c.lru.Len() == 0 {
		t.Fatal("none held")
	}
}
