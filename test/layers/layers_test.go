package layers

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/tlgate/tlgate/internal/testkit/leakcheck"
)

func TestMain(m *testing.M) {
	leakcheck.VerifyTestMain(m)
}

// TestImportsKeepTheLayers reads the module's real import graph (the
// non-test imports of every package, from go list) and fails on each import
// that crosses a layer's line, naming it.
func TestImportsKeepTheLayers(t *testing.T) {
	graph := moduleGraph(t)
	if len(graph) < 40 {
		t.Fatalf("go list found %d packages of the module; expected the whole module", len(graph))
	}
	for _, v := range Check(graph) {
		t.Errorf("%s", v)
	}
}

// TestEveryPackageHasALayer checks that the layer table knows every folder
// of the module, so that a new package cannot slip past the rules.
func TestEveryPackageHasALayer(t *testing.T) {
	for _, p := range moduleGraph(t) {
		if _, ok := Of(p.Path); !ok {
			t.Errorf("%s is in no layer", p.Path)
		}
	}
}

// TestLayerTableIsADAG: no two layers may import each other, directly or
// through others, so every layer sits strictly above the ones it uses; and
// the check finds a cycle in a table that has one.
func TestLayerTableIsADAG(t *testing.T) {
	if c := Cycle(); c != nil {
		t.Fatalf("the layer table has a cycle: %v", c)
	}
	for _, tc := range []struct {
		name  string
		table map[Layer][]Layer
		want  []Layer
	}{
		{"two layers import each other", map[Layer][]Layer{Actors: {Adapter}, Adapter: {Actors}}, []Layer{Actors, Adapter, Actors}},
		{"through a third", map[Layer][]Layer{Wire: {Routing}, Routing: {Adapter}, Adapter: {Wire}}, []Layer{Adapter, Wire, Routing, Adapter}},
		{"a chain", map[Layer][]Layer{Edge: {Actors, Wire}, Actors: {Wire}, Wire: {Protos}}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := cycleOf(tc.table); !slices.Equal(got, tc.want) {
				t.Fatalf("cycleOf = %v, want %v", got, tc.want)
			}
		})
	}
}

func moduleGraph(t *testing.T) []Package {
	t.Helper()
	cmd := exec.Command("go", "list", "-json=ImportPath,Imports", Module+"/...")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	var graph []Package
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p struct {
			ImportPath string
			Imports    []string
		}
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("go list output: %v", err)
		}
		var own []string
		for _, imp := range p.Imports {
			if strings.HasPrefix(imp, Module+"/") {
				own = append(own, imp)
			}
		}
		graph = append(graph, Package{Path: p.ImportPath, Imports: own})
	}
	return graph
}

