package test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/adapter/config"
)

// responsesClient is openai-go's client for the gateway with key, no
// retries (a retry would hide the gateway's answer).
func responsesClient(c *cluster, key string) openai.Client {
	return openai.NewClient(option.WithBaseURL(c.url+"/v1/"), option.WithAPIKey(key), option.WithMaxRetries(0))
}

// TestResponsesStatelessStreams: openai-go's Responses client, whole and
// streamed, through the gateway to the reference engine; the stream's own
// event types arrive as the engine sent them, the usage is counted from
// input_tokens/output_tokens, and an engine that answers 503 is failed
// over before the first byte.
func TestResponsesStatelessStreams(t *testing.T) {
	logs := &lockedBuffer{}
	c := limitedCluster(t, newFakeClock(), config.APIKey{TokensPerMinute: 1_000_000}, nil, logs,
		enginesim.Config{ID: "r1", Model: "sim"}, enginesim.Config{ID: "r2", Model: "sim"})
	client := responsesClient(c, "key-alice")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	params := responses.ResponseNewParams{
		Model:           "sim",
		Instructions:    openai.String("Answer briefly."),
		Input:           responses.ResponseNewParamsInputUnion{OfString: openai.String("Tell me about gateways.")},
		MaxOutputTokens: openai.Int(8),
		Store:           openai.Bool(false),
	}

	// Whole.
	var raw *http.Response
	resp, err := client.Responses.New(ctx, params, option.WithResponseInto(&raw), option.WithHeader("X-Request-Id", "resp-whole"))
	if err != nil {
		t.Fatalf("Responses.New: %v", err)
	}
	if resp.Object != "response" || resp.OutputText() == "" || resp.Usage.InputTokens == 0 || resp.Usage.OutputTokens == 0 {
		t.Fatalf("whole response: object %q text %q usage %+v", resp.Object, resp.OutputText(), resp.Usage)
	}
	if raw.Header.Get("X-Client-Request-Id") != "resp-whole" {
		t.Errorf("X-Client-Request-Id %q", raw.Header.Get("X-Client-Request-Id"))
	}
	wantLogged(t, logs, "resp-whole", resp.Usage.InputTokens, resp.Usage.OutputTokens)

	// Streamed: the Responses event types, response.completed last.
	stream := client.Responses.NewStreaming(ctx, params, option.WithHeader("X-Client-Request-Id", "resp-stream"))
	var types []string
	var text strings.Builder
	var done responses.Response
	for stream.Next() {
		ev := stream.Current()
		types = append(types, ev.Type)
		switch ev.Type {
		case "response.output_text.delta":
			text.WriteString(ev.Delta)
		case "response.completed":
			done = ev.Response
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v (events %v)", err, types)
	}
	_ = stream.Close()
	if len(types) < 4 || types[0] != "response.created" || types[len(types)-1] != "response.completed" {
		t.Fatalf("stream events %v", types)
	}
	if text.Len() == 0 || done.OutputText() != text.String() || done.Usage.OutputTokens == 0 {
		t.Fatalf("streamed text %q, completed response text %q usage %+v", text.String(), done.OutputText(), done.Usage)
	}
	wantLogged(t, logs, "resp-stream", done.Usage.InputTokens, done.Usage.OutputTokens)

	// A bad body is the gateway's 400 in OpenAI's shape, naming the field.
	r := c.post("/v1/responses", "key-alice", `{"model":"sim"}`)
	if r.status != http.StatusBadRequest || !strings.Contains(string(r.body), `"param":"input"`) {
		t.Fatalf("body without input: %d %s", r.status, r.body)
	}

	// r1 answers 503: every request is served, by r2, before any byte.
	before, _, _ := c.hooks.snapshot()
	if err := c.engines["r1"].SetFaults(enginesim.Faults{Unavailable: true}); err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		s := client.Responses.NewStreaming(ctx, params)
		n := 0
		for s.Next() {
			n++
		}
		if err := s.Err(); err != nil || n == 0 {
			t.Fatalf("stream %d with r1 unavailable: %v after %d events", i, err, n)
		}
		_ = s.Close()
		if _, err := client.Responses.New(ctx, params); err != nil {
			t.Fatalf("whole %d with r1 unavailable: %v", i, err)
		}
	}
	routed, failovers, _ := c.hooks.snapshot()
	routed = routed[len(before):]
	for _, f := range failovers {
		if f != "r1:status_503" {
			t.Errorf("failover %q, want only r1:status_503", f)
		}
	}
	if n := strings.Count(strings.Join(routed, ","), "r1"); n != len(failovers) {
		t.Errorf("routed to r1 %d times but %d failovers (routed %v)", n, len(failovers), routed)
	}
}

