package tlbench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/tool/bench/loadgen"
)

// The overload experiment: open-loop arrivals at multiples of the fleet's
// measured capacity, from two API keys (a heavy one sending 4 of every 5
// requests, a light one the fifth), through a gateway with admission
// control (per-worker limit, bounded fair queue) and without it (requests
// pile up in the engines' own queues).

// Keys of the overload experiment.
const (
	keyHeavy = "heavy"
	keyLight = "light"
)

// overloadRow is one (load, admission) run.
type overloadRow struct {
	multiple   float64 // offered load / capacity
	admission  bool
	rate       float64 // offered requests per second
	offered    map[string]int
	served     map[string]int
	overloaded int // 503 overloaded answers
	timedOut   int // the client gave up
	other      int // anything else
	latency    loadgen.Summary
	withinSLO  int
	elapsed    time.Duration
}

func (r overloadRow) share(key string) float64 {
	total := r.served[keyHeavy] + r.served[keyLight]
	if total == 0 {
		return 0
	}
	return float64(r.served[key]) / float64(total)
}

func (r overloadRow) goodput() float64 { return float64(r.withinSLO) / r.elapsed.Seconds() }

func (r overloadRow) throughput() float64 {
	return float64(r.served[keyHeavy]+r.served[keyLight]) / r.elapsed.Seconds()
}

// overloadEngines are the fleet: small batches and slow decoding, so that
// its capacity is low and known.
func overloadEngines(c Config) []enginesim.Config {
	out := make([]enginesim.Config, c.OverloadEngines)
	for i := range out {
		out[i] = enginesim.Config{
			ID: fmt.Sprintf("engine-%d", i), Model: c.Model,
			DecodePerToken: c.OverloadDecode, MaxRunning: c.OverloadRunning,
			HeartbeatInterval: c.Heartbeat,
		}
	}
	return out
}

// overloadGateway configures the gateway of a run: two keys, and admission
// control on (limit = the engines' batch size) or off.
func overloadGateway(c Config, admission bool) *gatewayConfig {
	return &gatewayConfig{policy: config.PolicyLeastOutstanding, heartbeat: c.Heartbeat, tune: func(g *config.Gateway) {
		g.APIKeys = []config.APIKey{
			{Name: keyHeavy, Key: "tlbench-" + keyHeavy, Scopes: []string{config.ScopeInference}},
			{Name: keyLight, Key: "tlbench-" + keyLight, Scopes: []string{config.ScopeInference}},
		}
		g.Admission.Enabled = admission
		g.Admission.WorkerConcurrency = c.OverloadRunning
		g.Admission.QueueSize = c.OverloadQueue
		g.Admission.QueueTimeout = config.D(c.OverloadQueueTimeout)
	}}
}

func overloadExperiment(ctx context.Context, c Config, logOut io.Writer) (section, []plotFile, error) {
	capacity, err := overloadCapacity(ctx, c)
	if err != nil {
		return section{}, nil, fmt.Errorf("capacity: %w", err)
	}
	fmt.Fprintf(logOut, "tlbench:   capacity %.1f req/s\n", capacity)
	var rows []overloadRow
	for _, m := range c.OverloadMultiples {
		for _, adm := range []bool{false, true} {
			row, err := overloadRun(ctx, c, m*capacity, adm)
			if err != nil {
				return section{}, nil, fmt.Errorf("%v× admission=%v: %w", m, adm, err)
			}
			row.multiple = m
			fmt.Fprintf(logOut, "tlbench:   %.0f× admission %-5v served %4d/%4d goodput %6.1f req/s p99 %7s ms light share %5.1f%%\n",
				m, adm, row.served[keyHeavy]+row.served[keyLight], row.offered[keyHeavy]+row.offered[keyLight],
				row.goodput(), ms(row.latency.P99), 100*row.share(keyLight))
			rows = append(rows, row)
		}
	}
	return overloadSection(c, capacity, rows), nil, nil
}

