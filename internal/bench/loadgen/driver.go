package loadgen

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// Errors of a request, as counted in Result.Errors.
var (
	// ErrStatus: the answer's status was not 200.
	ErrStatus = errors.New("loadgen: status not 200")
	// ErrTruncated: a stream ended without data: [DONE], or carried an
	// error event.
	ErrTruncated = errors.New("loadgen: stream truncated or failed")
)

// Picker chooses the base URL ("http://host:port") of each request. It is
// safe for concurrent use.
type Picker interface{ Next() string }

type fixed string

func (f fixed) Next() string { return string(f) }

// Fixed always picks url.
func Fixed(url string) Picker { return fixed(url) }

type roundRobin struct {
	urls []string
	n    atomic.Uint64
}

func (r *roundRobin) Next() string { return r.urls[(r.n.Add(1)-1)%uint64(len(r.urls))] }

// RoundRobin picks urls in turn.
func RoundRobin(urls []string) Picker { return &roundRobin{urls: urls} }

type random struct {
	mu   sync.Mutex
	rng  *rand.Rand
	urls []string
}

func (r *random) Next() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.urls[r.rng.IntN(len(r.urls))]
}

// Random picks one of urls uniformly at random, reproducibly from seed.
func Random(urls []string, seed uint64) Picker {
	return &random{rng: rand.New(rand.NewPCG(seed, 0x72616e646f6d)), urls: urls}
}

// NewClient returns an HTTP/1.1 keep-alive client that keeps up to conns
// idle connections per host, dials loopback directly and never asks for
// compression. Close its idle connections when done.
func NewClient(conns int) *http.Client {
	return &http.Client{Transport: &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        0,
		MaxIdleConnsPerHost: max(conns, 2),
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}}
}

// Result is what a run measured.
type Result struct {
	// OK counts requests answered in full with status 200; Failed the
	// others; Dropped the open-loop arrivals skipped because MaxInFlight
	// requests were outstanding.
	OK, Failed, Dropped int
	// Elapsed is the run's wall time, from the first send to the last
	// answer.
	Elapsed time.Duration
	// Latency holds every OK request's time from send to its last byte;
	// TTFT every OK streamed request's time to its first token event.
	Latency, TTFT []time.Duration
	// Errors counts failures by message.
	Errors map[string]int
}

// Throughput is OK requests per second of Elapsed.
func (r *Result) Throughput() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.OK) / r.Elapsed.Seconds()
}

// FirstError returns the most frequent error message, or "".
func (r *Result) FirstError() string {
	keys := make([]string, 0, len(r.Errors))
	for k := range r.Errors {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if r.Errors[keys[i]] != r.Errors[keys[j]] {
			return r.Errors[keys[i]] > r.Errors[keys[j]]
		}
		return keys[i] < keys[j]
	})
	if len(keys) == 0 {
		return ""
	}
	return keys[0]
}

// recorder collects outcomes from concurrent requests.
type recorder struct {
	mu  sync.Mutex
	res Result
}

func (r *recorder) add(lat, ttft time.Duration, stream bool, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		r.res.Failed++
		if r.res.Errors == nil {
			r.res.Errors = map[string]int{}
		}
		r.res.Errors[err.Error()]++
		return
	}
	r.res.OK++
	r.res.Latency = append(r.res.Latency, lat)
	if stream {
		r.res.TTFT = append(r.res.TTFT, ttft)
	}
}

// Closed is a closed-loop run: Concurrency clients each send a request,
// wait for its answer, and send the next. A request with After set waits
// (holding its client) until that earlier request is answered, on the
// first pass through Requests.
type Closed struct {
	Concurrency int
	// Requests are sent in order, each once; with Cycle they are sent
	// again from the start until Duration ends.
	Requests []Request
	Cycle    bool
	// Duration bounds the run (0: no bound; then Cycle must be off).
	Duration time.Duration
}

// RunClosed runs a closed loop against the URLs p picks. It stops when the
// requests are exhausted, Duration has passed, or ctx ends.
func RunClosed(ctx context.Context, c *http.Client, p Picker, cfg Closed) *Result {
	var rec recorder
	if len(cfg.Requests) == 0 || cfg.Concurrency < 1 || cfg.Cycle && cfg.Duration <= 0 {
		return &rec.res
	}
	if cfg.Duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.Duration)
		defer cancel()
	}
	done := afterChannels(cfg.Requests)
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range cfg.Concurrency {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= len(cfg.Requests) && !cfg.Cycle {
					return
				}
				r := cfg.Requests[i%len(cfg.Requests)]
				first := done != nil && i < len(cfg.Requests)
				if first && r.After > 0 && r.After <= i {
					select {
					case <-done[r.After-1]:
					case <-ctx.Done():
						return
					}
				}
				lat, ttft, err := Do(ctx, c, p.Next(), r)
				if first {
					close(done[i])
				}
				if err != nil && ctx.Err() != nil {
					return // cut off by the end of the run, not a failure
				}
				rec.add(lat, ttft, r.Stream, err)
			}
		})
	}
	wg.Wait()
	rec.res.Elapsed = time.Since(start)
	return &rec.res
}

