//go:build !noembed

package main

import (
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tlgate/tlgate/internal/adapter/store/embedetcd"
)

var replicasUp = regexp.MustCompile(`(?s)gateway replicas sharing one route table.*Ctrl-C stops it\.`)

// TestRunDemoReplicas runs -demo -replicas 2 and follows its banner: the
// PUT on replica 0 is served by replica 1, and so is the drain.
func TestRunDemoReplicas(t *testing.T) {
	r := startRun(t, "-demo", "-replicas", "2")
	banner := r.await(r.stdout, replicasUp)
	var put, getB curlCommand
	for _, c := range parseCurls(banner) {
		switch {
		case c.body != "" && strings.HasSuffix(c.url, "/admin/v1/routes"):
			put = c
		case c.body == "" && strings.HasSuffix(c.url, "/admin/v1/routes") && put.url != "":
			getB = c
		}
	}
	if put.url == "" || getB.url == "" || put.url == getB.url {
		t.Fatalf("the banner lacks a PUT on one replica and a GET on another:\n%s", banner)
	}
	a, err := r.do(http.MethodPut, put.url, put.body, "If-Match", `"1"`)
	if err != nil || a.status != http.StatusOK {
		t.Fatalf("PUT: %v %d %s", err, a.status, a.body)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		b := r.get(getB.url)
		if b.header.Get("ETag") == `"2"` {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica 1 still serves %s %s", b.header.Get("ETag"), b.body)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The replicas sync through the demo's embedded NATS.
	metricsURL := strings.TrimSuffix(getB.url, "/admin/v1/routes") + "/metrics"
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(string(r.get(metricsURL).body), "tlgate_sync_up 1"); {
		if time.Now().After(deadline) {
			t.Fatalf("replica 1 does not report tlgate_sync_up 1 at %s", metricsURL)
		}
		time.Sleep(10 * time.Millisecond)
	}
	r.client.CloseIdleConnections()
	if err := r.stop(); err != nil {
		t.Fatalf("run returned %v", err)
	}
}

// TestSeedFrom seeds an etcd from a file store's routes.json once; a
// second seed is refused unless forced; a bad file is refused naming it.
func TestSeedFrom(t *testing.T) {
	c, err := embedetcd.Start(t.TempDir(), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "tlgate.toml")
	if err := os.WriteFile(cfgPath, []byte("[gateway.store]\nkind = \"etcd\"\nendpoints = [\""+c.Endpoints()[0]+"\"]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	routesPath := filepath.Join(dir, "routes.json")
	if err := os.WriteFile(routesPath, []byte(`{"epoch":7,"routes":[{"model":"smol"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	seed := func(extra ...string) (string, error) {
		var out, errOut syncBuffer
		err := run(t.Context(), append([]string{"-config", cfgPath, "-seed-from", routesPath}, extra...), &out, &errOut, nil)
		return out.String(), err
	}
	if out, err := seed(); err != nil || !strings.Contains(out, "epoch 7, 1 routes") {
		t.Fatalf("first seed: %q %v", out, err)
	}
	if _, err := seed(); err == nil || !strings.Contains(err.Error(), "already holds a table (epoch 7)") {
		t.Fatalf("second seed: %v, want a refusal naming the stored epoch", err)
	}
	if out, err := seed("-seed-force"); err != nil || !strings.Contains(out, "seeded") {
		t.Fatalf("forced seed: %q %v", out, err)
	}
	if err := os.WriteFile(routesPath, []byte(`{"epoch":8,"routes":[{"model":""}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := seed("-seed-force"); err == nil || !strings.Contains(err.Error(), routesPath) {
		t.Fatalf("bad file: %v, want an error naming %s", err, routesPath)
	}
	var out, errOut syncBuffer
	if err := run(t.Context(), []string{"-demo", "-seed-from", routesPath}, &out, &errOut, nil); err == nil {
		t.Fatal("-seed-from with -demo was accepted")
	}
}
