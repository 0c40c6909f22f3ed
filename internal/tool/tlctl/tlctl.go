// Package tlctl is the admin command line of tlgate: it lists the workers,
// gets and puts the route table with its ETag, drains and resumes models,
// and lifts a worker's ejection, over the gateway's admin API. cmd/tlctl is its main; the logic
// lives here so tests can run it against a real gateway in-process.
//
//	tlctl [flags] workers
//	tlctl [flags] routes get [-f FILE]        (writes FILE and FILE.etag)
//	tlctl [flags] routes put -f FILE [-etag ETAG]
//	tlctl [flags] routes diff -f FILE [-etag ETAG]  (what put would change; changes nothing)
//	tlctl [flags] drain MODEL
//	tlctl [flags] resume MODEL
//	tlctl [flags] lift WORKER
//
// TLGATE_URL and TLGATE_KEY give the gateway's address and the admin key;
// -url overrides the address and -key-file FILE the key (read from FILE). A
// key is never taken on the command line, where ps and the shell's history
// would show it: -key is refused. Errors never show a URL's user name or
// password. Output is a table, or JSON with -o json.
// A refused call prints the server's message and exits 1; a usage error
// exits 2.
package tlctl

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// DefaultURL is the gateway's address when neither -url nor TLGATE_URL
// says otherwise.
const DefaultURL = "http://127.0.0.1:8080"

// Exit codes.
const (
	ExitOK     = 0
	ExitFailed = 1 // the gateway refused or could not be reached
	ExitUsage  = 2 // bad command line
)

const (
	etagSuffix  = ".etag" // routes get -f FILE writes the ETag to FILE.etag
	defaultWait = 10 * time.Second
)

// ErrUsage marks a bad command line.
var ErrUsage = errors.New("usage")

// APIError is a refusal from the gateway: its status and OpenAI-shaped
// error.
type APIError struct {
	Status  int
	Code    string
	Message string
	Param   string
}

func (e *APIError) Error() string {
	s := fmt.Sprintf("%d %s: %s", e.Status, e.Code, e.Message)
	if e.Param != "" {
		s += " (field " + e.Param + ")"
	}
	return s
}

// Env reads environment variables (os.Getenv in main).
type Env func(string) string

// Run runs one tlctl command line (without the program name) and returns
// its exit code.
func Run(ctx context.Context, args []string, env Env, stdout, stderr io.Writer) int {
	err := run(ctx, args, env, stdout, stderr)
	switch {
	case err == nil:
		return ExitOK
	case errors.Is(err, flag.ErrHelp):
		return ExitOK
	case errors.Is(err, ErrUsage):
		fmt.Fprintf(stderr, "tlctl: %v\n\n%s", err, usage)
		return ExitUsage
	default:
		fmt.Fprintf(stderr, "tlctl: %v\n", err)
		return ExitFailed
	}
}

const usage = `Usage: tlctl [-url URL] [-key-file FILE] [-o table|json] COMMAND

Commands:
  workers                           the workers, their load and routability
  routes get [-f FILE]              the route table (FILE and FILE.etag, or stdout)
  routes put -f FILE [-etag ETAG]   replace the table; If-Match is ETAG or FILE.etag
  routes diff -f FILE [-etag ETAG]  what routes put would change, and its warnings,
                                    changing nothing (If-Match as put's, when known)
  drain MODEL                       stop routing to MODEL's workers
  resume MODEL                      route to MODEL's workers again
  lift WORKER                       end WORKER's ejection (every replica, with fleet sync)

Environment: TLGATE_URL (default ` + DefaultURL + `), TLGATE_KEY (an admin key;
-key-file FILE reads it from FILE instead). The key is never given on the
command line, where ps would show it.
`

type client struct {
	base   *url.URL
	key    string
	http   *http.Client
	output string
	out    io.Writer
	errOut io.Writer
}

