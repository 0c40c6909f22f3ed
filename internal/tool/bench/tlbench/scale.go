package tlbench

import (
	"context"
	"fmt"
	"math"
	"strconv"

	"github.com/tlgate/tlgate/internal/routing/policy"
	"github.com/tlgate/tlgate/internal/tool/bench/routerbench"
	"github.com/tlgate/tlgate/internal/tool/svgplot"
)

var scalePolicies = []policy.Name{policy.NameLeastOutstanding, policy.NameWeighted, policy.NameAffinity}

// scaleExperiment times the route decision at each fleet size and policy.
func scaleExperiment(ctx context.Context, c Config) (section, []plotFile, error) {
	t := &table{header: []string{"workers", "policy", "router actor round trip ns/op", "decision inside the actor ns/op", "State.Pick ns/op", "ops (actor / pick)"}}
	var results []routerbench.Result
	for _, n := range c.Workers {
		for _, p := range scalePolicies {
			r, err := routerbench.Measure(ctx, routerbench.Config{
				Workers: n, Policy: p, LoadFactor: c.LoadFactor, Budget: c.PickBudget, MinOps: c.PickMinOps,
			})
			if err != nil {
				return section{}, nil, fmt.Errorf("%d workers, %s: %w", n, p, err)
			}
			results = append(results, r)
			t.add(strconv.Itoa(n), string(p), fmt.Sprintf("%.0f", r.ActorNsPerOp), fmt.Sprintf("%.0f", r.InActorNsPerOp),
				fmt.Sprintf("%.0f", r.PickNsPerOp), fmt.Sprintf("%d / %d", r.ActorOps, r.PickOps))
		}
	}
	lead := fmt.Sprintf("The router actor driven directly, no engines: a registry and a router spawned as the gateway spawns them, "+
		"fed one heartbeat per fake worker (all serving one model), then Route requests sent with RequestFuture one at a time "+
		"(64 distinct prefix keys, each pick released at once); and the pure router.State.Pick on the same workers. "+
		"Each timing runs for %v or %d operations, whichever is longer.", c.PickBudget, c.PickMinOps)
	return section{title: "Route decision time", lead: lead, tables: []*table{t}}, scalePlots(results), nil
}

// scalePlots draws ns/op against log10(workers), per policy, for the actor
// round trip and the pure pick.
func scalePlots(results []routerbench.Result) []plotFile {
	var series []svgplot.Series
	for _, p := range scalePolicies {
		actor := svgplot.Series{Name: string(p) + " (actor)", Line: true}
		pick := svgplot.Series{Name: string(p) + " (Pick)", Line: true}
		for _, r := range results {
			if r.Policy != p {
				continue
			}
			x := math.Log10(float64(r.Workers))
			label := ""
			if p == policy.NameAffinity {
				label = strconv.Itoa(r.Workers) + " workers"
			}
			actor.Points = append(actor.Points, svgplot.Point{X: x, Y: r.ActorNsPerOp / 1e3, Label: label})
			pick.Points = append(pick.Points, svgplot.Point{X: x, Y: r.PickNsPerOp / 1e3})
		}
		if len(actor.Points) > 0 {
			series = append(series, actor, pick)
		}
	}
	if len(series) == 0 {
		return nil
	}
	return []plotFile{{name: "route-decision", plot: svgplot.Plot{
		Title: "Route decision time by fleet size", XLabel: "log10(workers)", YLabel: "µs per route",
		Width: 960, Height: 600, Series: series,
	}}}
}