// wantLogged waits for the access-log line of the client's request id and
// checks its usage.
func wantLogged(t *testing.T, logs *lockedBuffer, id string, prompt, completion int64) {
	t.Helper()
	var line map[string]any
	eventually(t, 10*time.Second, func() bool { line = logs.line(id); return line != nil }, "access log of %s", id)
	if line["prompt_tokens"] != float64(prompt) || line["completion_tokens"] != float64(completion) || line["usage_estimated"] == true {
		t.Fatalf("access log of %s: %v; want prompt %d completion %d, not estimated", id, line, prompt, completion)
	}
}

// TestResponsesFollowUpReachesItsWorker: with four workers taking
// stateless requests in turn (weighted), every request that names a stored
// response (previous_response_id, GET, DELETE) reaches the worker that
// stored it, whose id the gateway read from the whole answer or from the
// stream's response.created event; once that worker is killed, a
// follow-up is a 404 response_not_found, never an answer from another
// worker.
func TestResponsesFollowUpReachesItsWorker(t *testing.T) {
	dbg := config.APIKey{Name: "dbg", Key: "key-dbg", Scopes: []string{"inference", "debug"}}
	weighted := func(c *config.Config) { c.Gateway.RoutePolicy = "weighted" }
	var engines []enginesim.Config
	for _, id := range []string{"w1", "w2", "w3", "w4"} {
		engines = append(engines, enginesim.Config{ID: id, Model: "sim"})
	}
	c := newCluster(t, "", []clusterOpt{withKeys(dbg), weighted}, engines...)
	client := responsesClient(c, "key-dbg")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ask := func(prev string, text string) responses.ResponseNewParams {
		p := responses.ResponseNewParams{Model: "sim", MaxOutputTokens: openai.Int(4),
			Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(text)}}
		if prev != "" {
			p.PreviousResponseID = openai.String(prev)
		}
		return p
	}

	// Stateless requests go round the fleet: a follow-up that were not
	// pinned would meet a worker that does not know its id.
	first := map[string]string{} // worker -> a response it stored
	for i := range 8 {
		var raw *http.Response
		resp, err := client.Responses.New(ctx, ask("", fmt.Sprintf("conversation %d", i)), option.WithResponseInto(&raw))
		if err != nil {
			t.Fatalf("stored response %d: %v", i, err)
		}
		first[raw.Header.Get("X-TL-Route")] = resp.ID
	}
	if len(first) < 2 {
		t.Fatalf("stateless requests all went to %v: the test needs them spread", first)
	}

	for worker, id := range first {
		// Three follow-ups in a chain, the middle one streamed.
		prev := id
		for step := range 3 {
			if step == 1 {
				var raw *http.Response
				s := client.Responses.NewStreaming(ctx, ask(prev, "and then?"), option.WithResponseInto(&raw))
				next := ""
				for s.Next() {
					if ev := s.Current(); ev.Type == "response.completed" {
						next = ev.Response.ID
					}
				}
				if err := s.Err(); err != nil || next == "" {
					t.Fatalf("streamed follow-up of %s: %v (id %q)", prev, err, next)
				}
				_ = s.Close()
				if got := raw.Header.Get("X-TL-Route"); got != worker {
					t.Fatalf("streamed follow-up of %s went to %s, want %s", prev, got, worker)
				}
				prev = next
				continue
			}
			var raw *http.Response
			resp, err := client.Responses.New(ctx, ask(prev, "and then?"), option.WithResponseInto(&raw))
			if err != nil {
				t.Fatalf("follow-up %d of %s (stored on %s): %v", step, prev, worker, err)
			}
			if got := raw.Header.Get("X-TL-Route"); got != worker {
				t.Fatalf("follow-up of %s went to %s, want %s", prev, got, worker)
			}
			if resp.PreviousResponseID != prev {
				t.Fatalf("follow-up answers previous_response_id %q, want %q", resp.PreviousResponseID, prev)
			}
			prev = resp.ID
		}
		// GET reaches the worker; DELETE removes the id there and here.
		var raw *http.Response
		got, err := client.Responses.Get(ctx, prev, responses.ResponseGetParams{}, option.WithResponseInto(&raw))
		if err != nil || got.ID != prev || raw.Header.Get("X-TL-Route") != worker {
			t.Fatalf("GET %s: %v (id %q, worker %q, want %s)", prev, err, got.ID, raw.Header.Get("X-TL-Route"), worker)
		}
		if err := client.Responses.Delete(ctx, prev); err != nil {
			t.Fatalf("DELETE %s: %v", prev, err)
		}
		_, err = client.Responses.Get(ctx, prev, responses.ResponseGetParams{})
		wantNotFound(t, err, "GET after DELETE")
	}
	if _, err := client.Responses.New(ctx, ask("resp_never_made", "hi")); err != nil {
		wantNotFound(t, err, "an id the gateway never saw")
	} else {
		t.Fatal("an id the gateway never saw was answered")
	}

	// Kill a worker that stores a response: its follow-ups get the 404
	// once the gateway sees it gone, and never another worker's answer.
	var victim, id string
	for w, i := range first {
		victim, id = w, i
		break
	}
	c.engines[victim].Kill()
	eventually(t, 10*time.Second, func() bool {
		for _, w := range c.workers() {
			if w.ID == victim && w.Routable {
				return false
			}
		}
		return true
	}, "worker %s gone", victim)
	eventually(t, 10*time.Second, func() bool {
		_, err := client.Responses.New(ctx, ask(id, "still there?"))
		if err == nil {
			t.Fatalf("a follow-up of %s, stored on killed %s, was answered", id, victim)
		}
		var apiErr *openai.Error
		return errors.As(err, &apiErr) && apiErr.StatusCode == http.StatusNotFound
	}, "a 404 for a follow-up of %s", id)
	_, err := client.Responses.New(ctx, ask(id, "still there?"))
	wantNotFound(t, err, "follow-up on a killed worker")
	var apiErr *openai.Error
	if errors.As(err, &apiErr); !strings.Contains(apiErr.Message, victim) {
		t.Errorf("the 404 does not name the gone worker %s: %q", victim, apiErr.Message)
	}
}

