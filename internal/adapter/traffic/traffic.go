// Package traffic keeps the last minutes of each model's traffic in small
// ring buffers inside the gateway, for the console's charts: requests,
// errors by code, failovers, cascade acceptances and escalations, and
// histograms of time to first token and latency, in fixed-width buckets
// (by default 5 s × 180, the last 15 minutes). No Prometheus is needed.
//
// Memory is bounded: a fixed number of buckets per model, a fixed number of
// models (MaxModels, then everything else is counted under OtherModel),
// a fixed number of error codes per bucket (then OtherCode) and fixed-size
// histograms. A Recorder is safe for concurrent use; its recording methods
// hold a mutex for a few hundred nanoseconds and never allocate once a
// model's ring exists.
package traffic

import (
	"math"
	"sort"
	"sync"
	"time"
)

// Defaults for zero Config fields.
const (
	DefaultWidth     = 5 * time.Second
	DefaultBuckets   = 180
	DefaultMaxModels = 32
)

// Names under which what does not fit is counted.
const (
	// OtherModel collects the models past MaxModels.
	OtherModel = "(other)"
	// NoRoute is the model of requests that named no route: a client
	// cannot fill the rings with made-up model ids.
	NoRoute = "(no route)"
	// OtherCode collects error codes past maxCodes in one bucket.
	OtherCode = "other"
)

// maxCodes is the number of distinct error codes one bucket keeps.
const maxCodes = 8

// The histograms' bins: bin 0 holds durations up to histBase, bin i up to
// histBase·histGrowth^i, the last bin everything above. Quantiles are
// reported as the bin's geometric middle, so within about ±12 %.
const (
	histBins   = 64
	histBase   = 100 * time.Microsecond
	histGrowth = 1.25
)