func run(ctx context.Context, args []string, env Env, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("tlctl", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	base := fs.String("url", env("TLGATE_URL"), "gateway URL")
	keyFile := fs.String("key-file", "", "file holding the admin key")
	var keyFlag bool
	fs.Func("key", "refused: the key would show in ps", func(string) error { keyFlag = true; return nil })
	output := fs.String("o", "table", "output: table or json")
	timeout := fs.Duration("timeout", defaultWait, "time limit of each call")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, usage)
			return err
		}
		return fmt.Errorf("%w: %v", ErrUsage, redactText(err.Error()))
	}
	if keyFlag {
		return fmt.Errorf("%w: -key is refused: the admin key would show in ps and the shell's history; set TLGATE_KEY or use -key-file FILE", ErrUsage)
	}
	key, err := adminKey(env, *keyFile)
	if err != nil {
		return err
	}
	if *output != "table" && *output != "json" {
		return fmt.Errorf("%w: -o %q: want table or json", ErrUsage, *output)
	}
	if *base == "" {
		*base = DefaultURL
	}
	u, err := url.Parse(*base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%w: gateway URL %q: want http(s)://host:port", ErrUsage, redactText(*base))
	}
	c := &client{base: u, key: key, http: &http.Client{Timeout: *timeout}, output: *output, out: stdout, errOut: stderr}
	rest := fs.Args()
	if len(rest) == 0 {
		return fmt.Errorf("%w: no command", ErrUsage)
	}
	switch cmd, rest := rest[0], rest[1:]; cmd {
	case "workers":
		if len(rest) > 0 {
			return fmt.Errorf("%w: workers takes no argument", ErrUsage)
		}
		return c.workers(ctx)
	case "routes":
		if len(rest) == 0 {
			return fmt.Errorf("%w: routes get, put or diff", ErrUsage)
		}
		switch rest[0] {
		case "get":
			return c.routesGet(ctx, rest[1:])
		case "put":
			return c.routesPut(ctx, rest[1:], false)
		case "diff":
			return c.routesPut(ctx, rest[1:], true)
		}
		return fmt.Errorf("%w: routes %q: want get, put or diff", ErrUsage, rest[0])
	case "drain", "resume":
		if len(rest) != 1 || rest[0] == "" {
			return fmt.Errorf("%w: %s MODEL", ErrUsage, cmd)
		}
		return c.drain(ctx, cmd, rest[0])
	case "lift":
		if len(rest) != 1 || rest[0] == "" {
			return fmt.Errorf("%w: lift WORKER", ErrUsage)
		}
		return c.lift(ctx, rest[0])
	case "help":
		fmt.Fprint(stdout, usage)
		return nil
	default:
		return fmt.Errorf("%w: unknown command %q", ErrUsage, cmd)
	}
}

// call sends one request to path (with its query, if any) and returns the
// answer's body and headers; a status other than want is an *APIError.
func (c *client) call(ctx context.Context, method, path string, body []byte, hdr http.Header, want int) ([]byte, http.Header, error) {
	p, query, _ := strings.Cut(path, "?")
	u := c.base.JoinPath(p)
	u.RawQuery = query
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		return nil, nil, fmt.Errorf("%s %s: %s", method, redactURL(u), redactText(err.Error()))
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.key != "" {
		req.Header.Set("Authorization", "Bearer "+c.key)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			ue.URL = redactURL(u)
		}
		return nil, nil, fmt.Errorf("%s %s: %w", method, redactURL(u), err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, nil, fmt.Errorf("%s %s: reading the answer: %w", method, redactURL(u), err)
	}
	if resp.StatusCode != want {
		err := apiError(resp.StatusCode, b)
		if resp.StatusCode == http.StatusUnauthorized && c.key == "" {
			err = fmt.Errorf("%w; tlctl sent no key: set TLGATE_KEY to an admin key (or use -key-file FILE)", err)
		}
		return nil, resp.Header, err
	}
	return b, resp.Header, nil
}

