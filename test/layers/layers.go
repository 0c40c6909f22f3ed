// Package layers states which layer each of the project's packages belongs
// to and which layers it may import, and checks an import graph against
// that: the architecture test (layers_test.go) reads the real graph with
// `go list` and fails, naming the offending import, when a package imports
// across a line it must not cross.
//
// The layers, inside out:
//
//   - protos: the gRPC contracts and their generated code.
//   - routing (internal/routing): pure logic. It imports only itself and
//     protos: no actor, edge, adapter or the composition root.
//   - wire (internal/wire): the shapes and calls on the wire to engines and
//     clients, and the trace context they carry (internal/wire/tracectx).
//   - guard (internal/guard): the edges' guards (keys, body, connection,
//     peer and per-key limits).
//   - actors (actors/...): the actors, and the ports they own (the admin's
//     store, actors/admin/store); never an adapter or an edge.
//   - adapter (internal/adapter): the outside world (configuration, state
//     files, stores, probes, metrics, tracing, traffic rings); an adapter
//     implements an actor's port or sends messages to actors, so it may
//     import them, and never the other way round.
//   - edge (internal/edge): the HTTP and gRPC edges, which translate only;
//     one edge never imports another.
//   - engine (enginesim): the reference engine.
//   - runtime (internal/runtime), tool (internal/tool) and cmd: composition
//     and tools, which may import everything but test kits.
//   - testkit (internal/testkit): helpers of tests, imported only by test
//     files. A kit may import every layer but cmd and test (a cluster kit
//     starts whole gateways).
//   - test (test/..., deploy): tests only.
//
// Who may import whom is a DAG: no two layers may import each other,
// directly or through others (TestLayerTableIsADAG).
package layers

import (
	"fmt"
	"slices"
	"sort"
	"strings"
)

// Layer names one layer of the project.
type Layer string

// The project's layers.
const (
	Protos  Layer = "protos"
	Routing Layer = "routing"
	Wire    Layer = "wire"
	Guard   Layer = "guard"
	Actors  Layer = "actors"
	Adapter Layer = "adapter"
	Edge    Layer = "edge"
	Engine  Layer = "engine"
	Runtime Layer = "runtime"
	Tool    Layer = "tool"
	Cmd     Layer = "cmd"
	Testkit Layer = "testkit"
	Test    Layer = "test"
)

// Module is the project's module path.
const Module = "github.com/tlgate/tlgate"

// folders map a folder of the module (a package path without the module
// path) to the layer of every package in it.
var folders = []struct {
	dir   string
	layer Layer
}{
	{"protos", Protos},
	{"internal/routing", Routing},
	{"internal/wire", Wire},
	{"internal/guard", Guard},
	{"internal/adapter", Adapter},
	{"internal/edge", Edge},
	{"internal/runtime", Runtime},
	{"internal/tool", Tool},
	{"internal/testkit", Testkit},
	{"actors", Actors},
	{"enginesim", Engine},
	{"cmd", Cmd},
	{"test", Test},
	{"deploy", Test},
}

// mayImport lists, for each layer, the layers of the module its non-test
// code may import (a layer may always import itself, but an edge not
// another edge, nor a command another command).
var mayImport = map[Layer][]Layer{
	Protos:  {},
	Routing: {Protos},
	Wire:    {Routing, Protos},
	Guard:   {Wire, Routing, Protos},
	Actors:  {Routing, Wire, Protos},
	Adapter: {Actors, Routing, Wire, Protos},
	Edge:    {Actors, Routing, Wire, Guard, Adapter, Protos},
	Engine:  {Adapter, Wire, Protos},
	Runtime: {Edge, Guard, Actors, Routing, Wire, Adapter, Engine, Protos},
	Tool:    {Runtime, Edge, Guard, Actors, Routing, Wire, Adapter, Engine, Protos},
	Cmd:     {Runtime, Tool, Edge, Guard, Actors, Routing, Wire, Adapter, Engine, Protos},
	Testkit: {Runtime, Tool, Edge, Guard, Actors, Routing, Wire, Adapter, Engine, Protos},
	Test:    {Runtime, Tool, Edge, Guard, Actors, Routing, Wire, Adapter, Engine, Protos, Cmd, Testkit},
}

// Cycle returns a cycle of the layer table, each layer then the one it may
// import, first and last the same; nil when the table is a DAG.
func Cycle() []Layer { return cycleOf(mayImport) }