// Config sizes a Recorder.
type Config struct {
	// Width of one bucket; 0 means DefaultWidth.
	Width time.Duration
	// Buckets kept per model; 0 means DefaultBuckets.
	Buckets int
	// MaxModels is the number of models with their own ring; 0 means
	// DefaultMaxModels. A model unseen for a whole window gives its ring
	// up to a new one.
	MaxModels int
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Recorder holds the rings.
type Recorder struct {
	cfg    Config
	mu     sync.Mutex
	models map[string]*ring
}

type ring struct {
	slots []slot
	last  int64 // the bucket number last written
}

type hist [histBins]uint32

type codeCount struct {
	code string
	n    uint32
}

// slot is one bucket of one model.
type slot struct {
	num                  int64 // bucket number: unix nanoseconds / width
	requests, failovers  uint32
	accepted, escalated  uint32
	codes                [maxCodes]codeCount
	ncodes               int
	ttft, latency        hist
	ttftCount, latencyCt uint32
}

// New returns an empty Recorder.
func New(cfg Config) *Recorder {
	if cfg.Width <= 0 {
		cfg.Width = DefaultWidth
	}
	if cfg.Buckets <= 0 {
		cfg.Buckets = DefaultBuckets
	}
	if cfg.MaxModels <= 0 {
		cfg.MaxModels = DefaultMaxModels
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Recorder{cfg: cfg, models: map[string]*ring{}}
}

// Window is the span the rings cover.
func (r *Recorder) Window() time.Duration { return r.cfg.Width * time.Duration(r.cfg.Buckets) }

func (r *Recorder) bucketNum(t time.Time) int64 { return t.UnixNano() / int64(r.cfg.Width) }

// slotFor returns the current slot of model, reset when it held an older
// bucket. The caller holds r.mu.
func (r *Recorder) slotFor(model string) *slot {
	if model == "" {
		model = NoRoute
	}
	num := r.bucketNum(r.cfg.Now())
	rg := r.models[model]
	if rg == nil {
		rg = r.newRing(model, num)
	}
	rg.last = max(rg.last, num)
	s := &rg.slots[mod(num, len(rg.slots))]
	if s.num != num {
		*s = slot{num: num}
	}
	return s
}

// newRing makes model's ring, or returns OtherModel's when MaxModels are
// taken by models seen within the window.
func (r *Recorder) newRing(model string, num int64) *ring {
	if model != OtherModel && r.ownRings() >= r.cfg.MaxModels {
		for m, rg := range r.models {
			if m != OtherModel && num-rg.last >= int64(r.cfg.Buckets) {
				delete(r.models, m)
			}
		}
		if r.ownRings() >= r.cfg.MaxModels {
			model = OtherModel
			if rg := r.models[model]; rg != nil {
				return rg
			}
		}
	}
	rg := &ring{slots: make([]slot, r.cfg.Buckets), last: num}
	for i := range rg.slots {
		rg.slots[i].num = math.MinInt64
	}
	r.models[model] = rg
	return rg
}

func (r *Recorder) ownRings() int {
	n := len(r.models)
	if _, ok := r.models[OtherModel]; ok {
		n--
	}
	return n
}

func mod(a int64, n int) int {
	m := a % int64(n)
	if m < 0 {
		m += int64(n)
	}
	return int(m)
}

// Request records one finished request of model: code is empty for a
// success, else the error's code; latency is the whole request's time and
// ttft its time to first byte (not recorded when zero or less).
func (r *Recorder) Request(model, code string, latency, ttft time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.slotFor(model)
	s.requests++
	if code != "" {
		s.addCode(code)
	}
	if latency > 0 {
		s.latency[bin(latency)]++
		s.latencyCt++
	}
	if ttft > 0 {
		s.ttft[bin(ttft)]++
		s.ttftCount++
	}
}

// Failover records that a request of model moved to another worker.
func (r *Recorder) Failover(model string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.slotFor(model).failovers++
}

// Cascade records a cascade step's verdict for model: accepted, or
// escalated to the next step.
func (r *Recorder) Cascade(model string, accepted bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.slotFor(model)
	if accepted {
		s.accepted++
	} else {
		s.escalated++
	}
}

// addCode counts code; past maxCodes-1 distinct codes a new one is
// counted as OtherCode (the last place is kept for it).
func (s *slot) addCode(code string) { s.addCodeN(code, 1) }

// addCodeN counts code n times, as addCode.
func (s *slot) addCodeN(code string, n uint32) {
	if n == 0 {
		return
	}
	if s.ncodes >= maxCodes-1 && s.find(code) < 0 {
		code = OtherCode
	}
	if i := s.find(code); i >= 0 {
		s.codes[i].n = satAdd(s.codes[i].n, n)
		return
	}
	s.codes[s.ncodes] = codeCount{code: code, n: n}
	s.ncodes++
}

func (s *slot) find(code string) int {
	for i := 0; i < s.ncodes; i++ {
		if s.codes[i].code == code {
			return i
		}
	}
	return -1
}

// bin is the histogram bin of d.
func bin(d time.Duration) int {
	if d <= histBase {
		return 0
	}
	i := int(math.Ceil(math.Log(float64(d)/float64(histBase)) / math.Log(histGrowth)))
	return min(max(i, 0), histBins-1)
}

// binValue is the duration bin i stands for: the geometric middle of its
// bounds (bin 0: histBase).
func binValue(i int) time.Duration {
	if i == 0 {
		return histBase
	}
	upper := float64(histBase) * math.Pow(histGrowth, float64(i))
	return time.Duration(upper / math.Sqrt(histGrowth))
}

// quantile of h (q in (0, 1]), or nil with no samples.
func (h *hist) quantile(q float64, count uint32) *float64 {
	if count == 0 {
		return nil
	}
	rank := uint32(math.Ceil(q * float64(count)))
	rank = max(rank, 1)
	var cum uint32
	for i, n := range h {
		cum += n
		if cum >= rank {
			ms := float64(binValue(i)) / float64(time.Millisecond)
			ms = math.Round(ms*1000) / 1000
			return &ms
		}
	}
	return nil
}

func (h *hist) add(o *hist) {
	for i := range h {
		h[i] += o[i]
	}
}

// Snapshot is what GET /admin/v1/traffic answers: every model seen in the
// window, each with one value per bucket, oldest first. Bucket i covers
// [Start + i·BucketSeconds, Start + (i+1)·BucketSeconds); the last one is
// the current, partial bucket (its rate is over its elapsed part).
type Snapshot struct {
	Start         time.Time `json:"start"`
	Now           time.Time `json:"now"`
	BucketSeconds float64   `json:"bucket_seconds"`
	Buckets       int       `json:"buckets"`
	// Replicas is how many gateway replicas' traffic the snapshot sums:
	// this one's, and the others' that answered (SnapshotWith).
	Replicas int     `json:"replicas"`
	Models   []Model `json:"models"`
}

// Model is one model's series. Quantiles are in milliseconds, null for a
// bucket without samples.
type Model struct {
	Model            string              `json:"model"`
	Requests         []uint32            `json:"requests"`
	RPS              []float64           `json:"rps"`
	TTFTP50          []*float64          `json:"ttft_p50_ms"`
	TTFTP99          []*float64          `json:"ttft_p99_ms"`
	LatencyP50       []*float64          `json:"latency_p50_ms"`
	LatencyP99       []*float64          `json:"latency_p99_ms"`
	Errors           map[string][]uint32 `json:"errors"`
	Failovers        []uint32            `json:"failovers"`
	CascadeAccepted  []uint32            `json:"cascade_accepted"`
	CascadeEscalated []uint32            `json:"cascade_escalated"`
	Totals           Totals              `json:"totals"`
}

// Totals sums a model's window.
type Totals struct {
	Requests         uint64            `json:"requests"`
	Errors           uint64            `json:"errors"`
	ErrorsByCode     map[string]uint64 `json:"errors_by_code"`
	Failovers        uint64            `json:"failovers"`
	CascadeAccepted  uint64            `json:"cascade_accepted"`
	CascadeEscalated uint64            `json:"cascade_escalated"`
	TTFTP50          *float64          `json:"ttft_p50_ms"`
	TTFTP99          *float64          `json:"ttft_p99_ms"`
	LatencyP50       *float64          `json:"latency_p50_ms"`
	LatencyP99       *float64          `json:"latency_p99_ms"`
}

// Snapshot returns the window ending now, of this replica alone. The
// rings are copied under the lock and summarised outside it.
func (r *Recorder) Snapshot() Snapshot { return r.SnapshotWith(nil) }

// summary is the Snapshot of copies, the rings of the window from bucket
// first to cur (now's).
func (r *Recorder) summary(copies map[string][]slot, now time.Time, cur, first int64) Snapshot {
	width := r.cfg.Width
	snap := Snapshot{
		Start:         time.Unix(0, first*int64(width)).UTC(),
		Now:           now.UTC(),
		BucketSeconds: width.Seconds(),
		Buckets:       r.cfg.Buckets,
		Models:        make([]Model, 0, len(copies)),
	}
	elapsed := now.Sub(time.Unix(0, cur*int64(width))).Seconds()
	elapsed = max(elapsed, 1)
	elapsed = min(elapsed, width.Seconds())
	for name, slots := range copies {
		snap.Models = append(snap.Models, summarise(name, slots, first, r.cfg.Buckets, width.Seconds(), elapsed))
	}
	sort.Slice(snap.Models, func(i, j int) bool { return snap.Models[i].Model < snap.Models[j].Model })
	return snap
}

func summarise(name string, slots []slot, first int64, n int, width, lastElapsed float64) Model {
	m := Model{
		Model:    name,
		Requests: make([]uint32, n), RPS: make([]float64, n),
		TTFTP50: make([]*float64, n), TTFTP99: make([]*float64, n),
		LatencyP50: make([]*float64, n), LatencyP99: make([]*float64, n),
		Errors:    map[string][]uint32{},
		Failovers: make([]uint32, n), CascadeAccepted: make([]uint32, n), CascadeEscalated: make([]uint32, n),
		Totals: Totals{ErrorsByCode: map[string]uint64{}},
	}
	var ttft, lat hist
	var ttftN, latN uint32
	for i := 0; i < n; i++ {
		num := first + int64(i)
		s := &slots[mod(num, len(slots))]
		if s.num != num {
			continue
		}
		m.Requests[i] = s.requests
		secs := width
		if i == n-1 {
			secs = lastElapsed
		}
		m.RPS[i] = math.Round(float64(s.requests)/secs*1000) / 1000
		m.TTFTP50[i], m.TTFTP99[i] = s.ttft.quantile(0.5, s.ttftCount), s.ttft.quantile(0.99, s.ttftCount)
		m.LatencyP50[i], m.LatencyP99[i] = s.latency.quantile(0.5, s.latencyCt), s.latency.quantile(0.99, s.latencyCt)
		for _, c := range s.codes[:s.ncodes] {
			series := m.Errors[c.code]
			if series == nil {
				series = make([]uint32, n)
				m.Errors[c.code] = series
			}
			series[i] = c.n
			m.Totals.Errors += uint64(c.n)
			m.Totals.ErrorsByCode[c.code] += uint64(c.n)
		}
		m.Failovers[i], m.CascadeAccepted[i], m.CascadeEscalated[i] = s.failovers, s.accepted, s.escalated
		m.Totals.Requests += uint64(s.requests)
		m.Totals.Failovers += uint64(s.failovers)
		m.Totals.CascadeAccepted += uint64(s.accepted)
		m.Totals.CascadeEscalated += uint64(s.escalated)
		ttft.add(&s.ttft)
		lat.add(&s.latency)
		ttftN += s.ttftCount
		latN += s.latencyCt
	}
	m.Totals.TTFTP50, m.Totals.TTFTP99 = ttft.quantile(0.5, ttftN), ttft.quantile(0.99, ttftN)
	m.Totals.LatencyP50, m.Totals.LatencyP99 = lat.quantile(0.5, latN), lat.quantile(0.99, latN)
	return m
}
