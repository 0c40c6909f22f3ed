package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tlgate/tlgate/internal/testkit/leakcheck"
	"github.com/tlgate/tlgate/internal/testkit/syncbuf"
)

func TestMain(m *testing.M) {
	leakcheck.VerifyTestMain(m)
}

// syncBuffer is a log sink the gateway's goroutines share with the test.
type syncBuffer = syncbuf.Buffer

// running is run in a goroutine: cancel stops it, stop waits for its error.
type running struct {
	t              *testing.T
	cancel         context.CancelFunc
	done           chan error
	stdout, stderr *syncBuffer
	reload         chan os.Signal
	client         *http.Client
}

func startRun(t *testing.T, args ...string) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{t: t, cancel: cancel, done: make(chan error, 1), stdout: &syncBuffer{}, stderr: &syncBuffer{},
		reload: make(chan os.Signal), client: &http.Client{Transport: &http.Transport{}, Timeout: 10 * time.Second}}
	go func() { r.done <- run(ctx, args, r.stdout, r.stderr, r.reload) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.done: // stop already took it, or the test failed first
		case <-time.After(20 * time.Second):
			t.Error("run did not return within 20s of its context ending")
		}
		r.client.CloseIdleConnections()
	})
	return r
}

// stop cancels run's context and returns what run returned.
func (r *running) stop() error {
	r.t.Helper()
	r.cancel()
	select {
	case err := <-r.done:
		r.done <- err // for the cleanup
		return err
	case <-time.After(20 * time.Second):
		r.t.Fatal("run did not return within 20s of its context ending")
		return nil
	}
}

// await polls out for the first submatch of re, failing if run returns first.
func (r *running) await(out *syncBuffer, re *regexp.Regexp) string {
	r.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		if m := re.FindStringSubmatch(out.String()); m != nil {
			return m[len(m)-1]
		}
		select {
		case err := <-r.done:
			r.done <- err
			r.t.Fatalf("run returned %v before printing %v\nstdout:\n%s\nstderr:\n%s", err, re, r.stdout, r.stderr)
		default:
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("timed out waiting for %v\nstdout:\n%s\nstderr:\n%s", re, r.stdout, r.stderr)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// sendReload triggers a reload, as main does on SIGHUP.
func (r *running) sendReload() {
	r.t.Helper()
	select {
	case r.reload <- syscall.SIGHUP:
	case <-time.After(10 * time.Second):
		r.t.Fatal("run did not take the reload within 10s")
	}
}

type answer struct {
	status int
	header http.Header
	body   string
}

func (r *running) do(method, url, body string, header ...string) (answer, error) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		return answer{}, err
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := r.client.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return answer{}, fmt.Errorf("%s %s: read: %w", method, url, err)
	}
	return answer{status: resp.StatusCode, header: resp.Header, body: string(b)}, nil
}

func (r *running) get(url string) answer {
	r.t.Helper()
	a, err := r.do(http.MethodGet, url, "")
	if err != nil {
		r.t.Fatal(err)
	}
	return a
}

// curlCommand is one command the demo prints.
type curlCommand struct {
	url, body string
}

