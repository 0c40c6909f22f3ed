package tlbench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/tool/bench/loadgen"
)

// The key limits experiment: three gateway replicas (the real binary)
// with fleet sync on, one API key limited to KeyLimitRPM requests per
// minute, hammered through all three at once by closed-loop clients for
// KeyLimitDuration. With key_limits = "fleet" the replicas grant together
// at most what one gateway would since they started (their buckets start
// empty) plus the stated overshoot; with "replica" each counts alone.

// keyLimitRun is one run: how the fleet counted, what it granted.
type keyLimitRun struct {
	mode             string // config.KeyLimitsFleet or config.KeyLimitsReplica
	granted, refused int
	elapsed          time.Duration // from the replicas' start to the last answer
	hammer           time.Duration
}

func keyLimitsExperiment(ctx context.Context, c Config, bins binaries, logOut io.Writer) (section, []plotFile, error) {
	nats, err := startNATS(ctx, bins.nats)
	if err != nil {
		return section{}, nil, err
	}
	defer nats.close()
	var runs []keyLimitRun
	for _, mode := range []string{config.KeyLimitsFleet, config.KeyLimitsReplica} {
		r, err := keyLimitOne(ctx, c, bins.gateway, nats, mode)
		if err != nil {
			return section{}, nil, fmt.Errorf("key_limits %s: %w", mode, err)
		}
		fmt.Fprintf(logOut, "tlbench:   key_limits %-7s granted %d, refused %d in %v\n", mode, r.granted, r.refused, r.elapsed.Round(time.Millisecond))
		runs = append(runs, r)
	}
	return keyLimitsSection(c, runs), nil, nil
}

// keyLimitInterval is the replicas' load_interval in the experiment, and
// keyLimitDecode its engine's decode time per token (flat timing).
const (
	keyLimitInterval = time.Second
	keyLimitDecode   = time.Millisecond
)

func keyLimitOne(ctx context.Context, c Config, bin string, nats *natsServer, mode string) (keyLimitRun, error) {
	extra := fmt.Sprintf("\n[[gateway.api_keys]]\nname = \"limited\"\nkey = \"tlbench-limited\"\nscopes = [\"inference\"]\nrequests_per_minute = %d\n", c.KeyLimitRPM)
	spec := replicaSpec{bin: bin, replicas: 3, policy: config.PolicyLeastOutstanding, heartbeat: c.Heartbeat,
		syncURL: nats.url(), syncToken: nats.token, keyLimits: mode, extra: extra}
	start := time.Now()
	f, err := startReplicas(ctx, spec, []enginesim.Config{{ID: "engine-0", Model: c.Model, DecodePerToken: keyLimitDecode, HeartbeatInterval: c.Heartbeat}})
	if err != nil {
		return keyLimitRun{}, err
	}
	defer f.close()
	// Every replica hears the others before the hammer starts.
	time.Sleep(3 * keyLimitInterval)
	client := loadgen.NewClient(64)
	defer client.CloseIdleConnections()
	body, _ := json.Marshal(map[string]any{"model": c.Model, "prompt": "limited", "max_tokens": 1})
	r := keyLimitRun{mode: mode, hammer: c.KeyLimitDuration}
	var mu sync.Mutex
	hctx, cancel := context.WithTimeout(ctx, c.KeyLimitDuration)
	defer cancel()
	var wg sync.WaitGroup
	for i := range 24 {
		wg.Go(func() {
			for n := 0; hctx.Err() == nil; n++ {
				req, err := http.NewRequestWithContext(hctx, http.MethodPost, f.urls[(i+n)%len(f.urls)]+loadgen.CompletionsPath, bytes.NewReader(body))
				if err != nil {
					return
				}
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Authorization", "Bearer tlbench-limited")
				resp, err := client.Do(req)
				if err != nil {
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				mu.Lock()
				switch resp.StatusCode {
				case http.StatusOK:
					r.granted++
				case http.StatusTooManyRequests:
					r.refused++
				}
				mu.Unlock()
				if resp.StatusCode == http.StatusTooManyRequests {
					time.Sleep(time.Millisecond) // a refused client retries at once, not in a hot loop
				}
			}
		})
	}
	wg.Wait()
	r.elapsed = time.Since(start)
	if err := ctx.Err(); err != nil {
		return keyLimitRun{}, err
	}
	return r, nil
}

func keyLimitsSection(c Config, runs []keyLimitRun) section {
	t := &table{header: []string{"key_limits", "granted", "refused", "since the replicas started", "one gateway's grant (limit × time)", "stated bound (+ overshoot)", "granted / one gateway's"}}
	var notes []string
	for _, r := range runs {
		one := float64(c.KeyLimitRPM) * r.elapsed.Minutes()
		bound := one + 3*float64(c.KeyLimitRPM)*(2*keyLimitInterval).Minutes() + 3
		t.add(r.mode, fmt.Sprint(r.granted), fmt.Sprint(r.refused), r.elapsed.Round(time.Millisecond).String(), f1(one), f1(bound), fmt.Sprintf("%.2f×", float64(r.granted)/one))
		if r.mode == config.KeyLimitsFleet {
			notes = append(notes, fmt.Sprintf("With key_limits = \"fleet\" the three replicas granted %d, within the stated bound of %.1f: %s.",
				r.granted, bound, metOrMissed(float64(r.granted) <= bound)))
		}
	}
	lead := fmt.Sprintf("Three gateway processes with fleet sync on (load_interval %v) behind no balancer, one reference engine (%s): 24 closed-loop clients send "+
		"one-token completions of one API key (requests_per_minute = %d) to the replicas in turn for %v, starting %v after the replicas did. "+
		"One gateway would grant the limit's rate over the time since the replicas started (their buckets start empty with shared limits; "+
		"full with key_limits = \"replica\", and each replica counts alone). The stated bound adds, per replica, two load intervals "+
		"at the whole limit's rate (its first, counting alone, and the one its peers take to cut their parts) and one request of rounding.",
		keyLimitInterval, flatModel(0, keyLimitDecode), c.KeyLimitRPM, c.KeyLimitDuration, 3*keyLimitInterval)
	return section{title: "Fleet-wide key limits", lead: lead, tables: []*table{t}, notes: notes}
}