// overloadCapacity measures the fleet's capacity through the gateway: a
// closed loop with exactly as many clients as the fleet runs sequences.
func overloadCapacity(ctx context.Context, c Config) (float64, error) {
	cl, err := startCluster(ctx, overloadGateway(c, true), overloadEngines(c))
	if err != nil {
		return 0, err
	}
	defer cl.close()
	conc := c.OverloadEngines * c.OverloadRunning
	client := loadgen.NewClient(conc)
	defer client.CloseIdleConnections()
	req := overloadRequest(c)
	var n int
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	end := start.Add(c.OverloadDuration)
	for range conc {
		wg.Go(func() {
			for time.Now().Before(end) && ctx.Err() == nil {
				if o := overloadSend(ctx, client, cl.url(), keyHeavy, req, 10*time.Second); o.status == http.StatusOK {
					mu.Lock()
					n++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if n == 0 {
		return 0, errors.New("no request succeeded")
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

func overloadRequest(c Config) []byte {
	b, _ := json.Marshal(map[string]any{"model": c.Model, "prompt": "Overload the fleet", "max_tokens": c.OverloadTokens, "temperature": 0, "seed": 1})
	return b
}

// overloadOutcome is one request's fate.
type overloadOutcome struct {
	key     string
	status  int
	code    string
	latency time.Duration
	err     error
}

// overloadSend posts body with key's secret and reads the answer, giving
// up after timeout.
func overloadSend(ctx context.Context, client *http.Client, base, key string, body []byte, timeout time.Duration) overloadOutcome {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	o := overloadOutcome{key: key}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+loadgen.CompletionsPath, bytes.NewReader(body))
	if err != nil {
		o.err = err
		return o
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer tlbench-"+key)
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		o.err = err
		return o
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	o.status, o.latency, o.err = resp.StatusCode, time.Since(start), err
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		_ = json.Unmarshal(b, &e)
		o.code = e.Error.Code
	}
	return o
}

// overloadRun offers rate requests per second for the run's duration (one
// in five from the light key) and waits for every answer.
func overloadRun(ctx context.Context, c Config, rate float64, admission bool) (overloadRow, error) {
	cl, err := startCluster(ctx, overloadGateway(c, admission), overloadEngines(c))
	if err != nil {
		return overloadRow{}, err
	}
	defer cl.close()
	client := loadgen.NewClient(256)
	defer client.CloseIdleConnections()
	body := overloadRequest(c)
	row := overloadRow{admission: admission, rate: rate, offered: map[string]int{}, served: map[string]int{}}
	var mu sync.Mutex
	var outs []overloadOutcome
	var wg sync.WaitGroup
	interval := time.Duration(float64(time.Second) / rate)
	start := time.Now()
	for i := 0; ; i++ {
		at := start.Add(time.Duration(i) * interval)
		if at.Sub(start) >= c.OverloadDuration || ctx.Err() != nil {
			break
		}
		if d := time.Until(at); d > 0 {
			time.Sleep(d)
		}
		key := keyHeavy
		if i%5 == 4 {
			key = keyLight
		}
		row.offered[key]++
		wg.Go(func() {
			o := overloadSend(ctx, client, cl.url(), key, body, c.OverloadClientTimeout)
			mu.Lock()
			outs = append(outs, o)
			mu.Unlock()
		})
	}
	wg.Wait()
	row.elapsed = time.Since(start)
	if err := ctx.Err(); err != nil {
		return overloadRow{}, err
	}
	var lat []time.Duration
	for _, o := range outs {
		switch {
		case o.err == nil && o.status == http.StatusOK:
			row.served[o.key]++
			lat = append(lat, o.latency)
			if o.latency <= c.OverloadSLO {
				row.withinSLO++
			}
		case o.err == nil && o.status == http.StatusServiceUnavailable && o.code == "overloaded":
			row.overloaded++
		case errors.Is(o.err, context.DeadlineExceeded):
			row.timedOut++
		default:
			row.other++
		}
	}
	slices.Sort(lat)
	row.latency = loadgen.Summarize(lat)
	return row, nil
}

func overloadSection(c Config, capacity float64, rows []overloadRow) section {
	sort.SliceStable(rows, func(i, j int) bool { return rows[i].multiple < rows[j].multiple })
	t := &table{header: []string{"offered load", "admission control", "offered req/s", "served", "goodput req/s (≤ SLO)", "served req/s",
		"served p50 ms", "served p99 ms", "503 overloaded", "client timeouts", "heavy key share", "light key share"}}
	for _, r := range rows {
		adm := "off"
		if r.admission {
			adm = "on"
		}
		t.add(fmt.Sprintf("%.0f×", r.multiple), adm, f1(r.rate),
			fmt.Sprintf("%d / %d", r.served[keyHeavy]+r.served[keyLight], r.offered[keyHeavy]+r.offered[keyLight]),
			f1(r.goodput()), f1(r.throughput()), ms(r.latency.P50), ms(r.latency.P99),
			strconv.Itoa(r.overloaded), strconv.Itoa(r.timedOut+r.other), pct(r.share(keyHeavy)), pct(r.share(keyLight)))
	}
	lead := fmt.Sprintf("%d engines running at most %d sequences each (more wait in the engine's own queue; %s), "+
		"%d-token completions; the fleet's capacity, measured through the gateway with %d closed-loop clients, is %.1f req/s. "+
		"Open-loop arrivals at multiples of it for %v, one in five from the light key and the rest from the heavy key, each client "+
		"giving up after %v. Admission control on: worker limit %d, queue_size %d, queue_timeout %v; off: [gateway.admission] enabled = false. "+
		"Goodput counts answers within the SLO of %v; served p50/p99 are over every 200 answer; the key shares are of the served answers "+
		"(the light key offers 20%% of the load).",
		c.OverloadEngines, c.OverloadRunning, flatModel(0, c.OverloadDecode), c.OverloadTokens, c.OverloadEngines*c.OverloadRunning, capacity,
		c.OverloadDuration, c.OverloadClientTimeout, c.OverloadRunning, c.OverloadQueue, c.OverloadQueueTimeout, c.OverloadSLO)
	return section{title: "Overload: admission control", lead: lead, tables: []*table{t}}
}
