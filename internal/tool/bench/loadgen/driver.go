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
	// With inter-token timing asked for (Sessions.InterToken), ITL holds
	// every gap between two token events of every OK streamed answer, and
	// TPOT each OK streamed answer's time per output token after the
	// first (its last token event's time less its first's, over the gaps
	// between them; 0 for an answer of one token), in the order of TTFT.
	ITL, TPOT []time.Duration
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
	r.addTimed(lat, ttft, stream, nil, err)
}

// addTimed is add with a streamed answer's inter-token gaps (nil when
// they were not timed).
func (r *recorder) addTimed(lat, ttft time.Duration, stream bool, gaps []time.Duration, err error) {
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
	if stream && gaps != nil {
		var tpot time.Duration
		if n := len(gaps); n > 0 {
			var sum time.Duration
			for _, g := range gaps {
				sum += g
			}
			tpot = sum / time.Duration(n)
		}
		r.res.ITL = append(r.res.ITL, gaps...)
		r.res.TPOT = append(r.res.TPOT, tpot)
	}
}

// Closed is a closed-loop run: Concurrency clients each send a request,
// wait for its answer, and send the next. A request with After set is not
// sent, on the first pass through Requests, before Think has passed since
// that earlier request was answered (a user reads the answer and types);
// meanwhile the clients send the next requests that are ready, so a
// waiting request holds no client, as other users' requests arrive while
// one user reads.
type Closed struct {
	Concurrency int
	// Think is the mean of how long after its previous turn was answered a
	// request with After becomes ready: drawn evenly from [Think/2,
	// 3·Think/2], the same for every run of the same requests. With no think time the client whose answer
	// released a turn is the first free one, and sends it at the moment the
	// engine that answered has one request fewer: a least-loaded router then
	// keeps conversations on their engine by accident.
	Think time.Duration
	// Ramp spreads the clients' starts evenly over its length (0: all at
	// once), so that a run's opening burst is not what its tail measures.
	Ramp time.Duration
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
	d := newDispatcher(cfg.Requests, cfg.Cycle, cfg.Think)
	stop := context.AfterFunc(ctx, d.wake)
	defer stop()
	defer d.stopTimers()
	var wg sync.WaitGroup
	start := time.Now()
	for k := range cfg.Concurrency {
		wg.Go(func() {
			if delay := cfg.Ramp * time.Duration(k) / time.Duration(cfg.Concurrency); delay > 0 {
				t := time.NewTimer(delay)
				select {
				case <-t.C:
				case <-ctx.Done():
					t.Stop()
					return
				}
			}
			for {
				i, ok := d.take(ctx)
				if !ok {
					return
				}
				r := cfg.Requests[i%len(cfg.Requests)]
				lat, ttft, err := Do(ctx, c, p.Next(), r)
				d.answered(i)
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

// dispatcher hands out the indexes of a closed loop's requests: in order,
// except that a first-pass request whose After is not answered yet is
// passed over until it is, and then goes before any later one.
type dispatcher struct {
	reqs  []Request
	cycle bool
	think time.Duration

	mu       sync.Mutex
	cond     *sync.Cond
	next     int    // the next index never handed out (past len(reqs): cycling)
	deferred []int  // indexes passed over, in order, not handed out yet
	done     []bool // first-pass requests answered Think ago; nil if none waits
	timers   []*time.Timer
	stopped  bool
}

func newDispatcher(reqs []Request, cycle bool, think time.Duration) *dispatcher {
	d := &dispatcher{reqs: reqs, cycle: cycle, think: think}
	d.cond = sync.NewCond(&d.mu)
	for _, r := range reqs {
		if r.After > 0 {
			d.done = make([]bool, len(reqs))
			break
		}
	}
	return d
}

// ready reports whether first-pass request i may be sent. Callers hold mu.
func (d *dispatcher) ready(i int) bool {
	a := d.reqs[i].After
	return d.done == nil || a <= 0 || a > i || d.done[a-1]
}

// take returns the next index to send, waiting while every request left is
// held back by an unanswered one; false when none is left or ctx ended.
func (d *dispatcher) take(ctx context.Context) (int, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for ctx.Err() == nil {
		for k, i := range d.deferred {
			if d.ready(i) {
				d.deferred = append(d.deferred[:k], d.deferred[k+1:]...)
				return i, true
			}
		}
		for d.next < len(d.reqs) {
			i := d.next
			d.next++
			if d.ready(i) {
				return i, true
			}
			d.deferred = append(d.deferred, i)
		}
		if d.cycle {
			d.next++
			return d.next - 1, true
		}
		if len(d.deferred) == 0 {
			return 0, false
		}
		d.cond.Wait()
	}
	return 0, false
}

// answered records that request i was answered (or failed): the requests
// that wait for it are released Think later.
func (d *dispatcher) answered(i int) {
	if d.done == nil || i >= len(d.reqs) {
		return
	}
	release := func() {
		d.mu.Lock()
		d.done[i] = true
		d.mu.Unlock()
		d.cond.Broadcast()
	}
	if d.think <= 0 {
		release()
		return
	}
	// A fixed think time would lock the users' turns into the engines'
	// rhythm (every engine here takes the same time for the same work).
	think := d.think/2 + time.Duration(rand.New(rand.NewPCG(uint64(i), 0x7468696e6b)).Int64N(int64(d.think)+1))
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.stopped {
		d.timers = append(d.timers, time.AfterFunc(think, release))
	}
}

// stopTimers stops the think timers still running when the run ends.
func (d *dispatcher) stopTimers() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.stopped = true
	for _, t := range d.timers {
		t.Stop()
	}
}

// wake wakes every waiting take to see that the run's context ended. Taking
// mu first orders the wake after any take's check of ctx.
func (d *dispatcher) wake() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.cond.Broadcast()
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
	noChoices  = []byte(`"choices":[]`)
)

// Do sends r to base and reads the whole answer. It returns the time to the
// last byte and, for a stream, to the first event that carries a token (a
// chat stream's opening role-only chunk does not count).
func Do(ctx context.Context, c *http.Client, base string, r Request) (latency, ttft time.Duration, err error) {
	return do(ctx, c, base, r, nil)
}

// do is Do; with gaps set, a stream's gaps between token events are
// appended to it.
func do(ctx context.Context, c *http.Client, base string, r Request, gaps *[]time.Duration) (latency, ttft time.Duration, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+r.Path, bytes.NewReader(r.Body))
	if err != nil {
		return 0, 0, fmt.Errorf("loadgen: %w", err)
	}
	for k, vs := range r.Header {
		req.Header[k] = vs
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
	ttft, err = readStream(resp.Body, start, nil, gaps)
	if err != nil {
		return 0, 0, err
	}
	latency = time.Since(start)
	// Read the stream to its end, as OpenAI's SDKs do after [DONE]: a
	// body closed before its end closes the connection, and the next
	// request would pay for a new one, more often the later a proxy ends
	// its answers after their [DONE].
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	return latency, ttft, nil
}

// readStream reads SSE events until [DONE]. It returns the time from start
// to the first token event; firstToken, if set, is called then. With gaps
// set, the time between each token event and the one before it is
// appended to it (a chunk of usage alone, with no choices, is no token).
func readStream(body io.Reader, start time.Time, firstToken func(), gaps *[]time.Duration) (time.Duration, error) {
	br := readers.Get().(*bufio.Reader)
	br.Reset(body)
	defer func() { br.Reset(nil); readers.Put(br) }()
	var ttft time.Duration
	var last time.Time
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
			last = time.Now()
			ttft = last.Sub(start)
			if firstToken != nil {
				firstToken()
			}
		case gaps != nil && ttft > 0 && !bytes.Contains(data, noChoices):
			now := time.Now()
			*gaps = append(*gaps, now.Sub(last))
			last = now
		}
	}
}