// afterChannels returns one channel per request, closed when it is
// answered, if any request waits for another; nil otherwise.
func afterChannels(reqs []Request) []chan struct{} {
	for _, r := range reqs {
		if r.After > 0 {
			done := make([]chan struct{}, len(reqs))
			for i := range done {
				done[i] = make(chan struct{})
			}
			return done
		}
	}
	return nil
}

// Open is an open-loop run: requests arrive at Rate per second whatever
// the answers, for Duration.
type Open struct {
	Rate     float64
	Duration time.Duration
	// Requests are sent in turn, cycling.
	Requests []Request
	// MaxInFlight bounds the outstanding requests; an arrival beyond it is
	// dropped and counted.
	MaxInFlight int
}

// RunOpen runs an open loop against the URLs p picks. Latencies are
// measured from each request's actual send.
func RunOpen(ctx context.Context, c *http.Client, p Picker, cfg Open) *Result {
	var rec recorder
	if len(cfg.Requests) == 0 || cfg.Rate <= 0 || cfg.Duration <= 0 || cfg.MaxInFlight < 1 {
		return &rec.res
	}
	interval := time.Duration(float64(time.Second) / cfg.Rate)
	sem := make(chan struct{}, cfg.MaxInFlight)
	var wg sync.WaitGroup
	start := time.Now()
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	for i := 0; ; i++ {
		at := start.Add(time.Duration(i) * interval)
		if at.Sub(start) >= cfg.Duration {
			break
		}
		if d := time.Until(at); d > 0 {
			timer.Reset(d)
			select {
			case <-timer.C:
			case <-ctx.Done():
			}
		}
		if ctx.Err() != nil {
			break
		}
		select {
		case sem <- struct{}{}:
		default:
			rec.mu.Lock()
			rec.res.Dropped++
			rec.mu.Unlock()
			continue
		}
		r := cfg.Requests[i%len(cfg.Requests)]
		url := p.Next()
		wg.Go(func() {
			defer func() { <-sem }()
			lat, ttft, err := Do(ctx, c, url, r)
			rec.add(lat, ttft, r.Stream, err)
		})
	}
	wg.Wait()
	rec.res.Elapsed = time.Since(start)
	return &rec.res
}

// maxEventBytes bounds one SSE line the reader accepts.
const maxEventBytes = 64 << 10

// readers are reused stream readers: the load generator should not add
// its own garbage to the process it measures.
var readers = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, maxEventBytes) }}

var (
	dataPrefix = []byte("data: ")
	doneEvent  = []byte("[DONE]")
	roleChunk  = []byte(`"role":"assistant"`)
	errorEvent = []byte(`"error":`)
)

// Do sends r to base and reads the whole answer. It returns the time to the
// last byte and, for a stream, to the first event that carries a token (a
// chat stream's opening role-only chunk does not count).
func Do(ctx context.Context, c *http.Client, base string, r Request) (latency, ttft time.Duration, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+r.Path, bytes.NewReader(r.Body))
	if err != nil {
		return 0, 0, fmt.Errorf("loadgen: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		return 0, 0, fmt.Errorf("loadgen: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		return 0, 0, fmt.Errorf("%w: %d", ErrStatus, resp.StatusCode)
	}
	if !r.Stream {
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			return 0, 0, fmt.Errorf("loadgen: read body: %w", err)
		}
		return time.Since(start), 0, nil
	}
	ttft, err = readStream(resp.Body, start, nil)
	if err != nil {
		return 0, 0, err
	}
	return time.Since(start), ttft, nil
}

// readStream reads SSE events until [DONE]. It returns the time from start
// to the first token event; firstToken, if set, is called then.
func readStream(body io.Reader, start time.Time, firstToken func()) (time.Duration, error) {
	br := readers.Get().(*bufio.Reader)
	br.Reset(body)
	defer func() { br.Reset(nil); readers.Put(br) }()
	var ttft time.Duration
	for {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			return 0, fmt.Errorf("%w: an event longer than %d bytes", ErrTruncated, maxEventBytes)
		}
		if err != nil {
			return 0, fmt.Errorf("%w: %w", ErrTruncated, err)
		}
		data, ok := bytes.CutPrefix(line, dataPrefix)
		if !ok {
			continue
		}
		data = bytes.TrimSpace(data)
		switch {
		case bytes.Equal(data, doneEvent):
			if ttft == 0 {
				return 0, fmt.Errorf("%w: no token before [DONE]", ErrTruncated)
			}
			return ttft, nil
		case bytes.Contains(data, errorEvent):
			return 0, fmt.Errorf("%w: error event", ErrTruncated)
		case ttft == 0 && !bytes.Contains(data, roleChunk):
			ttft = time.Since(start)
			if firstToken != nil {
				firstToken()
			}
		}
	}
}
