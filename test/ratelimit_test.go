package test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/guard/ratelimit"
	"github.com/tlgate/tlgate/internal/runtime/gateway"
)

// fakeClock is the rate limiter's clock: it moves only when the test says,
// so no limit refills while requests travel.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)} }

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// limitedCluster is a gateway on clk with keys alice (limited by lim),
// bob (unlimited) and carol (max_concurrent = 1).
func limitedCluster(t *testing.T, clk *fakeClock, lim config.APIKey, reg *prometheus.Registry, logTo io.Writer, engines ...enginesim.Config) *cluster {
	t.Helper()
	lim.Name, lim.Key, lim.Scopes = "alice", "key-alice", []string{"inference"}
	keys := withKeys(lim,
		config.APIKey{Name: "bob", Key: "key-bob", Scopes: []string{"inference"}},
		config.APIKey{Name: "carol", Key: "key-carol", Scopes: []string{"inference"}, MaxConcurrent: 1},
	)
	return newClusterGateway(t, "", []clusterOpt{keys}, nil, func(o *gateway.Options) {
		o.Now = clk.now
		if reg != nil {
			o.Registry, o.Gatherer = reg, reg
		}
		if logTo != nil {
			o.Logger = zerolog.New(logTo)
		}
	}, engines...)
}

// withLimitedKey adds the key "limited" (key-limited): one request and
// 1000 tokens per minute.
func withLimitedKey() clusterOpt {
	return func(c *config.Config) {
		c.Gateway.APIKeys = append(c.Gateway.APIKeys, config.APIKey{Name: "limited", Key: "key-limited",
			Scopes: []string{"inference"}, RequestsPerMinute: 1, TokensPerMinute: 1000})
	}
}

// wantHeaders checks the x-ratelimit-* headers of an answer.
func wantHeaders(t *testing.T, what string, h http.Header, want map[string]string) {
	t.Helper()
	for k, v := range want {
		if got := h.Get(k); got != v {
			t.Fatalf("%s: %s = %q, want %q (headers %v)", what, k, got, v, h)
		}
	}
}

func TestRateLimitRequests(t *testing.T) {
	clk := newFakeClock()
	c := limitedCluster(t, clk, config.APIKey{RequestsPerMinute: 3}, nil, nil, enginesim.Config{ID: "w1", Model: "m"})
	body := func(stream bool) map[string]any {
		return map[string]any{"model": "m", "prompt": "hello", "max_tokens": 2, "stream": stream}
	}

	// Three at once: the bucket of 3 empties, one more each 20 s. The
	// streamed answer carries the headers as well.
	for i, stream := range []bool{false, true, false} {
		r := c.post("/v1/completions", "key-alice", body(stream))
		if r.status != http.StatusOK {
			t.Fatalf("request %d: %d %s", i, r.status, r.body)
		}
		wantHeaders(t, fmt.Sprintf("request %d", i), r.header, map[string]string{
			ratelimit.HeaderLimitRequests: "3", ratelimit.HeaderRemainingRequests: strconv.Itoa(2 - i),
			ratelimit.HeaderResetRequests: (time.Duration(i+1) * 20 * time.Second).String(),
			ratelimit.HeaderLimitTokens:   "", ratelimit.HeaderRetryAfter: "",
		})
	}

	// The fourth, read by OpenAI's Go client: 429 rate_limit_exceeded.
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	client := openai.NewClient(option.WithBaseURL(c.url+"/v1/"), option.WithAPIKey("key-alice"),
		option.WithHTTPClient(&http.Client{Transport: tr}), option.WithMaxRetries(0))
	params := openai.CompletionNewParams{Model: "m", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("hello")}, MaxTokens: openai.Int(2)}
	_, err := client.Completions.New(context.Background(), params)
	apiErr, ok := errors.AsType[*openai.Error](err)
	if !ok || apiErr.StatusCode != http.StatusTooManyRequests || apiErr.Code != "rate_limit_exceeded" || apiErr.Type != "rate_limit_error" ||
		!strings.Contains(apiErr.Message, "requests per minute") {
		t.Fatalf("fourth request: %v", err)
	}
	wantHeaders(t, "refused", apiErr.Response.Header, map[string]string{
		ratelimit.HeaderRemainingRequests: "0", ratelimit.HeaderResetRequests: "1m0s",
		ratelimit.HeaderRetryAfter: "20", ratelimit.HeaderRetryAfterMs: "20000",
	})

	// Another key is not affected and carries no x-ratelimit headers.
	r := c.post("/v1/completions", "key-bob", body(false))
	if r.status != http.StatusOK || r.header.Get(ratelimit.HeaderLimitRequests) != "" {
		t.Fatalf("bob: %d %v", r.status, r.header)
	}

	// 20 s later one request is back; the Go client reads its headers.
	clk.add(20 * time.Second)
	var raw *http.Response
	if _, err := client.Completions.New(context.Background(), params, option.WithResponseInto(&raw)); err != nil {
		t.Fatalf("after the refill: %v", err)
	}
	wantHeaders(t, "after the refill", raw.Header, map[string]string{
		ratelimit.HeaderLimitRequests: "3", ratelimit.HeaderRemainingRequests: "0", ratelimit.HeaderResetRequests: "1m0s",
	})
	if r := c.post("/v1/completions", "key-alice", body(false)); r.status != http.StatusTooManyRequests || errorCode(t, r.body) != "rate_limit_exceeded" {
		t.Fatalf("over again: %d %s", r.status, r.body)
	}
}