// wantNotFound checks that err is the gateway's OpenAI-shaped 404
// response_not_found.
func wantNotFound(t *testing.T, err error, what string) {
	t.Helper()
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound || apiErr.Code != "response_not_found" || apiErr.Message == "" {
		t.Fatalf("%s: %v, want a 404 response_not_found", what, err)
	}
}

// TestResponsesStoreMaxEntries: gateway.responses.store_max_entries bounds
// the gateway's record of stored responses: past it the oldest id is
// forgotten, and a request naming it is the gateway's own 404, although the
// engine still holds the response.
func TestResponsesStoreMaxEntries(t *testing.T) {
	dbg := config.APIKey{Name: "dbg", Key: "key-dbg", Scopes: []string{"inference", "debug"}}
	two := func(c *config.Config) { c.Gateway.Responses.StoreMaxEntries = 2 }
	c := newCluster(t, "", []clusterOpt{withKeys(dbg), two}, enginesim.Config{ID: "w1", Model: "sim"})
	client := responsesClient(c, "key-dbg")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var ids []string
	for i := range 3 {
		resp, err := client.Responses.New(ctx, responses.ResponseNewParams{Model: "sim", MaxOutputTokens: openai.Int(2),
			Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(fmt.Sprintf("turn %d", i))}})
		if err != nil {
			t.Fatalf("response %d: %v", i, err)
		}
		ids = append(ids, resp.ID)
	}
	for _, id := range ids[1:] {
		if got, err := client.Responses.Get(ctx, id, responses.ResponseGetParams{}); err != nil || got.ID != id {
			t.Fatalf("GET %s, among the newest two: %v", id, err)
		}
	}
	_, err := client.Responses.Get(ctx, ids[0], responses.ResponseGetParams{})
	wantNotFound(t, err, "GET of the oldest of three")
	var apiErr *openai.Error
	if errors.As(err, &apiErr); !strings.Contains(apiErr.Message, "not known to the gateway") {
		t.Fatalf("the 404 is not the gateway's own: %q", apiErr.Message)
	}
}

