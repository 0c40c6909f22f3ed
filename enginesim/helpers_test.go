package enginesim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/tlgate/tlgate/internal/testkit/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

// startEngine starts an engine that the test closes at cleanup.
func startEngine(t testing.TB, cfg Config) *Engine {
	t.Helper()
	e, err := Start(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return e
}

// newClient returns an HTTP client whose idle connections close at cleanup.
func newClient(t testing.TB) *http.Client {
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

type response struct {
	status int
	header http.Header
	body   []byte
}

// post sends a JSON body (a string or a value to marshal).
func post(t testing.TB, c *http.Client, url string, body any, header ...string) response {
	t.Helper()
	r, err := tryPost(c, url, body, header...)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	return r
}

func tryPost(c *http.Client, url string, body any, header ...string) (response, error) {
	var b []byte
	switch v := body.(type) {
	case string:
		b = []byte(v)
	default:
		var err error
		if b, err = json.Marshal(v); err != nil {
			return response{}, err
		}
	}
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(b))
	if err != nil {
		return response{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		return response{}, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	return response{status: resp.StatusCode, header: resp.Header, body: data}, err
}

func get(t testing.TB, c *http.Client, url string) response {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: reading body: %v", url, err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: data}
}

// sseData returns the payloads of the data: lines of an SSE body.
func sseData(t testing.TB, body []byte) []string {
	t.Helper()
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("SSE line %q is not a data line", line)
		}
		out = append(out, data)
	}
	return out
}

func decode[T any](t testing.TB, b []byte) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("decoding %s: %v", b, err)
	}
	return v
}

// generation is what a client gets from a completion, streamed or not, in
// a form that compares equal across both.
type generation struct {
	Text     string
	Tokens   []string
	Logprobs []float64
	Top      []map[string]float64
	Finish   string
	Usage    usageJSON
}

// complete runs a completions or chat request (stream from body) and
// collects the generation.
func complete(t testing.TB, c *http.Client, base string, chat bool, body map[string]any, header ...string) generation {
	t.Helper()
	path := "/v1/completions"
	if chat {
		path = "/v1/chat/completions"
	}
	r := post(t, c, base+path, body, header...)
	if r.status != http.StatusOK {
		t.Fatalf("POST %s: %d %s", path, r.status, r.body)
	}
	stream, _ := body["stream"].(bool)
	return parseGeneration(t, chat, stream, r.body)
}

// parseGeneration reads a completions or chat answer, streamed or not.
func parseGeneration(t testing.TB, chat, stream bool, body []byte) generation {
	t.Helper()
	r := response{body: body}
	var g generation
	if !stream {
		if chat {
			v := decode[chatJSON](t, r.body)
			ch := v.Choices[0]
			g.Text, g.Finish = *ch.Message.Content, *ch.FinishReason
			if ch.Logprobs != nil {
				for _, lp := range ch.Logprobs.Content {
					g.addChat(lp)
				}
			}
			g.Usage = *v.Usage
		} else {
			v := decode[completionJSON](t, r.body)
			ch := v.Choices[0]
			g.Text, g.Finish = ch.Text, *ch.FinishReason
			if lp := ch.Logprobs; lp != nil {
				g.Tokens, g.Logprobs, g.Top = lp.Tokens, lp.TokenLogprobs, lp.TopLogprobs
			}
			g.Usage = *v.Usage
		}
		return g
	}
	data := sseData(t, r.body)
	if len(data) == 0 || data[len(data)-1] != "[DONE]" {
		t.Fatalf("stream does not end with [DONE]: %q", data)
	}
	for _, d := range data[:len(data)-1] {
		if chat {
			v := decode[chatJSON](t, []byte(d))
			if v.Usage != nil {
				g.Usage = *v.Usage
			}
			for _, ch := range v.Choices {
				if ch.Delta.Content != nil {
					g.Text += *ch.Delta.Content
				}
				if ch.FinishReason != nil {
					g.Finish = *ch.FinishReason
				}
				if ch.Logprobs != nil {
					for _, lp := range ch.Logprobs.Content {
						g.addChat(lp)
					}
				}
			}
		} else {
			v := decode[completionJSON](t, []byte(d))
			if v.Usage != nil {
				g.Usage = *v.Usage
			}
			for _, ch := range v.Choices {
				g.Text += ch.Text
				if ch.FinishReason != nil {
					g.Finish = *ch.FinishReason
				}
				if lp := ch.Logprobs; lp != nil {
					g.Tokens = append(g.Tokens, lp.Tokens...)
					g.Logprobs = append(g.Logprobs, lp.TokenLogprobs...)
					g.Top = append(g.Top, lp.TopLogprobs...)
				}
			}
		}
	}
	return g
}

func (g *generation) addChat(lp chatTokenLogprobJSON) {
	g.Tokens = append(g.Tokens, lp.Token)
	g.Logprobs = append(g.Logprobs, lp.Logprob)
	top := make(map[string]float64, len(lp.TopLogprobs))
	for _, tl := range lp.TopLogprobs {
		top[tl.Token] = tl.Logprob
	}
	g.Top = append(g.Top, top)
}

func decodeInto(b []byte, v any) error { return json.Unmarshal(b, v) }

// stream is an open SSE response read chunk by chunk.
type stream struct {
	resp *http.Response
	sc   *bufio.Scanner
}

func openStream(t testing.TB, ctx context.Context, c *http.Client, url string, body any) *stream {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Fatalf("POST %s: %d %s", url, resp.StatusCode, data)
	}
	return &stream{resp: resp, sc: bufio.NewScanner(resp.Body)}
}

// next returns the next data payload.
func (s *stream) next(t testing.TB) string {
	t.Helper()
	d, err := s.tryNext()
	if err != nil {
		t.Fatalf("reading stream: %v", err)
	}
	return d
}

func (s *stream) tryNext() (string, error) {
	for s.sc.Scan() {
		if line := s.sc.Text(); line != "" {
			return strings.TrimPrefix(line, "data: "), nil
		}
	}
	if err := s.sc.Err(); err != nil {
		return "", err
	}
	return "", io.EOF
}

func (s *stream) close() { s.resp.Body.Close() }