// adminKey is the admin key: FILE's content (trimmed of surrounding white
// space) when -key-file is set, else TLGATE_KEY.
func adminKey(env Env, file string) (string, error) {
	if file == "" {
		return env("TLGATE_KEY"), nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("-key-file: %w", err)
	}
	k := strings.TrimSpace(string(b))
	if k == "" {
		return "", fmt.Errorf("-key-file %s: the file is empty", file)
	}
	return k, nil
}

// redactURL is u as text with its user name and password, if any, replaced
// by "redacted".
func redactURL(u *url.URL) string {
	if u.User == nil {
		return u.String()
	}
	r := *u
	r.User = url.User("redacted")
	return r.String()
}

// redactText replaces the user information of every URL in s (what lies
// between "://" and an "@" before the host's end) by "redacted", for text
// that holds a URL which did not parse.
func redactText(s string) string {
	var b strings.Builder
	for {
		i := strings.Index(s, "://")
		if i < 0 {
			b.WriteString(s)
			return b.String()
		}
		b.WriteString(s[:i+3])
		s = s[i+3:]
		end := strings.IndexAny(s, "/?#\" \t\n")
		if end < 0 {
			end = len(s)
		}
		if at := strings.LastIndex(s[:end], "@"); at >= 0 {
			b.WriteString("redacted")
			s = s[at:]
		}
	}
}

func apiError(status int, b []byte) error {
	var e struct {
		Error struct {
			Message string  `json:"message"`
			Code    string  `json:"code"`
			Param   *string `json:"param"`
		} `json:"error"`
	}
	ae := &APIError{Status: status}
	if json.Unmarshal(b, &e) == nil && e.Error.Message != "" {
		ae.Code, ae.Message = e.Error.Code, e.Error.Message
		if e.Error.Param != nil {
			ae.Param = *e.Error.Param
		}
		return ae
	}
	ae.Code = http.StatusText(status)
	ae.Message = strings.TrimSpace(string(b))
	if len(ae.Message) > 200 {
		ae.Message = ae.Message[:200] + "…"
	}
	return ae
}

// worker is the part of an admin worker the table shows; JSON output
// passes the gateway's body through whole.
type worker struct {
	ID            string `json:"id"`
	Model         string `json:"model"`
	Role          string `json:"role"`
	Source        string `json:"source"`
	HTTPAddress   string `json:"http_address"`
	QueueDepth    int    `json:"queue_depth"`
	Running       int    `json:"running"`
	InFlight      int    `json:"in_flight"`
	PeerInFlight  int    `json:"peer_in_flight"`
	State         string `json:"state"`
	LastError     string `json:"last_error"`
	DownSince     string `json:"down_since"`
	KVFreeBlocks  int    `json:"kv_free_blocks"`
	KVTotalBlocks int    `json:"kv_total_blocks"`
	// CacheView is how cache_aware sees the worker's cache: exact (its
	// KV events), stale or approximate ("" under other policies).
	CacheView     string `json:"cache_view"`
	Draining      bool   `json:"draining"`
	Drained       bool   `json:"drained"`
	Routable      bool   `json:"routable"`
	EjectedUntil  string `json:"ejected_until"`
	LastHeartbeat string `json:"last_heartbeat"`
	// ConsecutiveFailures > 0 on a routable worker: suspect, one request
	// at a time until it answers.
	ConsecutiveFailures int `json:"consecutive_failures"`
}