// TestResponsesRetrieveQuery: a GET of a stored response reaches its
// worker with the client's query string, so a retrieval asks what the
// client asked (include, starting_after); with stream=true its events are
// relayed as a stream, counted as no usage. A stream value that is not a
// boolean is refused, naming it.
func TestResponsesRetrieveQuery(t *testing.T) {
	var mu sync.Mutex
	var queries []string
	c := newCluster(t, "", nil)
	c.addFake("f", "m", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.Method == http.MethodPost {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"id":"resp_q1","object":"response","status":"completed","model":"m","output":[],"usage":{"input_tokens":3,"output_tokens":2,"total_tokens":5}}`)
			return
		}
		mu.Lock()
		queries = append(queries, r.Method+" "+r.URL.Path+"?"+r.URL.RawQuery)
		mu.Unlock()
		if r.URL.Query().Get("stream") == "true" {
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"b\",\"sequence_number\":2}\n\n"+
				"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_q1\",\"object\":\"response\",\"status\":\"completed\",\"usage\":{\"input_tokens\":3,\"output_tokens\":2}},\"sequence_number\":3}\n\n")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"resp_q1","object":"response","status":"completed","model":"m","output":[]}`)
	})
	if r := c.post("/v1/responses", "", map[string]any{"model": "m", "input": "hi"}); r.status != http.StatusOK {
		t.Fatalf("POST: %d %s", r.status, r.body)
	}
	if r := c.get("/v1/responses/resp_q1?include[]=message.output_text.logprobs", ""); r.status != http.StatusOK || !strings.Contains(string(r.body), `"resp_q1"`) {
		t.Fatalf("GET: %d %s", r.status, r.body)
	}
	r := c.get("/v1/responses/resp_q1?stream=true&starting_after=1", "")
	if r.status != http.StatusOK || !strings.HasPrefix(r.header.Get("Content-Type"), "text/event-stream") ||
		!strings.Contains(string(r.body), "event: response.completed\n") || !strings.Contains(string(r.body), `"delta":"b"`) {
		t.Fatalf("GET streamed: %d %s %s", r.status, r.header.Get("Content-Type"), r.body)
	}
	if r := c.get("/v1/responses/resp_q1?stream=yes", ""); r.status != http.StatusBadRequest || !strings.Contains(string(r.body), `"param":"stream"`) {
		t.Fatalf("GET stream=yes: %d %s, want 400 naming stream", r.status, r.body)
	}
	mu.Lock()
	got := strings.Join(queries, "\n")
	mu.Unlock()
	if want := "GET /v1/responses/resp_q1?include[]=message.output_text.logprobs\nGET /v1/responses/resp_q1?stream=true&starting_after=1"; got != want {
		t.Fatalf("the engine was asked\n%s\nwant\n%s", got, want)
	}
}