// TestCheckFindsEachForbiddenImport runs Check over small fake graphs: each
// forbidden kind of import must be reported with its rule, and allowed ones
// must not be.
func TestCheckFindsEachForbiddenImport(t *testing.T) {
	m := func(rel string) string { return Module + "/" + rel }
	tests := []struct {
		name     string
		from, to string
		rule     string // a part of the rule's text; "" means allowed
	}{
		{"pure imports an actor", "internal/routing/policy", "actors/router", "pure routing logic imports an actor"},
		{"pure imports an edge", "internal/routing/routes", "internal/edge/httpedge", "pure routing logic imports an edge"},
		{"pure imports an adapter", "internal/routing/prefixindex", "internal/adapter/metrics", "pure routing logic imports an adapter"},
		{"pure imports the composition root", "internal/routing/cascade", "internal/runtime/gateway", "pure routing logic imports the composition root"},
		{"pure imports a command", "internal/routing/ring", "cmd/gateway", "pure routing logic imports a command"},
		{"pure imports the wire", "internal/routing/fleet", "internal/wire/openai", "pure routing logic imports the wire layer"},
		{"actor imports an edge", "actors/request", "internal/edge/httpedge", "an actor imports an edge"},
		{"actor imports the composition root", "actors/router", "internal/runtime/gateway", "actors may import only"},
		{"edge imports another edge", "internal/edge/httpedge", "internal/edge/adminhttp", "one edge imports another"},
		{"edge imports another edge's subpackage", "internal/edge/adminhttp", "internal/edge/registryrpc/peer", "one edge imports another"},
		{"non-test code imports a test kit", "internal/runtime/gateway", "internal/testkit/bubble", "non-test code imports a test kit"},
		{"a pure package imports a test kit", "internal/routing/policy", "internal/testkit/leakcheck", "non-test code imports a test kit"},
		{"a command imports a test kit", "cmd/tlbench", "internal/testkit/bubble", "non-test code imports a test kit"},
		{"a command imports another", "cmd/tlctl", "cmd/gateway", "one command imports another"},
		{"a test kit imports a command", "internal/testkit/cluster", "cmd/gateway", "testkit may import only"},
		{"a test kit imports a test", "internal/testkit/cluster", "test/replicas", "testkit may import only"},
		{"a guard imports an edge", "internal/guard/auth", "internal/edge/httpedge", "guard may import only"},
		{"the engine imports the router", "enginesim", "actors/router", "engine may import only"},
		{"an actor builds the file store itself", "actors/admin", "internal/adapter/store/filestore", "an actor imports an adapter"},
		{"an actor imports the stores' adapter", "actors/admin", "internal/adapter/store", "an actor imports an adapter"},
		{"an actor imports tracing", "actors/request", "internal/adapter/tracing", "an actor imports an adapter"},
		{"the wire imports tracing", "internal/wire/engineclient", "internal/adapter/tracing", "the wire imports an adapter"},

		{"pure imports pure", "internal/routing/policy", "internal/routing/ring", ""},
		{"pure imports protos", "internal/routing/fleet", "protos/tl/control/v1", ""},
		{"actor imports pure", "actors/router", "internal/routing/policy", ""},
		{"actor imports an actor", "actors/router", "actors/registry", ""},
		{"edge imports an actor", "internal/edge/httpedge", "actors/request", ""},
		{"edge imports a guard", "internal/edge/httpedge", "internal/guard/auth", ""},
		{"edge imports its own subpackage", "internal/edge/registryrpc", "internal/edge/registryrpc/peer", ""},
		{"composition root imports an edge", "internal/runtime/gateway", "internal/edge/httpedge", ""},
		{"a test imports a test kit", "test/replicas", "internal/testkit/leakcheck", ""},
		{"a test kit imports the composition root", "internal/testkit/cluster", "internal/runtime/gateway", ""},
		{"a test kit imports another", "internal/testkit/cluster", "internal/testkit/leakcheck", ""},
		{"a command imports its own subpackage", "cmd/gateway", "cmd/gateway/internal/x", ""},
		{"an actor imports its own port", "actors/admin", "actors/admin/store", ""},
		{"an adapter implements an actor's port", "internal/adapter/store/filestore", "actors/admin/store", ""},
		{"an adapter sends to an actor", "internal/adapter/probe", "actors/registry", ""},
		{"an actor carries the trace context", "actors/request", "internal/wire/tracectx", ""},
		{"the wire carries the trace context", "internal/wire/engineclient", "internal/wire/tracectx", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Check([]Package{{Path: m(tt.from), Imports: []string{m(tt.to)}}})
			switch {
			case tt.rule == "" && len(got) != 0:
				t.Fatalf("allowed import reported: %v", got)
			case tt.rule != "" && len(got) != 1:
				t.Fatalf("forbidden import %s -> %s: got %d violations %v, want 1", tt.from, tt.to, len(got), got)
			case tt.rule != "":
				msg := got[0].String()
				if !strings.Contains(msg, tt.rule) || !strings.Contains(msg, tt.from+" imports "+tt.to) {
					t.Fatalf("violation %q does not name the import %s -> %s with rule %q", msg, tt.from, tt.to, tt.rule)
				}
			}
		})
	}
}

// TestCheckNamesPackagesInNoLayer: a package of the module outside every
// layer's folder is reported, and imports from outside the module are not
// checked.
func TestCheckNamesPackagesInNoLayer(t *testing.T) {
	got := Check([]Package{
		{Path: Module + "/internal/misc", Imports: nil},
		{Path: Module + "/internal/routing/policy", Imports: []string{"fmt", "github.com/cespare/xxhash/v2"}},
	})
	if len(got) != 1 || !strings.Contains(got[0].String(), "internal/misc") || !strings.Contains(got[0].Rule, "no layer") {
		t.Fatalf("got %v, want one violation naming internal/misc as in no layer", got)
	}
}
