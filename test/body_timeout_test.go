package test

import (
	"bufio"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/adapter/config"
)

// TestSlowBodyIsCutOff: a client that sends its headers and then dribbles
// its body is answered 400 once read_body_timeout passes, and the gateway
// goes on serving; a streamed answer longer than that timeout is not cut.
func TestSlowBodyIsCutOff(t *testing.T) {
	c := newCluster(t, "", []clusterOpt{func(cfg *config.Config) {
		cfg.Gateway.ReadBodyTimeout = config.D(300 * time.Millisecond)
	}}, enginesim.Config{ID: "w1", Model: "m", DecodePerToken: 40 * time.Millisecond})

	conn, err := net.Dial("tcp", c.gw.HTTPAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"model":"m","prompt":"hi"}`
	fmt.Fprintf(conn, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body[:5])
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	status, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		t.Fatalf("no answer to a stalled body: %v", err)
	}
	if !strings.Contains(status, " 400 ") {
		t.Fatalf("status line %q, want 400", status)
	}

	// A stream that lasts longer than read_body_timeout (12 tokens × 40 ms)
	// is not cut by it.
	r := c.post("/v1/completions", "", map[string]any{"model": "m", "prompt": "hi", "max_tokens": 12, "stream": true})
	if r.status != 200 || !strings.Contains(string(r.body), "data: [DONE]") {
		t.Fatalf("long stream: %d %s", r.status, r.body)
	}
}
