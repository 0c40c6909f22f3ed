package router

import (
	"time"

	"github.com/tlgate/tlgate/internal/routing/fleet"
	"github.com/tlgate/tlgate/internal/routing/routes"
)

// SetConfigured tells the router the models the configuration names
// outside the route table: the models of [[gateway.engines]] entries and
// of discovery sources. They stay known (no_capacity, never
// model_not_found) whether or not a worker serves them.
type SetConfigured struct{ Models []string }

// SetDown tells the router every probed engine that is down (the probe
// manager's whole set, replacing the last one).
type SetDown struct{ Engines []fleet.Down }

// Serving asks how the router knows each of Models beyond the route
// table; it responds with map[string]routes.Serving (absent: Unknown).
type Serving struct{ Models []string }

// DefaultRecentModels is Config.RecentModels when it is zero.
const DefaultRecentModels = 24 * time.Hour

// SetConfigured replaces the configured models.
func (s *State) SetConfigured(models []string) {
	s.configured = make(map[string]bool, len(models))
	for _, m := range models {
		if m != "" {
			s.configured[m] = true
		}
	}
}

// SetDown replaces the down engines.
func (s *State) SetDown(ds []fleet.Down) {
	s.down = append(s.down[:0], ds...)
}

// recentWindow is how long a model stays known after its last worker
// left.
func (s *State) recentWindow() time.Duration {
	if d := s.cfg.RecentModels; d != 0 {
		return max(d, 0)
	}
	return DefaultRecentModels
}

// served records that the models of w, which is leaving, were served up
// to its last heartbeat, and forgets the records older than the window
// by that clock.
func (s *State) served(w *fleet.Worker) {
	if s.recentWindow() == 0 {
		return
	}
	if s.lastServed == nil {
		s.lastServed = map[string]time.Time{}
	}
	for _, m := range w.Models() {
		if w.LastHeartbeat.After(s.lastServed[m]) {
			s.lastServed[m] = w.LastHeartbeat
		}
	}
	for m, t := range s.lastServed {
		if w.LastHeartbeat.Sub(t) >= s.recentWindow() {
			delete(s.lastServed, m)
		}
	}
}

// Known reports whether model names a route, is served by a known worker
// (its base model or one of its adapters), is configured (SetConfigured),
// is the model of a down engine, or was served by a worker within the
// recent window before now: a model that is known and has no routable
// worker is no_capacity, and so stays through a whole outage.
func (s *State) Known(model string, now time.Time) bool {
	if _, ok := s.table.Lookup(model); ok {
		return true
	}
	return s.Serving(model, now) != routes.Unknown
}

// Serving says how the state knows model beyond the route table: served
// by a known worker now, else known (configured, of a down engine, served
// within the window), else unknown.
func (s *State) Serving(model string, now time.Time) routes.Serving {
	if s.servedNow(model) {
		return routes.ServedNow
	}
	if s.configured[model] || s.downModel(model) || s.servedLately(model, now) {
		return routes.Known
	}
	return routes.Unknown
}

// ServingOf is Serving for each of models.
func (s *State) ServingOf(models []string, now time.Time) map[string]routes.Serving {
	out := make(map[string]routes.Serving, len(models))
	for _, m := range models {
		out[m] = s.Serving(m, now)
	}
	return out
}

// servedLately reports whether a worker that left served model within the
// window before now.
func (s *State) servedLately(model string, now time.Time) bool {
	t, ok := s.lastServed[model]
	return ok && now.Sub(t) < s.recentWindow()
}

// downModel reports whether a down engine serves model.
func (s *State) downModel(model string) bool {
	for _, d := range s.down {
		if d.Model == model {
			return true
		}
	}
	return false
}

// knownElsewhere lists the models known besides the route table and the
// workers': configured, of down engines, served within the window.
func (s *State) knownElsewhere(now time.Time) []string {
	var out []string
	for m := range s.configured {
		out = append(out, m)
	}
	for _, d := range s.down {
		if d.Model != "" {
			out = append(out, d.Model)
		}
	}
	for m := range s.lastServed {
		if s.servedLately(m, now) {
			out = append(out, m)
		}
	}
	return out
}

// downOf counts the down engines of model by role.
func (s *State) downOf(model string) map[fleet.Role]int {
	var out map[fleet.Role]int
	for _, d := range s.down {
		if d.Model == model {
			if out == nil {
				out = map[fleet.Role]int{}
			}
			out[d.Role]++
		}
	}
	return out
}

// downViews are the down engines as the admin API lists them, leaving out
// any that is a worker too (its removal crossed its down report).
func (s *State) downViews() []WorkerView {
	out := make([]WorkerView, 0, len(s.down))
	for _, d := range s.down {
		if _, ok := s.workers[d.ID]; ok {
			continue
		}
		out = append(out, WorkerView{
			Worker: fleet.Worker{ID: d.ID, HTTPAddress: d.HTTPAddress, Role: d.Role, Model: d.Model, Source: fleet.SourceProbe, Kind: d.Kind},
			State:  StateDown, LastError: d.LastError, DownSince: d.Since,
		})
	}
	return out
}

// servedNow reports whether a known worker serves model (its base model
// or an adapter): whether a pool of the model, of any role, has a member.
// A pick asks it of every request for a model the route table does not
// name, so it reads the pools rather than every worker.
func (s *State) servedNow(model string) bool {
	for _, role := range fleet.Roles {
		if p := s.pools[poolKey{model, role}]; p != nil && len(p.ids) > 0 {
			return true
		}
	}
	return false
}