func (c *client) workers(ctx context.Context) error {
	b, _, err := c.call(ctx, http.MethodGet, "/admin/v1/workers", nil, nil, http.StatusOK)
	if err != nil {
		return err
	}
	if c.output == "json" {
		return writeAll(c.out, b)
	}
	var body struct {
		Epoch   uint64   `json:"epoch"`
		Workers []worker `json:"workers"`
	}
	if err := json.Unmarshal(b, &body); err != nil {
		return fmt.Errorf("workers: the gateway's answer is not a worker list: %w", err)
	}
	tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tMODEL\tROLE\tSOURCE\tSTATE\tQUEUE\tRUNNING\tIN FLIGHT\tPEER IN FLIGHT\tKV USED\tCACHE VIEW\tHEARTBEAT\tADDRESS")
	now := time.Now()
	var down []worker
	for _, w := range body.Workers {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t%s\n", w.ID, dash(w.Model), w.Role, w.Source, state(w, now),
			w.QueueDepth, w.Running, w.InFlight, w.PeerInFlight, kvUsed(w), dash(w.CacheView), age(w.LastHeartbeat, now), w.HTTPAddress)
		if w.LastError != "" {
			down = append(down, w)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, w := range down {
		fmt.Fprintf(c.out, "%s is down (since %s): %s\n", w.ID, age(w.DownSince, now), w.LastError)
	}
	fmt.Fprintf(c.errOut, "%d worker(s), route table epoch %d\n", len(body.Workers), body.Epoch)
	return nil
}

// state says why a worker is or is not routable: the gateway's word, or
// (from a gateway that does not say) what its fields show.
func state(w worker, now time.Time) string {
	if w.State != "" {
		return w.State
	}
	switch {
	case w.EjectedUntil != "":
		if t, err := time.Parse(time.RFC3339Nano, w.EjectedUntil); err == nil && t.After(now) {
			return "ejected"
		}
	}
	switch {
	case w.Drained:
		return "drained"
	case w.Draining:
		return "draining"
	case w.Routable && w.ConsecutiveFailures > 0:
		return "suspect"
	case w.Routable:
		return "routable"
	}
	return "unroutable"
}

func kvUsed(w worker) string {
	if w.KVTotalBlocks <= 0 {
		return "-"
	}
	used := w.KVTotalBlocks - w.KVFreeBlocks
	return strconv.Itoa(used*100/w.KVTotalBlocks) + "%"
}

func age(ts string, now time.Time) string {
	t, err := time.Parse(time.RFC3339Nano, ts)
	if err != nil {
		return "-"
	}
	return now.Sub(t).Round(100*time.Millisecond).String() + " ago"
}

func (c *client) routesGet(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("routes get", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	file := fs.String("f", "", "write the table to FILE and its ETag to FILE.etag")
	if err := fs.Parse(args); err != nil || fs.NArg() > 0 {
		return fmt.Errorf("%w: routes get [-f FILE]", ErrUsage)
	}
	b, h, err := c.call(ctx, http.MethodGet, "/admin/v1/routes", nil, nil, http.StatusOK)
	if err != nil {
		return err
	}
	etag := h.Get("ETag")
	if *file == "" {
		if c.output == "table" {
			if err := c.routesTable(b); err != nil {
				return err
			}
		} else if err := writeAll(c.out, b); err != nil {
			return err
		}
		fmt.Fprintf(c.errOut, "ETag: %s\n", etag)
		return nil
	}
	pretty, err := indent(b)
	if err != nil {
		return err
	}
	if err := os.WriteFile(*file, pretty, 0o644); err != nil {
		return fmt.Errorf("routes get: %w", err)
	}
	if err := os.WriteFile(*file+etagSuffix, []byte(etag+"\n"), 0o644); err != nil {
		return fmt.Errorf("routes get: %w", err)
	}
	fmt.Fprintf(c.out, "wrote %s and %s (ETag %s)\n", *file, *file+etagSuffix, etag)
	return nil
}

// putBody is the answer to a PUT of the route table (a dry run's too).
type putBody struct {
	DryRun   bool              `json:"dry_run"`
	Epoch    uint64            `json:"epoch"`
	Changes  []json.RawMessage `json:"changes"`
	Warnings []struct {
		Path    string `json:"path"`
		Message string `json:"message"`
	} `json:"warnings"`
}

// routesPut installs FILE (If-Match: -etag, else FILE.etag), or with dry
// shows what installing it would change, changing nothing (If-Match only
// when one is known: a stale one is refused as put's would be).
func (c *client) routesPut(ctx context.Context, args []string, dry bool) error {
	name := "routes put"
	if dry {
		name = "routes diff"
	}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	file := fs.String("f", "", "the table to install (JSON, as routes get writes it)")
	etag := fs.String("etag", "", "If-Match (default: the content of FILE.etag)")
	if err := fs.Parse(args); err != nil || fs.NArg() > 0 || *file == "" {
		return fmt.Errorf("%w: %s -f FILE [-etag ETAG]", ErrUsage, name)
	}
	body, err := os.ReadFile(*file)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if !json.Valid(body) {
		return fmt.Errorf("%s: %s is not JSON", name, *file)
	}
	if *etag == "" {
		b, err := os.ReadFile(*file + etagSuffix)
		switch {
		case err == nil:
			*etag = strings.TrimSpace(string(b))
		case !dry:
			return fmt.Errorf("routes put: no -etag and no %s (run routes get -f %s first): %w", *file+etagSuffix, *file, err)
		}
	}
	path := "/admin/v1/routes"
	hdr := http.Header{}
	if *etag != "" {
		hdr.Set("If-Match", *etag)
	}
	if dry {
		path += "?dry_run=true"
	}
	b, h, err := c.call(ctx, http.MethodPut, path, body, hdr, http.StatusOK)
	var ae *APIError
	if errors.As(err, &ae) && ae.Status == http.StatusPreconditionFailed {
		return fmt.Errorf("%w; the table changed since %s was read (now ETag %s): run routes get again and reapply your change", err, *file, h.Get("ETag"))
	}
	if err != nil {
		return err
	}
	var pb putBody
	if err := json.Unmarshal(b, &pb); err != nil {
		return fmt.Errorf("%s: the gateway's answer is not a route table: %w", name, err)
	}
	if dry {
		if c.output == "json" {
			return writeAll(c.out, b)
		}
		return c.printDiff(pb, h.Get("ETag"))
	}
	next := h.Get("ETag")
	if err := os.WriteFile(*file+etagSuffix, []byte(next+"\n"), 0o644); err != nil {
		return fmt.Errorf("routes put: installed as %s, but %w", next, err)
	}
	for _, w := range pb.Warnings {
		fmt.Fprintf(c.errOut, "warning: %s: %s\n", w.Path, w.Message)
	}
	if c.output == "json" {
		return writeAll(c.out, b)
	}
	fmt.Fprintf(c.out, "installed; ETag %s (written to %s)\n", next, *file+etagSuffix)
	return nil
}

// printDiff shows a dry run: each route added (+), removed (-) or changed
// (~, with the fields that differ and the route before and after), then
// the warnings.
func (c *client) printDiff(pb putBody, etag string) error {
	type change struct {
		Model  string          `json:"model"`
		Kind   string          `json:"change"`
		Fields []string        `json:"fields"`
		Before json.RawMessage `json:"before"`
		After  json.RawMessage `json:"after"`
	}
	if len(pb.Changes) == 0 {
		fmt.Fprintf(c.out, "no change to the table in force (ETag %s)\n", etag)
	}
	for _, raw := range pb.Changes {
		var ch change
		if err := json.Unmarshal(raw, &ch); err != nil {
			return fmt.Errorf("routes diff: the gateway's answer has a change that is not one: %w", err)
		}
		switch ch.Kind {
		case "added":
			fmt.Fprintf(c.out, "+ %s (added): %s\n", ch.Model, ch.After)
		case "removed":
			fmt.Fprintf(c.out, "- %s (removed): %s\n", ch.Model, ch.Before)
		default:
			fmt.Fprintf(c.out, "~ %s (%s changed)\n    before: %s\n    after:  %s\n", ch.Model, strings.Join(ch.Fields, ", "), ch.Before, ch.After)
		}
	}
	for _, w := range pb.Warnings {
		fmt.Fprintf(c.out, "warning: %s: %s\n", w.Path, w.Message)
	}
	fmt.Fprintf(c.errOut, "dry run against the table in force (ETag %s): nothing was changed\n", etag)
	return nil
}

type route struct {
	Model    string   `json:"model"`
	Aliases  []string `json:"aliases"`
	Backends []struct {
		Model  string  `json:"model"`
		Weight float64 `json:"weight"`
	} `json:"backends"`
	Cascade []struct {
		Model    string `json:"model"`
		AcceptIf string `json:"accept_if"`
	} `json:"cascade"`
	Targets []string `json:"targets"`
}

func (c *client) routesTable(b []byte) error {
	var body struct {
		Epoch  uint64  `json:"epoch"`
		Routes []route `json:"routes"`
	}
	if err := json.Unmarshal(b, &body); err != nil {
		return fmt.Errorf("routes: the gateway's answer is not a route table: %w", err)
	}
	sort.Slice(body.Routes, func(i, j int) bool { return body.Routes[i].Model < body.Routes[j].Model })
	tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MODEL\tALIASES\tSERVED BY\tTARGETS")
	for _, r := range body.Routes {
		var served []string
		for _, bk := range r.Backends {
			served = append(served, fmt.Sprintf("%s (%g)", bk.Model, bk.Weight))
		}
		for i, s := range r.Cascade {
			step := s.Model
			if s.AcceptIf != "" {
				step += " if " + s.AcceptIf
			}
			if i > 0 {
				step = "→ " + step
			}
			served = append(served, step)
		}
		if len(served) == 0 {
			served = []string{r.Model}
		}
		targets := strings.Join(r.Targets, ",")
		if targets == "" {
			targets = "unified"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.Model, dash(strings.Join(r.Aliases, ",")), strings.Join(served, ", "), targets)
	}
	return tw.Flush()
}

func (c *client) drain(ctx context.Context, action, model string) error {
	b, _, err := c.call(ctx, http.MethodPost, "/admin/v1/models/"+url.PathEscape(model)+":"+action, nil, nil, http.StatusAccepted)
	if err != nil {
		return err
	}
	if c.output == "json" {
		return writeAll(c.out, b)
	}
	var body struct {
		Model   string   `json:"model"`
		Drained []string `json:"drained"`
		Resumed []string `json:"resumed"`
		Workers int      `json:"workers"`
	}
	if err := json.Unmarshal(b, &body); err != nil {
		return fmt.Errorf("%s: the gateway's answer is not a drain result: %w", action, err)
	}
	models := body.Drained
	verb := "drained"
	if action == "resume" {
		models, verb = body.Resumed, "resumed"
	}
	fmt.Fprintf(c.out, "%s %s: served models %s, %d worker(s)\n", verb, body.Model, dash(strings.Join(models, ", ")), body.Workers)
	return nil
}

// lift ends worker's ejection through the gateway (and, with fleet sync,
// on every replica).
func (c *client) lift(ctx context.Context, worker string) error {
	b, _, err := c.call(ctx, http.MethodPost, "/admin/v1/workers/"+url.PathEscape(worker)+":lift-ejection", nil, nil, http.StatusOK)
	if err != nil {
		return err
	}
	if c.output == "json" {
		return writeAll(c.out, b)
	}
	var body struct {
		Worker string `json:"worker"`
		Lifted bool   `json:"lifted"`
		Fleet  bool   `json:"fleet"`
	}
	if err := json.Unmarshal(b, &body); err != nil {
		return fmt.Errorf("lift: the gateway's answer is not a lift result: %w", err)
	}
	here := "was not ejected on this replica"
	if body.Lifted {
		here = "ejection lifted on this replica"
	}
	fleet := "; fleet sync is off: the other replicas keep theirs"
	if body.Fleet {
		fleet = "; the other replicas were told to lift theirs"
	}
	fmt.Fprintf(c.out, "%s: %s%s\n", body.Worker, here, fleet)
	return nil
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func indent(b []byte) ([]byte, error) {
	var out bytes.Buffer
	if err := json.Indent(&out, b, "", "  "); err != nil {
		return nil, fmt.Errorf("routes: the gateway's answer is not JSON: %w", err)
	}
	out.WriteByte('\n')
	return out.Bytes(), nil
}

func writeAll(w io.Writer, b []byte) error {
	if len(b) > 0 && b[len(b)-1] != '\n' {
		b = append(b, '\n')
	}
	_, err := w.Write(b)
	return err
}