// cycleOf returns a cycle of table (as Cycle does), or nil.
func cycleOf(table map[Layer][]Layer) []Layer {
	const (
		unseen = iota
		open
		done
	)
	mark := map[Layer]int{}
	var path []Layer
	var visit func(l Layer) []Layer
	visit = func(l Layer) []Layer {
		switch mark[l] {
		case open:
			i := slices.Index(path, l)
			return append(slices.Clone(path[i:]), l)
		case done:
			return nil
		}
		mark[l] = open
		path = append(path, l)
		for _, to := range table[l] {
			if c := visit(to); c != nil {
				return c
			}
		}
		path = path[:len(path)-1]
		mark[l] = done
		return nil
	}
	layers := make([]Layer, 0, len(table))
	for l := range table {
		layers = append(layers, l)
	}
	slices.Sort(layers)
	for _, l := range layers {
		if c := visit(l); c != nil {
			return c
		}
	}
	return nil
}

// Of returns the layer of a package of the module (its full import path),
// and false for a path outside the module or in no layer.
func Of(importPath string) (Layer, bool) {
	rel, ok := strings.CutPrefix(importPath, Module+"/")
	if !ok {
		return "", false
	}
	for _, f := range folders {
		if rel == f.dir || strings.HasPrefix(rel, f.dir+"/") {
			return f.layer, true
		}
	}
	return "", false
}

// unit names the part of a layer whose packages may import each other: the
// edge (internal/edge/NAME) or command (cmd/NAME) a package belongs to.
func unit(importPath string) string {
	rel := strings.TrimPrefix(importPath, Module+"/")
	parts := strings.Split(rel, "/")
	switch {
	case len(parts) >= 3 && parts[0] == "internal" && parts[1] == "edge":
		return strings.Join(parts[:3], "/")
	case len(parts) >= 2 && parts[0] == "cmd":
		return strings.Join(parts[:2], "/")
	}
	return ""
}

// Violation is one import that crosses a line.
type Violation struct {
	From, To string // full import paths
	Rule     string // which rule it breaks
}

func (v Violation) String() string {
	return fmt.Sprintf("%s imports %s: %s", strings.TrimPrefix(v.From, Module+"/"),
		strings.TrimPrefix(v.To, Module+"/"), v.Rule)
}

// Package is one package of the graph: its path and the module packages
// its non-test code imports.
type Package struct {
	Path    string
	Imports []string
}

// Check returns every import of the graph that a layer forbids, sorted.
// Imports from outside the module (the standard library, third-party
// modules) are not checked.
func Check(graph []Package) []Violation {
	var out []Violation
	for _, p := range graph {
		from, ok := Of(p.Path)
		if !ok {
			if strings.HasPrefix(p.Path, Module+"/") {
				out = append(out, Violation{From: p.Path, To: p.Path, Rule: "the package is in no layer: put it in one of internal/{edge,guard,routing,wire,adapter,runtime,tool,testkit}, actors, cmd or test"})
			}
			continue
		}
		for _, imp := range p.Imports {
			to, ok := Of(imp)
			if !ok {
				continue
			}
			if rule := forbids(from, to, p.Path, imp); rule != "" {
				out = append(out, Violation{From: p.Path, To: imp, Rule: rule})
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

// forbids says which rule an import from layer from to layer to breaks, or
// "" when it is allowed.
func forbids(from, to Layer, fromPath, toPath string) string {
	if to == Testkit && from != Test && from != Testkit {
		return "non-test code imports a test kit (only _test.go files may)"
	}
	if from == to {
		switch {
		case from == Edge && unit(fromPath) != unit(toPath):
			return "one edge imports another (edges translate only; share through an actor, wire or guard package)"
		case from == Cmd && unit(fromPath) != unit(toPath):
			return "one command imports another (share through internal/tool or internal/runtime)"
		}
		return ""
	}
	for _, l := range mayImport[from] {
		if l == to {
			return ""
		}
	}
	switch {
	case from == Routing:
		return fmt.Sprintf("pure routing logic imports %s (it may import only routing and protos)", article(to))
	case from == Actors && to == Edge:
		return "an actor imports an edge (edges send messages to actors, never the other way)"
	case from == Actors && to == Adapter:
		return "an actor imports an adapter (an adapter implements the actor's port, or sends it messages: put the interface beside the actor and let the composition root pass the adapter in)"
	case from == Wire && to == Adapter:
		return "the wire imports an adapter (the trace context the wire carries is internal/wire/tracectx)"
	}
	return fmt.Sprintf("%s may import only %s", from, list(mayImport[from]))
}

func article(l Layer) string {
	switch l {
	case Actors:
		return "an actor"
	case Edge:
		return "an edge"
	case Adapter:
		return "an adapter"
	case Runtime:
		return "the composition root (runtime)"
	case Cmd:
		return "a command"
	}
	return "the " + string(l) + " layer"
}

func list(ls []Layer) string {
	if len(ls) == 0 {
		return "itself"
	}
	s := make([]string, len(ls))
	for i, l := range ls {
		s[i] = string(l)
	}
	return "itself, " + strings.Join(s, ", ")
}
