package gateway

import (
	"context"
	"net/http"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/tlgate/tlgate/actors/request"
	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/adapter/kvsub"
	"github.com/tlgate/tlgate/internal/adapter/metrics"
	"github.com/tlgate/tlgate/internal/wire/tokenize"
)

// kvRouterConfig is the router's share of [gateway.kv_events] and
// [gateway.tokenizer]: the exact views' bounds and the tokenizers per
// model (none when it follows no events); what the views apply is
// counted on km.
func kvRouterConfig(rc *router.Config, gw *config.Gateway, km *metrics.KVMetrics) {
	if !gw.KVEvents.Follow {
		rc.NoExact = true
		return
	}
	rc.KVIndex = gw.KVEvents.Index()
	rc.Tokenizers = map[string]string{}
	for _, e := range gw.Tokenizer.Endpoints {
		rc.Tokenizers[e.Model] = e.URL
	}
	rc.IndexAgreement, rc.AgreementSample = gw.KVEvents.IndexAgreement, gw.KVEvents.AgreementSample
	rc.Observe.OnAgreement = km.Agreement
	rc.Observe.OnKVApplied = func(r router.KVApplied) {
		a := r.Applied
		km.Applied(r.Worker, a.Stored, a.Removed, a.Cleared, a.Unresolved, a.Evicted)
	}
}

// newKVMetrics creates the KV events metrics on reg (nil: none).
func newKVMetrics(reg prometheus.Registerer) (*metrics.KVMetrics, error) {
	if reg == nil {
		return nil, nil
	}
	return metrics.NewKVMetrics(reg)
}

// startKVEvents subscribes to the KV events of every worker that
// publishes them, each dial checked by control, and has the request
// actors tokenize prompts for routing on them over client.
func (g *Gateway) startKVEvents(gw *config.Gateway, rdeps *request.Deps, client *http.Client, control func(network, address string, c syscall.RawConn) error, km *metrics.KVMetrics, log zerolog.Logger) {
	tok := tokenize.New(tokenize.Options{HTTP: client, CacheTokens: gw.Tokenizer.CacheTokens, Bases: tokenizerBases(gw.Tokenizer.Endpoints)})
	g.stops = append(g.stops, func(context.Context) error { tok.Close(); return nil })
	rdeps.Tokenizer, rdeps.TokenizeTimeout = tok, gw.Tokenizer.Timeout.Duration
	rdeps.OnTokenized, rdeps.OnTokenCache = km.Tokenized, km.TokenCache
	routed := rdeps.OnRouted
	rdeps.OnRouted = func(ex *request.Exchange, t router.Target, took time.Duration) {
		if routed != nil {
			routed(ex, t, took)
		}
		km.Pick(t.Route, t.CacheView)
	}
	k := gw.KVEvents
	mgr := kvsub.StartManager(kvsub.ManagerConfig{
		Root: g.sys.Root, Registry: g.Registry, Router: g.Router, Logger: log,
		Base: kvsub.Config{
			Observer: km, Control: control, DialTimeout: gw.ConnectTimeout.Duration, ReplayTimeout: k.ReplayTimeout.Duration,
			Bounds: kvsub.Bounds{MaxMessage: k.MaxMessageBytes}, BytesPerSecond: k.BytesPerSecond,
		},
	})
	g.stops = append(g.stops, func(context.Context) error { mgr.Close(); return nil })
}

// tokenizerBases maps each configured tokenizer's URL to its base model
// (tokenize.Options.Bases), leaving out a URL configured for several: a
// request to it is tokenized as the model it names.
func tokenizerBases(es []config.TokenizerEndpoint) map[string]string {
	out := map[string]string{}
	shared := map[string]bool{}
	for _, e := range es {
		if b, ok := out[e.URL]; ok && b != e.Model {
			shared[e.URL] = true
		}
		out[e.URL] = e.Model
	}
	for u := range shared {
		delete(out, u)
	}
	return out
}

// kvViews are the exact views of ws for the metrics.
func kvViews(ws []router.WorkerView) []metrics.KVView {
	var out []metrics.KVView
	for _, w := range ws {
		if w.KVBlocks == nil {
			continue // no subscription
		}
		out = append(out, metrics.KVView{Worker: w.ID, View: w.CacheView, Blocks: w.KVBlocks})
	}
	return out
}