func TestRateLimitConcurrent(t *testing.T) {
	clk := newFakeClock()
	c := limitedCluster(t, clk, config.APIKey{}, nil, nil)
	arrived, release := make(chan struct{}, 4), make(chan struct{})
	c.addFake("h1", "held", func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[{"index":0,"text":"ok","finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
	})
	body := map[string]any{"model": "held", "prompt": "x"}
	first := make(chan reply, 1)
	go func() { first <- c.post("/v1/completions", "key-carol", body) }()
	select {
	case <-arrived:
	case <-time.After(10 * time.Second):
		t.Fatal("the first request never reached the engine")
	}
	r := c.post("/v1/completions", "key-carol", body)
	if r.status != http.StatusTooManyRequests || errorCode(t, r.body) != "rate_limit_exceeded" ||
		!strings.Contains(string(r.body), "concurrent") || r.header.Get("Retry-After") != "1" {
		t.Fatalf("second concurrent request: %d %v %s", r.status, r.header, r.body)
	}
	close(release)
	if r := <-first; r.status != http.StatusOK {
		t.Fatalf("first request: %d %s", r.status, r.body)
	}
	// The slot is freed once the edge has finished with the first request.
	eventually(t, 10*time.Second, func() bool {
		return c.post("/v1/completions", "key-carol", body).status == http.StatusOK
	}, "carol's slot to be freed")
}

// usageOf reads the usage object of a non-streamed answer.
func usageOf(t *testing.T, b []byte) (prompt, completion int) {
	t.Helper()
	var v struct {
		Usage *struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(b, &v); err != nil || v.Usage == nil {
		t.Fatalf("no usage in %s", b)
	}
	return v.Usage.PromptTokens, v.Usage.CompletionTokens
}

func TestRateLimitTokens(t *testing.T) {
	clk := newFakeClock()
	reg := prometheus.NewRegistry()
	c := limitedCluster(t, clk, config.APIKey{TokensPerMinute: 100}, reg, nil, enginesim.Config{ID: "w1", Model: "m"})
	perToken := time.Minute / 100

	// A full bucket admits and reserves the prompt's estimate ("hello
	// there": 3 tokens) plus max_tokens; the answer's usage replaces the
	// reservation when it ends.
	r := c.post("/v1/completions", "key-alice", map[string]any{"model": "m", "prompt": "hello there", "max_tokens": 50})
	if r.status != http.StatusOK {
		t.Fatalf("first: %d %s", r.status, r.body)
	}
	wantHeaders(t, "first", r.header, map[string]string{
		ratelimit.HeaderLimitTokens: "100", ratelimit.HeaderRemainingTokens: "47", ratelimit.HeaderResetTokens: ratelimit.FormatReset(53 * perToken),
		ratelimit.HeaderLimitRequests: "",
	})
	p, n := usageOf(t, r.body)
	if n != 50 || p <= 0 {
		t.Fatalf("usage %d + %d", p, n)
	}
	waitKeyRequests(t, reg, "alice", 1) // settled once the edge is done

	// 100 - (p + 50) left: a reservation of 53 is refused until it fits.
	r = c.post("/v1/completions", "key-alice", map[string]any{"model": "m", "prompt": "hello there", "max_tokens": 50})
	if r.status != http.StatusTooManyRequests || errorCode(t, r.body) != "rate_limit_exceeded" || !strings.Contains(string(r.body), "tokens per minute") {
		t.Fatalf("over the bucket: %d %s", r.status, r.body)
	}
	wait := time.Duration(p+50+53-100) * perToken
	wantHeaders(t, "over the bucket", r.header, map[string]string{
		ratelimit.HeaderRemainingTokens: strconv.Itoa(50 - p), ratelimit.HeaderResetTokens: ratelimit.FormatReset(time.Duration(p+n) * perToken),
		ratelimit.HeaderRetryAfterMs: strconv.FormatInt(wait.Milliseconds(), 10),
		ratelimit.HeaderRetryAfter:   strconv.Itoa(int(math.Ceil(wait.Seconds()))),
	})

	// After the wait 53 are there: a streamed request reserving 13 is
	// admitted and its usage chunk (asked for by the gateway, not by this
	// client) settled.
	clk.add(wait)
	r = c.post("/v1/completions", "key-alice", map[string]any{"model": "m", "prompt": "hello there", "max_tokens": 10, "stream": true})
	if r.status != http.StatusOK {
		t.Fatalf("streamed: %d %s", r.status, r.body)
	}
	wantHeaders(t, "streamed", r.header, map[string]string{ratelimit.HeaderRemainingTokens: "40"})
	if bytes.Contains(r.body, []byte(`"usage":{`)) {
		t.Fatalf("the client got a usage chunk it did not ask for:\n%s", r.body)
	}
	// The stream cost p + 10 of 53: a reservation of 1 + 60 does not fit.
	waitKeyRequests(t, reg, "alice", 2)
	r = c.post("/v1/completions", "key-alice", map[string]any{"model": "m", "prompt": "x", "max_tokens": 60})
	if r.status != http.StatusTooManyRequests {
		t.Fatalf("after the stream: %d %s", r.status, r.body)
	}
	wantHeaders(t, "after the stream", r.header, map[string]string{
		ratelimit.HeaderRemainingTokens: strconv.Itoa(53 - p - 10), ratelimit.HeaderResetTokens: ratelimit.FormatReset(time.Duration(100-53+p+10) * perToken),
	})
}

// counter returns the value of the counter series name{labels} in reg (0
// when absent).
func counter(t *testing.T, reg prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, lp := range m.GetLabel() {
				got[lp.GetName()] = lp.GetValue()
			}
			for k, v := range labels {
				if got[k] != v {
					continue next
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// waitKeyRequests waits until n requests of key have finished ok (the edge
// has charged their usage).
func waitKeyRequests(t *testing.T, reg prometheus.Gatherer, key string, n int) {
	t.Helper()
	eventually(t, 10*time.Second, func() bool {
		return counter(t, reg, "tlgate_key_requests_total", map[string]string{"key": key, "outcome": "ok"}) >= float64(n)
	}, "%d finished requests of %s", n, key)
}

// TestRefusedRequestsAreLogged: a request refused before it is routed (over
// its key's rate limit, with a wrong key) still gets its access-log line,
// with outcome "refused", the status and code, and the key when one was
// recognised; one the router refuses (an unknown model) keeps its single
// line from the request actor.
func TestRefusedRequestsAreLogged(t *testing.T) {
	clk := newFakeClock()
	var log lockedBuffer
	c := limitedCluster(t, clk, config.APIKey{RequestsPerMinute: 1}, nil, &log, enginesim.Config{ID: "w1", Model: "m"})
	body := map[string]any{"model": "m", "prompt": "x", "max_tokens": 1}
	if r := c.post("/v1/completions", "key-alice", body, "X-Request-Id", "first"); r.status != http.StatusOK {
		t.Fatalf("first: %d %s", r.status, r.body)
	}
	if r := c.post("/v1/completions", "key-alice", body, "X-Request-Id", "over"); r.status != http.StatusTooManyRequests {
		t.Fatalf("over the limit: %d %s", r.status, r.body)
	}
	if r := c.post("/v1/completions", "key-wrong", body, "X-Request-Id", "bad-key"); r.status != http.StatusUnauthorized {
		t.Fatalf("wrong key: %d %s", r.status, r.body)
	}
	unknown := map[string]any{"model": "nope", "prompt": "x"}
	if r := c.post("/v1/completions", "key-bob", unknown, "X-Request-Id", "no-model"); r.status != http.StatusNotFound {
		t.Fatalf("unknown model: %d %s", r.status, r.body)
	}
	for _, want := range []struct {
		id, outcome, code, key string
		status                 float64
	}{
		{"over", "refused", "rate_limit_exceeded", "alice", 429},
		{"bad-key", "refused", "invalid_api_key", "", 401},
		{"no-model", "not_found", "model_not_found", "bob", 404},
	} {
		if n := strings.Count(log.String(), `"client_request_id":"`+want.id+`"`); n != 1 {
			t.Errorf("%s: %d access-log lines, want 1", want.id, n)
		}
		l := log.line(want.id)
		if l == nil {
			t.Errorf("%s: no access-log line in\n%s", want.id, log.String())
			continue
		}
		key, _ := l["key"].(string)
		if l["outcome"] != want.outcome || l["status"] != want.status || l["code"] != want.code || key != want.key {
			t.Errorf("%s: line %v, want outcome %s, status %v, code %s, key %q", want.id, l, want.outcome, want.status, want.code, want.key)
		}
		if want.outcome == "refused" && l["path"] != "/v1/completions" {
			t.Errorf("%s: path %v", want.id, l["path"])
		}
	}
	if l := log.line("first"); l == nil || l["outcome"] != "ok" {
		t.Errorf("the routed request's line: %v", l)
	}
}