// parseCurls reads the curl commands in the demo's banner, joining
// continuation lines; a command with -d '...' is a POST of that body.
func parseCurls(out string) []curlCommand {
	var cmds []curlCommand
	lines := strings.Split(out, "\n")
	for i := 0; i < len(lines); i++ {
		l := strings.TrimSpace(lines[i])
		if !strings.HasPrefix(l, "curl ") {
			continue
		}
		for strings.HasSuffix(l, `\`) && i+1 < len(lines) {
			i++
			l = strings.TrimSuffix(l, `\`) + " " + strings.TrimSpace(lines[i])
		}
		var c curlCommand
		if _, after, ok := strings.Cut(l, "-d '"); ok {
			c.body, _, _ = strings.Cut(after, "'")
		}
		for _, f := range strings.Fields(l) {
			if strings.HasPrefix(f, "http://") {
				c.url = f
			}
		}
		cmds = append(cmds, c)
	}
	return cmds
}

// sseText checks that a streamed body ends with data: [DONE] and returns the
// concatenated text of its chunks (completions' text, chat's delta).
func sseText(body string) (string, error) {
	var sb strings.Builder
	var last string
	for _, line := range strings.Split(body, "\n") {
		p, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			continue
		}
		last = p
		if p == "[DONE]" {
			continue
		}
		var v struct {
			Choices []struct {
				Text  string `json:"text"`
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(p), &v); err != nil {
			return "", fmt.Errorf("chunk %q: %w", p, err)
		}
		for _, c := range v.Choices {
			sb.WriteString(c.Text + c.Delta.Content)
		}
	}
	if last != "[DONE]" {
		return "", fmt.Errorf("stream does not end with data: [DONE]: %q", body)
	}
	return sb.String(), nil
}

var demoURL = regexp.MustCompile(`tlgate demo is up: (http://127\.0\.0\.1:\d+) `)

// TestRunDemo runs the demo on free ports and every request its banner
// advertises, then stops it.
func TestRunDemo(t *testing.T) {
	r := startRun(t, "-demo", "-listen", "127.0.0.1:0", "-registry-listen", "127.0.0.1:0")
	base := r.await(r.stdout, demoURL)

	cmds := parseCurls(r.stdout.String())
	paths := map[string]curlCommand{}
	var cascades []curlCommand // the cascade's, in the banner's order
	for _, c := range cmds {
		if !strings.HasPrefix(c.url, base+"/") {
			t.Fatalf("command URL %q does not start with the gateway's address %s", c.url, base)
		}
		key := strings.TrimPrefix(c.url, base)
		if c.body != "" {
			var v struct {
				Model string `json:"model"`
			}
			if err := json.Unmarshal([]byte(c.body), &v); err != nil {
				t.Fatalf("command body %q: %v", c.body, err)
			}
			key += " " + v.Model
			if v.Model == "auto" {
				cascades = append(cascades, c)
			}
		}
		paths[key] = c
	}
	want := []string{"/admin/v1/routes", "/admin/v1/workers", "/metrics", "/v1/chat/completions smol",
		"/v1/completions auto", "/v1/completions big-pd", "/v1/models"}
	got := make([]string, 0, len(paths))
	for k := range paths {
		got = append(got, k)
	}
	slices.Sort(got)
	if !slices.Equal(got, want) || len(cmds) != len(want)+1 || len(cascades) != 2 {
		t.Fatalf("advertised commands %q (%d, %d of the cascade), want %q and two of the cascade", got, len(cmds), len(cascades), want)
	}
	// The cascade's first prompt is answered by its small model, the
	// second escalated to its large one, whichever version of the small
	// model (the canary's) a request draws.
	for i, c := range cascades {
		for range 6 {
			a, err := r.do(http.MethodPost, c.url, c.body)
			if err != nil || a.status != http.StatusOK {
				t.Fatalf("cascade command %d: %d %v %s", i, a.status, err, a.body)
			}
			if step := a.header.Get("X-TL-Cascade-Step"); step != strconv.Itoa(i) {
				t.Fatalf("cascade command %d (%s) answered by step %q, want %d: the banner says the first is accepted and the second escalated", i, c.body, step, i)
			}
		}
	}

	// The inference requests, at once (each streams for a few hundred ms).
	bigPD := paths["/v1/completions big-pd"]
	unified := strings.Replace(bigPD.body, `"model":"big-pd"`, `"model":"big"`, 1)
	if unified == bigPD.body {
		t.Fatalf("cannot rewrite the model of %q", bigPD.body)
	}
	posts := map[string]curlCommand{
		"chat":   paths["/v1/chat/completions smol"],
		"auto":   paths["/v1/completions auto"],
		"big-pd": bigPD,
		"big":    {url: bigPD.url, body: unified},
	}
	var mu sync.Mutex
	answers := map[string]answer{}
	var wg sync.WaitGroup
	for name, c := range posts {
		wg.Go(func() {
			a, err := r.do(http.MethodPost, c.url, c.body)
			if err != nil {
				t.Errorf("%s: %v", name, err)
				return
			}
			mu.Lock()
			answers[name] = a
			mu.Unlock()
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	for name, a := range answers {
		if a.status != http.StatusOK {
			t.Fatalf("%s: status %d: %s", name, a.status, a.body)
		}
	}
	if text, err := sseText(answers["chat"].body); err != nil || text == "" {
		t.Errorf("chat stream: text %q, err %v", text, err)
	}
	var cascade struct {
		Model   string `json:"model"`
		Choices []struct {
			Text string `json:"text"`
		} `json:"choices"`
	}
	if err := json.Unmarshal([]byte(answers["auto"].body), &cascade); err != nil || len(cascade.Choices) != 1 || cascade.Choices[0].Text == "" {
		t.Errorf("cascade answer %q: %v", answers["auto"].body, err)
	}
	if step := answers["auto"].header.Get("X-TL-Cascade-Step"); step != "0" && step != "1" {
		t.Errorf("cascade step header %q, want 0 or 1 (the demo has no keys: debug headers are on)", step)
	}
	pd, err := sseText(answers["big-pd"].body)
	if err != nil {
		t.Fatalf("big-pd: %v", err)
	}
	uni, err := sseText(answers["big"].body)
	if err != nil {
		t.Fatalf("big: %v", err)
	}
	if pd == "" || pd != uni {
		t.Errorf("disaggregated text %q differs from the unified one %q for the same seed", pd, uni)
	}
	if route := answers["big-pd"].header.Get("X-TL-Route"); !strings.HasPrefix(route, "big-decode-") {
		t.Errorf("big-pd served by %q, want a decode worker", route)
	}
	if route := answers["big"].header.Get("X-TL-Route"); route != "big-a" {
		t.Errorf("big served by %q, want the unified big-a", route)
	}

	var models struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if a := r.get(paths["/v1/models"].url); a.status != http.StatusOK || json.Unmarshal([]byte(a.body), &models) != nil {
		t.Fatalf("/v1/models: %d %s", a.status, a.body)
	}
	var ids []string
	for _, m := range models.Data {
		ids = append(ids, m.ID)
	}
	for _, id := range []string{"smol", "smol-latest", "auto", "big-pd", "big"} {
		if !slices.Contains(ids, id) {
			t.Errorf("/v1/models lists %q, missing %q", ids, id)
		}
	}

	var workers struct {
		Workers []struct {
			ID       string `json:"id"`
			Role     string `json:"role"`
			Routable bool   `json:"routable"`
			Source   string `json:"source"`
		} `json:"workers"`
	}
	if a := r.get(paths["/admin/v1/workers"].url); a.status != http.StatusOK || json.Unmarshal([]byte(a.body), &workers) != nil {
		t.Fatalf("/admin/v1/workers: %d %s", a.status, a.body)
	}
	if len(workers.Workers) != len(demoEngines)+len(demoProbed) {
		t.Errorf("%d workers listed, want %d: %+v", len(workers.Workers), len(demoEngines)+len(demoProbed), workers.Workers)
	}
	for _, w := range workers.Workers {
		// The large model's prefill and decode engines are probed as vLLM
		// servers; the others heartbeat.
		source := "heartbeat"
		if strings.HasPrefix(w.ID, "big-prefill-") || strings.HasPrefix(w.ID, "big-decode-") {
			source = "probe"
		}
		if !w.Routable || w.Source != source {
			t.Errorf("worker %+v: want routable, source %s", w, source)
		}
	}
	routes := r.get(paths["/admin/v1/routes"].url)
	if routes.status != http.StatusOK || routes.header.Get("ETag") == "" || !strings.Contains(routes.body, `"big-pd"`) {
		t.Fatalf("/admin/v1/routes: %d etag %q %s", routes.status, routes.header.Get("ETag"), routes.body)
	}
	// Writing the table back persists it in the demo's state dir, which
	// stopping the demo removes.
	put, err := r.do(http.MethodPut, paths["/admin/v1/routes"].url, routes.body, "If-Match", routes.header.Get("ETag"))
	if err != nil || put.status != http.StatusOK {
		t.Fatalf("PUT /admin/v1/routes: %v %d %s", err, put.status, put.body)
	}
	stateDir := demoConfig().Gateway.StateDir
	if _, err := os.Stat(stateDir); err != nil {
		t.Fatalf("demo state dir after a route write: %v", err)
	}
	if a := r.get(paths["/metrics"].url); a.status != http.StatusOK || !strings.Contains(a.body, "\ntlgate_requests_total{") {
		t.Errorf("/metrics: %d, no tlgate_requests_total series", a.status)
	} else if !strings.Contains(a.body, `tlgate_disagg_leg_duration_seconds_count{leg="prefill",protocol="vllm"} `) {
		t.Errorf("/metrics: no prefill leg over vLLM's protocol: the big-pd pair was not driven as vLLM servers\n%s", a.body)
	}

	httpAddr := strings.TrimPrefix(base, "http://")
	grpcAddr := regexp.MustCompile(`gRPC registry on (\S+)\)`).FindStringSubmatch(r.stdout.String())
	if grpcAddr == nil {
		t.Fatal("the banner does not name the registry address")
	}
	r.client.CloseIdleConnections()
	if err := r.stop(); err != nil {
		t.Fatalf("run returned %v after cancel", err)
	}
	for _, addr := range []string{httpAddr, grpcAddr[1]} {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			t.Errorf("%s still accepts connections after run returned", addr)
		}
	}
	if _, err := os.Stat(stateDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("demo state dir %s left behind: %v", stateDir, err)
	}
}

// fakeVLLM is a vLLM-like engine: /health, /metrics with vLLM's names,
// /v1/models and /v1/completions.
func fakeVLLM(t *testing.T, model string) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {})
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		fmt.Fprintf(w, `# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name=%[1]q} 1.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name=%[1]q} 0.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name=%[1]q} 0.25
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="800"} 1.0
`, model)
	})
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"object":"list","data":[{"id":%q,"object":"model","owned_by":"vllm"}]}`, model)
	})
	mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"cmpl-1","object":"text_completion","model":%q,"choices":[{"index":0,"text":"from %s","logprobs":null,"finish_reason":"stop"}]}`, model, model)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

type workerRow struct {
	ID       string `json:"id"`
	Model    string `json:"model"`
	Source   string `json:"source"`
	Kind     string `json:"kind"`
	Routable bool   `json:"routable"`
	KVTotal  int    `json:"kv_total_blocks"`
	Running  int    `json:"running"`
}

func (r *running) workers(base string) map[string]workerRow {
	r.t.Helper()
	a := r.get(base + "/admin/v1/workers")
	var v struct {
		Workers []workerRow `json:"workers"`
	}
	if a.status != http.StatusOK || json.Unmarshal([]byte(a.body), &v) != nil {
		r.t.Fatalf("/admin/v1/workers: %d %s", a.status, a.body)
	}
	out := map[string]workerRow{}
	for _, w := range v.Workers {
		out[w.ID] = w
	}
	return out
}

// waitWorkers polls the admin API until the routable workers are ids.
func (r *running) waitWorkers(base string, ids ...string) map[string]workerRow {
	r.t.Helper()
	slices.Sort(ids)
	deadline := time.Now().Add(10 * time.Second)
	for {
		ws := r.workers(base)
		var got []string
		for id, w := range ws {
			if w.Routable {
				got = append(got, id)
			}
		}
		slices.Sort(got)
		if slices.Equal(got, ids) && len(ws) == len(ids) {
			return ws
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("workers %v, want %v routable\nstderr:\n%s", ws, ids, r.stderr)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func engineTOML(id, addr, model string) string {
	return fmt.Sprintf(`
[[gateway.engines]]
id = %q
http_address = %q
model = %q
kind = "vllm"
probe_interval = "50ms"
`, id, addr, model)
}

// countLines counts the JSON log lines with message msg whose fields
// include every key=value of fields.
func countLines(t *testing.T, log, msg string, fields map[string]string) int {
	t.Helper()
	n := 0
	sc := bufio.NewScanner(strings.NewReader(log))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
next:
	for sc.Scan() {
		var line map[string]any
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatalf("log line %q is not JSON: %v", sc.Text(), err)
		}
		if line["message"] != msg {
			continue
		}
		for k, v := range fields {
			if line[k] != v {
				continue next
			}
		}
		n++
	}
	return n
}

// TestRunConfigAndSIGHUP runs from a configuration file and reloads it:
// the probed engines follow the file, a bad file changes nothing.
func TestRunConfigAndSIGHUP(t *testing.T) {
	keep, gone, added := fakeVLLM(t, "keep-m"), fakeVLLM(t, "gone-m"), fakeVLLM(t, "added-m")
	addr := func(s *httptest.Server) string { return s.Listener.Addr().String() }
	path, head, write := configFile(t, `heartbeat_interval = "1s"`+"\n")
	write(head + engineTOML("keep", addr(keep), "keep-m") + engineTOML("gone", addr(gone), "gone-m"))

	r := startRun(t, "-config", path)
	listen := r.await(r.stderr, regexp.MustCompile(`"listen":"(127\.0\.0\.1:\d+)"[^\n]*"message":"gateway started"`))
	base := "http://" + listen
	ws := r.waitWorkers(base, "keep", "gone")
	for id, model := range map[string]string{"keep": "keep-m", "gone": "gone-m"} {
		if w := ws[id]; w.Source != "probe" || w.Kind != "vllm" || w.Model != model || w.KVTotal != 800 || w.Running != 1 {
			t.Fatalf("worker %s %+v: want a probed vllm worker of %s with the figures of its /metrics", id, w, model)
		}
	}

	// Reload: gone removed, added added, keep untouched.
	write(head + engineTOML("added", addr(added), "added-m") + engineTOML("keep", addr(keep), "keep-m"))
	r.sendReload()
	r.await(r.stderr, regexp.MustCompile(`"engines":(2),[^\n]*"message":"reloaded the API keys, the registry tokens and the probed engines"`))
	ws = r.waitWorkers(base, "keep", "added")
	if w := ws["added"]; w.Source != "probe" || w.Kind != "vllm" || w.Model != "added-m" {
		t.Fatalf("added worker %+v", w)
	}
	a, err := r.do(http.MethodPost, base+"/v1/completions", `{"model":"added-m","prompt":"hi"}`)
	if err != nil || a.status != http.StatusOK || !strings.Contains(a.body, "from added-m") {
		t.Fatalf("request to the added engine: %v %d %s", err, a.status, a.body)
	}
	if n := countLines(t, r.stderr.String(), "worker registered", map[string]string{"worker": "keep"}); n != 1 {
		t.Fatalf("keep registered %d times, want once: the reload disturbed an unchanged engine", n)
	}

	// Bad files: a syntax error, then a well-formed file that fails
	// validation (and would drop "added"): both refused whole.
	for i, bad := range []string{
		head + "[[gateway.engines]\n",
		head + `route_policy = "fastest"` + "\n" + engineTOML("keep", addr(keep), "keep-m"),
	} {
		write(bad)
		r.sendReload()
		r.await(r.stderr, regexp.MustCompile(fmt.Sprintf(`(?s)("message":"reload refused; nothing changed".*){%d}`, i+1)))
		ws := r.waitWorkers(base, "keep", "added")
		if ws["added"].Source != "probe" {
			t.Fatalf("after a refused reload: %+v", ws)
		}
	}
	if a := r.get(base + "/healthz"); a.status != http.StatusOK {
		t.Fatalf("/healthz after refused reloads: %d", a.status)
	}
	if n := countLines(t, r.stderr.String(), "worker registered", map[string]string{"worker": "added"}); n != 1 {
		t.Fatalf("added registered %d times, want once", n)
	}
	r.client.CloseIdleConnections()
	if err := r.stop(); err != nil {
		t.Fatalf("run returned %v after cancel", err)
	}
}

// TestRunFlagErrors: bad command lines are refused before anything starts,
// with an error naming the flag.
func TestRunFlagErrors(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing.toml")
	plain := filepath.Join(t.TempDir(), "plain.toml")
	if err := os.WriteFile(plain, []byte("[gateway]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		want string // in the error
		is   error  // or errors.Is
	}{
		{"demo and config", []string{"-demo", "-config", missing}, "-demo and -config are exclusive", nil},
		{"no flags", nil, "-config FILE or -demo is required", nil},
		{"bad log format", []string{"-demo", "-log-format", "xml"}, `-log-format: must be json or console, got "xml"`, nil},
		{"bad log level", []string{"-demo", "-log-level", "loud"}, "-log-level:", nil},
		{"bad listen", []string{"-demo", "-listen", "nowhere"}, `-listen: gateway.listen: want host:port, got "nowhere"`, nil},
		{"bad registry listen", []string{"-demo", "-registry-listen", "127.0.0.1:x"}, "-registry-listen: gateway.registry_listen: port must be", nil},
		{"open without keys", []string{"-demo", "-listen", "0.0.0.0:0"}, "-listen: gateway.api_keys: required when a listener is not on loopback", nil},
		{"missing config", []string{"-config", missing}, "missing.toml", nil},
		{"bad otlp endpoint", []string{"-demo", "-otlp-endpoint", "127.0.0.1:4317"}, "-otlp-endpoint: gateway.tracing.endpoint: must be an http:// or https:// URL", nil},
		{"unknown flag", []string{"-verbose"}, "flag provided but not defined: -verbose", nil},
		{"stray argument", []string{"-demo", "extra"}, `unexpected argument "extra"`, nil},
		{"help", []string{"-h"}, "", flag.ErrHelp},
		{"no replicas", []string{"-demo", "-replicas", "0"}, "-replicas: must be from 1 to", nil},
		{"replicas without demo", []string{"-config", plain, "-replicas", "2"}, "-replicas needs -demo", nil},
		{"seed without etcd", []string{"-config", plain, "-seed-from", missing}, "-seed-from needs a -config whose [gateway.store] kind is \"etcd\"", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := run(context.Background(), tt.args, &stdout, &stderr, nil)
			switch {
			case err == nil:
				t.Fatal("run accepted the command line")
			case tt.is != nil && !errors.Is(err, tt.is):
				t.Fatalf("error %v, want %v", err, tt.is)
			case tt.is == nil && !strings.Contains(err.Error(), tt.want):
				t.Fatalf("error %q, want it to contain %q", err, tt.want)
			}
			if stdout.Len() != 0 {
				t.Fatalf("printed %q on a refused command line", stdout.String())
			}
		})
	}
}

// TestSIGHUPReloadsKeys: a reload applies the file's API keys and their
// limits: a rotated secret stops working and its successor works at once,
// a new key works under its limit; a file with no keys left is refused
// (authentication is not turned off by a reload) and the keys stay.
func TestSIGHUPReloadsKeys(t *testing.T) {
	eng := fakeVLLM(t, "m")
	path, head, write := configFile(t, "")
	key := func(name, secret string, rpm int) string {
		return fmt.Sprintf("\n[[gateway.api_keys]]\nname = %q\nkey = %q\nscopes = [\"inference\"]\nrequests_per_minute = %d\n", name, secret, rpm)
	}
	engine := engineTOML("e", eng.Listener.Addr().String(), "m")
	write(head + key("alice", "sk-alice-1", 0) + engine)
	r := startRun(t, "-config", path)
	listen := r.await(r.stderr, regexp.MustCompile(`"listen":"(127\.0\.0\.1:\d+)"[^\n]*"message":"gateway started"`))
	complete := func(secret string) int {
		t.Helper()
		a, err := r.do(http.MethodPost, "http://"+listen+"/v1/completions", `{"model":"m","prompt":"hi"}`, "Authorization", "Bearer "+secret)
		if err != nil {
			t.Fatal(err)
		}
		return a.status
	}
	for deadline := time.Now().Add(10 * time.Second); complete("sk-alice-1") != http.StatusOK; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the probed engine never served alice")
		}
	}

	write(head + key("alice", "sk-alice-2", 0) + key("bob", "sk-bob", 1) + engine)
	r.sendReload()
	r.await(r.stderr, regexp.MustCompile(`"api_keys":(2),[^\n]*"message":"reloaded the API keys, the registry tokens and the probed engines"`))
	for secret, want := range map[string]int{"sk-alice-1": http.StatusUnauthorized, "sk-alice-2": http.StatusOK} {
		if got := complete(secret); got != want {
			t.Errorf("after the rotation, %s: %d, want %d", secret, got, want)
		}
	}
	if got := complete("sk-bob"); got != http.StatusOK {
		t.Errorf("the new key: %d, want 200", got)
	}
	if got := complete("sk-bob"); got != http.StatusTooManyRequests {
		t.Errorf("the new key over its 1 request a minute: %d, want 429", got)
	}

	write(head + engine) // no keys: auth would be off
	r.sendReload()
	r.await(r.stderr, regexp.MustCompile(`"error":"gateway.api_keys: (auth: a reload cannot turn authentication off)[^\n]*"message":"reload refused; nothing changed"`))
	if got := complete("sk-alice-2"); got != http.StatusOK {
		t.Errorf("after the refused reload, alice: %d, want 200", got)
	}
	if a, err := r.do(http.MethodPost, "http://"+listen+"/v1/completions", `{"model":"m","prompt":"hi"}`); err != nil || a.status != http.StatusUnauthorized {
		t.Errorf("after the refused reload, no key: %v %d, want 401", err, a.status)
	}
}

// configFile returns the path of a configuration file in a fresh
// directory, the [gateway] head every version of it starts with (loopback
// listeners on OS-chosen ports, a state_dir, JSON logs, no shutdown
// delay, then extra), and a
// function that writes a version.
func configFile(t *testing.T, extra string) (path, head string, write func(string)) {
	t.Helper()
	dir := t.TempDir()
	path = filepath.Join(dir, "tlgate.toml")
	head = fmt.Sprintf(`
[gateway]
listen = "127.0.0.1:0"
registry_listen = "127.0.0.1:0"
state_dir = %q
log_format = "json"
shutdown_delay = "0s"
`, filepath.Join(dir, "state")) + extra
	write = func(s string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return path, head, write
}
