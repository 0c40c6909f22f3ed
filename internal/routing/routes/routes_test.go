package routes

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/tlgate/tlgate/internal/routing/cascade"
	"github.com/tlgate/tlgate/internal/routing/ring"
	"github.com/tlgate/tlgate/internal/testkit/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

func TestCanarySplit(t *testing.T) {
	r := Route{Model: "smol", Backends: []Backend{{"smol-v3", 0.9}, {"smol-v4", 0.1}}}
	const n = 10000
	canary := 0
	for i := range n {
		switch got := PickBackend(r, fmt.Sprintf("req-%d", i)); got {
		case "smol-v4":
			canary++
		case "smol-v3":
		default:
			t.Fatalf("PickBackend = %q, not a backend", got)
		}
	}
	mean, sd := n*0.1, math.Sqrt(n*0.1*0.9)
	if math.Abs(float64(canary)-mean) > 4*sd {
		t.Errorf("canary got %d of %d, want %v ± %v (4 sd)", canary, n, mean, 4*sd)
	}

	// Three backends and non-normalised weights: shares follow weight/total.
	r3 := Route{Model: "m", Backends: []Backend{{"a", 1}, {"b", 2}, {"c", 5}}}
	counts := map[string]int{}
	for i := range n {
		counts[PickBackend(r3, fmt.Sprintf("id-%d", i))]++
	}
	for _, b := range r3.Backends {
		p := b.Weight / 8
		mean, sd := n*p, math.Sqrt(n*p*(1-p))
		if math.Abs(float64(counts[b.Model])-mean) > 4*sd {
			t.Errorf("backend %s got %d of %d, want %v ± %v", b.Model, counts[b.Model], n, mean, 4*sd)
		}
	}

	// One id always lands on the same backend.
	for i := range 50 {
		id := fmt.Sprintf("sticky-%d", i)
		first := PickBackend(r, id)
		for range 20 {
			if got := PickBackend(r, id); got != first {
				t.Fatalf("id %q went to %q then %q", id, first, got)
			}
		}
	}

	if got := PickBackend(Route{Model: "big"}, "x"); got != "big" {
		t.Errorf("no backends: PickBackend = %q, want the route's model", got)
	}
	if got := PickBackend(Route{Model: "big-pd", Backends: []Backend{{"big", 1}}}, "x"); got != "big" {
		t.Errorf("one backend: PickBackend = %q, want big", got)
	}
	tbl, err := NewTable([]Route{r})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := tbl.Served(r, "req-1"), PickBackend(r, "req-1"); got != want {
		t.Errorf("Served = %q, PickBackend = %q", got, want)
	}
}

// sample is the SPEC's example table.
func sample() []Route {
	return []Route{
		{Model: "smol", Aliases: []string{"smol-latest"}, Backends: []Backend{{"smol-v3", 0.9}, {"smol-v4", 0.1}}},
		{Model: "auto", Cascade: []Step{{"smol", "mean_logprob > -1.2"}, {"big", ""}}},
		{Model: "big-pd", Backends: []Backend{{"big", 1}}, Targets: []string{"disaggregated"}},
	}
}

func TestValidate(t *testing.T) {
	if err := Validate(sample()); err != nil {
		t.Fatalf("the SPEC's example table: %v", err)
	}
	if err := Validate(nil); err != nil {
		t.Fatalf("empty table: %v", err)
	}
	long := strings.Repeat("m", MaxIDLen)
	tests := []struct {
		name string
		rs   []Route
		want []string // every message, in order
	}{
		{"model required", []Route{{}}, []string{"routes[0].model: required"}},
		{"model charset", []Route{{Model: "a b"}}, []string{`routes[0].model: invalid model id "a b": byte 2 is ' ' (allowed: A-Z a-z 0-9 . _ : / -)`}},
		{"model length", []Route{{Model: long}, {Model: long + "m"}}, []string{"routes[1].model: must be at most 256 bytes, got 257"}},
		{"model ids may use . _ : / -", []Route{{Model: "org/Model-7B_v1.2:q4"}}, nil},
		{"duplicate model", []Route{{Model: "smol"}, {Model: "smol"}}, []string{`routes[1].model: "smol" already names routes[0]`}},
		{"alias names another route", []Route{{Model: "smol"}, {Model: "big"}, {Model: "x", Aliases: []string{"smol"}}}, []string{`routes[2].aliases[0]: "smol" already names routes[0]`}},
		{"alias repeats own model", []Route{{Model: "smol", Aliases: []string{"smol"}}}, []string{`routes[0].aliases[0]: "smol" already names routes[0]`}},
		{"empty alias", []Route{{Model: "smol", Aliases: []string{""}}}, []string{"routes[0].aliases[0]: required"}},
		{"weight zero", []Route{{Model: "a"}, {Model: "b", Backends: []Backend{{"b1", 0}}}}, []string{"routes[1].backends[0].weight: must be > 0, got 0"}},
		{"weight negative", []Route{{Model: "b", Backends: []Backend{{"b1", 1}, {"b2", -0.5}}}}, []string{"routes[0].backends[1].weight: must be > 0, got -0.5"}},
		{"weight NaN", []Route{{Model: "b", Backends: []Backend{{"b1", math.NaN()}}}}, []string{"routes[0].backends[0].weight: must be > 0, got NaN"}},
		{"weight infinite", []Route{{Model: "b", Backends: []Backend{{"b1", math.Inf(1)}}}}, []string{"routes[0].backends[0].weight: must be finite, got +Inf"}},
		{"weights sum infinite", []Route{{Model: "b", Backends: []Backend{{"b1", 1.7e308}, {"b2", 1.7e308}}}}, []string{"routes[0].backends: the weights' sum must be finite, got +Inf"}},
		{"backend model required", []Route{{Model: "b", Backends: []Backend{{"", 1}}}}, []string{"routes[0].backends[0].model: required"}},
		{"backend repeated", []Route{{Model: "b", Backends: []Backend{{"x", 1}, {"x", 2}}}}, []string{`routes[0].backends[1].model: "x" repeats backends[0]`}},
		{"backends and cascade", []Route{{Model: "b", Backends: []Backend{{"x", 1}}, Cascade: []Step{{"s", "min_logprob > -1"}, {"l", ""}}}}, []string{"routes[0]: backends and cascade are mutually exclusive"}},
		{"one step", []Route{{Model: "auto", Cascade: []Step{{"big", ""}}}}, []string{"routes[0].cascade: needs at least 2 steps, got 1"}},
		{"accept_if missing", []Route{{Model: "auto", Cascade: []Step{{"smol", ""}, {"big", ""}}}}, []string{"routes[0].cascade[0].accept_if: required on every step but the last"}},
		{"accept_if on last", []Route{{Model: "auto", Cascade: []Step{{"smol", "mean_logprob > -1"}, {"big", "mean_logprob > -2"}}}}, []string{`routes[0].cascade[1].accept_if: must be empty on the last step (its answer is always kept), got "mean_logprob > -2"`}},
		{"accept_if unknown operator", []Route{{Model: "a"}, {Model: "auto", Cascade: []Step{{"smol", "mean_logprob => -1.2"}, {"big", ""}}}}, []string{`routes[1].cascade[0].accept_if: unknown operator "=>" at column 14 (want > or >=)`}},
		{"accept_if unknown statistic", []Route{{Model: "auto", Cascade: []Step{{"smol", "avg > 1"}, {"big", ""}}}}, []string{`routes[0].cascade[0].accept_if: unknown statistic "avg" at column 1 (want mean_logprob or min_logprob)`}},
		{"step model required", []Route{{Model: "auto", Cascade: []Step{{"", "min_logprob >= -2"}, {"big", ""}}}}, []string{"routes[0].cascade[0].model: required"}},
		{"three steps", []Route{{Model: "auto", Cascade: []Step{{"s", "min_logprob >= -2"}, {"m", "mean_logprob > -1"}, {"l", ""}}}}, nil},
		{"two targets", []Route{{Model: "a", Targets: []string{"unified", "disaggregated"}}}, []string{"routes[0].targets: at most one target, got 2"}},
		{"bad target", []Route{{Model: "a"}, {Model: "b", Targets: []string{"x"}}}, []string{`routes[1].targets[0]: must be "unified" or "disaggregated", got "x"`}},
		{"unified target", []Route{{Model: "a", Targets: []string{"unified"}}}, nil},
		{"target on a cascade", []Route{{Model: "auto", Cascade: []Step{{"s", "min_logprob > -1"}, {"l", ""}}, Targets: []string{"disaggregated"}}}, []string{"routes[0].targets: not allowed on a cascade route (each step's own route decides)"}},
		{"on_escalation_failure off a cascade", []Route{{Model: "m", OnEscalationFailure: EscalationError}}, []string{`routes[0].on_escalation_failure: only a cascade route escalates, got "error" on a route with no cascade`}},
		{"on_escalation_failure unknown", []Route{{Model: "auto", Cascade: []Step{{"s", "min_logprob > -1"}, {"l", ""}}, OnEscalationFailure: "fail"}}, []string{`routes[0].on_escalation_failure: must be "answer" or "error", got "fail"`}},
		{
			"every error at once",
			[]Route{{Model: ""}, {Model: "b", Backends: []Backend{{"x", 0}}, Targets: []string{"y"}}},
			[]string{"routes[0].model: required", "routes[1].backends[0].weight: must be > 0, got 0", `routes[1].targets[0]: must be "unified" or "disaggregated", got "y"`},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := Validate(tc.rs)
			if got := messages(err); !slices.Equal(got, tc.want) {
				t.Fatalf("Validate errors\n got %q\nwant %q", got, tc.want)
			}
			if err != nil && !errors.Is(err, ErrInvalidRoutes) {
				t.Fatalf("error does not wrap ErrInvalidRoutes: %v", err)
			}
			if _, terr := NewTable(tc.rs); (terr == nil) != (err == nil) {
				t.Fatalf("NewTable error %v, Validate error %v", terr, err)
			}
		})
	}
}

// messages splits a joined error into its messages.
func messages(err error) []string {
	if err == nil {
		return nil
	}
	var out []string
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			var fe *FieldError
			if !errors.As(e, &fe) {
				return []string{"not a *FieldError: " + e.Error()}
			}
			out = append(out, fe.Error())
		}
		return out
	}
	return []string{err.Error()}
}

func TestValidateCycles(t *testing.T) {
	step := func(first, last string) []Step {
		return []Step{{first, "mean_logprob > -1"}, {last, ""}}
	}
	tests := []struct {
		name string
		rs   []Route
		want []string
	}{
		{"self", []Route{{Model: "a", Cascade: step("a", "big")}}, []string{"routes[0].cascade[0].model: cascade cycle a -> a"}},
		{"self through an alias", []Route{{Model: "a", Aliases: []string{"a2"}, Cascade: step("small", "a2")}}, []string{"routes[0].cascade[1].model: cascade cycle a -> a"}},
		{"two routes", []Route{{Model: "a", Cascade: step("s", "b")}, {Model: "b", Cascade: step("a", "l")}}, []string{"routes[1].cascade[0].model: cascade cycle a -> b -> a"}},
		{
			"three routes through aliases",
			[]Route{
				{Model: "x", Cascade: step("s", "l")}, // not on the cycle
				{Model: "a", Cascade: step("s", "b-alias")},
				{Model: "b", Aliases: []string{"b-alias"}, Cascade: step("c", "l")},
				{Model: "c", Cascade: step("s", "a")},
			},
			[]string{"routes[3].cascade[1].model: cascade cycle a -> b -> c -> a"},
		},
		{
			"a chain of cascades is fine",
			[]Route{{Model: "a", Cascade: step("b", "big")}, {Model: "b", Cascade: step("smol", "c")}, {Model: "c", Cascade: step("smol", "big")}},
			nil,
		},
		{
			"a step naming a backends route ends the chain",
			[]Route{{Model: "smol", Backends: []Backend{{"smol", 1}}}, {Model: "auto", Cascade: step("smol", "auto-big")}, {Model: "auto-big", Backends: []Backend{{"auto", 1}}}},
			nil,
		},
		{
			"two separate cycles",
			[]Route{{Model: "a", Cascade: step("a", "l")}, {Model: "b", Cascade: step("s", "c")}, {Model: "c", Cascade: step("b", "l")}},
			[]string{"routes[0].cascade[0].model: cascade cycle a -> a", "routes[2].cascade[0].model: cascade cycle b -> c -> b"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := messages(Validate(tc.rs)); !slices.Equal(got, tc.want) {
				t.Fatalf("Validate errors\n got %q\nwant %q", got, tc.want)
			}
		})
	}
}

func TestTable(t *testing.T) {
	in := sample()
	tbl, err := NewTable(in)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := tbl.Models(), []string{"auto", "big-pd", "smol", "smol-latest"}; !slices.Equal(got, want) {
		t.Errorf("Models = %q, want %q", got, want)
	}
	if tbl.Len() != 3 {
		t.Errorf("Len = %d", tbl.Len())
	}
	for _, tc := range []struct {
		model, route string
		ok           bool
	}{
		{"smol", "smol", true}, {"smol-latest", "smol", true}, {"auto", "auto", true}, {"big-pd", "big-pd", true},
		{"big", "", false}, {"smol-v3", "", false}, {"", "", false},
	} {
		r, ok := tbl.Lookup(tc.model)
		if ok != tc.ok || r.Model != tc.route {
			t.Errorf("Lookup(%q) = %q, %v; want %q, %v", tc.model, r.Model, ok, tc.route, tc.ok)
		}
	}
	if r := tbl.Resolve("big"); !reflect.DeepEqual(r, Route{Model: "big"}) {
		t.Errorf("Resolve of a model with no route = %+v, want its own route", r)
	}
	if r := tbl.Resolve("smol-latest"); r.Model != "smol" {
		t.Errorf("Resolve(smol-latest) = %+v", r)
	}
	pd, _ := tbl.Lookup("big-pd")
	smol, _ := tbl.Lookup("smol")
	if !tbl.IsDisaggregated(pd) || tbl.IsDisaggregated(smol) || tbl.IsDisaggregated(Route{Model: "x", Targets: []string{"unified"}}) {
		t.Error("IsDisaggregated wrong")
	}
	auto, _ := tbl.Lookup("auto")
	if !auto.IsCascade() || smol.IsCascade() {
		t.Error("IsCascade wrong")
	}

	rule, ok := tbl.Rule("auto", 0)
	if !ok || rule != (cascade.Accept{Stat: cascade.MeanLogprob, Op: cascade.Greater, Threshold: -1.2}) {
		t.Errorf("Rule(auto, 0) = %+v, %v", rule, ok)
	}
	for _, tc := range []struct {
		model string
		step  int
	}{{"auto", 1}, {"auto", -1}, {"auto", 2}, {"smol", 0}, {"nope", 0}} {
		if _, ok := tbl.Rule(tc.model, tc.step); ok {
			t.Errorf("Rule(%q, %d) ok, want none", tc.model, tc.step)
		}
	}

	// The table owns its copy: neither the input nor Routes' result aliases it.
	in[0].Aliases[0] = "changed"
	in[0].Backends[0].Weight = 42
	out := tbl.Routes()
	if !reflect.DeepEqual(out, sample()) {
		t.Fatalf("Routes = %+v, want the input as given", out)
	}
	out[1].Cascade[0].Model = "changed"
	if r, _ := tbl.Lookup("auto"); r.Cascade[0].Model != "smol" {
		t.Error("mutating Routes' result changed the table")
	}

	empty, err := NewTable(nil)
	if err != nil || len(empty.Models()) != 0 || len(empty.Routes()) != 0 {
		t.Fatalf("empty table: %v", err)
	}
	if _, err := NewTable([]Route{{}}); !errors.Is(err, ErrInvalidRoutes) {
		t.Fatalf("NewTable of an invalid table: %v", err)
	}
}

func TestParseJSON(t *testing.T) {
	good := `{"routes":[
		{"model":"smol","aliases":["smol-latest"],"backends":[{"model":"smol-v3","weight":0.9},{"model":"smol-v4","weight":0.1}]},
		{"model":"auto","cascade":[{"model":"smol","accept_if":"mean_logprob > -1.2"},{"model":"big"}]},
		{"model":"big-pd","backends":[{"model":"big","weight":1}],"targets":["disaggregated"]}]}`
	rs, err := ParseJSON([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(rs, sample()) {
		t.Fatalf("ParseJSON = %+v", rs)
	}
	// Round trip through the admin body.
	body, err := EncodeJSON(7, rs)
	if err != nil {
		t.Fatal(err)
	}
	back, err := ParseJSON(body)
	if err != nil || !reflect.DeepEqual(back, rs) {
		t.Fatalf("round trip: %+v, %v (body %s)", back, err, body)
	}
	if b, _ := EncodeJSON(3, nil); string(b) != `{"epoch":3,"routes":[]}` {
		t.Errorf("EncodeJSON of an empty table = %s", b)
	}

	for _, tc := range []struct {
		name, body string
		want       []Route
		wantErr    string
	}{
		{"empty list", `{"routes":[]}`, []Route{}, ""},
		{"epoch ignored", `{"epoch":5,"routes":[{"model":"a"}]}`, []Route{{Model: "a"}}, ""},
		{"nulls are absent", `{"routes":[{"model":"a","aliases":null,"backends":null,"cascade":null,"targets":null}]}`, []Route{{Model: "a"}}, ""},
		{"empty body", ``, nil, "body: empty"},
		{"not an object", `[{"model":"a"}]`, nil, `body: want an object, got [{"model":"a"}]`},
		{"routes missing", `{}`, nil, "routes: required"},
		{"routes null", `{"routes":null}`, nil, "routes: required, got null (send [] for an empty table)"},
		{"unknown top-level field", `{"routes":[],"rutes":[]}`, nil, "rutes: unknown field (known: routes, epoch)"},
		{"unknown route field", `{"routes":[{"model":"a"},{"model":"b","alias":["c"]}]}`, nil, "routes[1].alias: unknown field (known: model, aliases, backends, cascade, targets, priority, ttft_objective_ms, on_escalation_failure)"},
		{"priority and objective", `{"routes":[{"model":"a","priority":-3,"ttft_objective_ms":500}]}`, []Route{{Model: "a", Priority: -3, TTFTObjectiveMs: 500}}, ""},
		{"priority as string", `{"routes":[{"model":"a","priority":"high"}]}`, nil, `routes[0].priority: want an integer, got "high"`},
		{"objective as fraction", `{"routes":[{"model":"a","ttft_objective_ms":0.5}]}`, nil, `routes[0].ttft_objective_ms: want an integer, got 0.5`},
		{"unknown backend field", `{"routes":[{"model":"b","backends":[{"model":"x","wieght":1}]}]}`, nil, "routes[0].backends[0].wieght: unknown field (known: model, weight)"},
		{"unknown step field", `{"routes":[{"model":"a","cascade":[{"model":"s","accept":"x"}]}]}`, nil, "routes[0].cascade[0].accept: unknown field (known: model, accept_if)"},
		{"weight as string", `{"routes":[{"model":"b","backends":[{"model":"x","weight":"0.5"}]}]}`, nil, `routes[0].backends[0].weight: want a number, got "0.5"`},
		{"model as number", `{"routes":[{"model":7}]}`, nil, "routes[0].model: want a string, got 7"},
		{"aliases as string", `{"routes":[{"model":"a","aliases":"b"}]}`, nil, `routes[0].aliases: want a list of strings, got "b"`},
		{"routes as object", `{"routes":{"model":"a"}}`, nil, `routes: want a list, got {"model":"a"}`},
		{"route as list", `{"routes":[[]]}`, nil, "routes[0]: want an object, got []"},
		{"backend as string", `{"routes":[{"model":"a","backends":["x"]}]}`, nil, `routes[0].backends[0]: want an object, got "x"`},
		{"cascade as object", `{"routes":[{"model":"a","cascade":{}}]}`, nil, "routes[0].cascade: want a list, got {}"},
		{"duplicate field", `{"routes":[{"model":"a","model":"b"}]}`, nil, "routes[0].model: duplicate field"},
		{"trailing data", `{"routes":[]} {"routes":[]}`, nil, "body: trailing data after the object"},
		{"truncated", `{"routes":[{"model":"a"`, nil, "body: not valid JSON: it ends inside a value"},
		{"not JSON", `{"routes": x}`, nil, "body: not valid JSON (at byte 12)"},
		{"trailing garbage", `{"routes":[]} x`, nil, "body: trailing data after the object"},
		{"nested too deep", `{"routes":` + strings.Repeat("[", 200000) + strings.Repeat("]", 200000) + `}`, nil, "body: nested more than 32 levels deep (a route table needs 5)"},
		{"deep inside a string is no nesting", `{"routes":[{"model":"` + strings.Repeat("[", 100) + `\"{"}]}`, []Route{{Model: strings.Repeat("[", 100) + `"{`}}, ""},
		{"long unknown field cut", `{"routes":[],"` + strings.Repeat("k", 5000) + `":1}`, nil, strings.Repeat("k", 128) + "… (5000 bytes): unknown field (known: routes, epoch)"},
		{"epoch negative", `{"epoch":-1,"routes":[]}`, nil, "epoch: want a non-negative integer, got -1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseJSON([]byte(tc.body))
			if tc.wantErr == "" {
				if err != nil || !reflect.DeepEqual(got, tc.want) {
					t.Fatalf("ParseJSON = %+v, %v; want %+v", got, err, tc.want)
				}
				return
			}
			if !errors.Is(err, ErrBadJSON) {
				t.Fatalf("ParseJSON error %v does not wrap ErrBadJSON", err)
			}
			if msg := strings.TrimPrefix(err.Error(), ErrBadJSON.Error()+": "); !strings.HasPrefix(msg, tc.wantErr) {
				t.Fatalf("ParseJSON error\n got %s\nwant %s...", msg, tc.wantErr)
			}
		})
	}
}

func FuzzRouteTableJSON(f *testing.F) {
	for _, s := range []string{
		`{"routes":[{"model":"smol","aliases":["smol-latest"],"backends":[{"model":"smol-v3","weight":0.9},{"model":"smol-v4","weight":0.1}]},{"model":"auto","cascade":[{"model":"smol","accept_if":"mean_logprob > -1.2"},{"model":"big"}]},{"model":"big-pd","backends":[{"model":"big","weight":1}],"targets":["disaggregated"]}]}`,
		`{"routes":[{"model":"a","cascade":[{"model":"a","accept_if":"min_logprob>=0"},{"model":"b"}]}]}`,
		`{"epoch":1,"routes":[]}`, `{"routes":[{"model":"x","targets":["unified"]}]}`, `[]`, `{`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		rs, err := ParseJSON(body)
		if err != nil {
			if !errors.Is(err, ErrBadJSON) {
				t.Fatalf("error %v does not wrap ErrBadJSON", err)
			}
			return
		}
		tbl, err := NewTable(rs)
		if err != nil {
			if !errors.Is(err, ErrInvalidRoutes) {
				t.Fatalf("NewTable error %v does not wrap ErrInvalidRoutes", err)
			}
			return
		}
		// A valid table survives the admin API round trip and answers for
		// each of its names.
		enc, err := EncodeJSON(1, tbl.Routes())
		if err != nil {
			t.Fatal(err)
		}
		back, err := ParseJSON(enc)
		if err != nil {
			t.Fatalf("re-parse of %s: %v", enc, err)
		}
		tbl2, err := NewTable(back)
		if err != nil {
			t.Fatalf("re-validate of %s: %v", enc, err)
		}
		if !slices.Equal(tbl.Models(), tbl2.Models()) {
			t.Fatalf("models changed: %q -> %q", tbl.Models(), tbl2.Models())
		}
		for _, m := range tbl.Models() {
			r, ok := tbl.Lookup(m)
			if !ok {
				t.Fatalf("Lookup(%q) failed", m)
			}
			if served := PickBackend(r, "req"); CheckModelID(served) != nil {
				t.Fatalf("PickBackend(%q) = %q, not a model id", m, served)
			}
		}
	})
}

func BenchmarkPickBackend(b *testing.B) {
	r := sample()[0]
	for b.Loop() {
		PickBackend(r, "9f1c2d7e-6a0b-4d3e-9a51-2f0c7b1e8d44")
	}
}

func BenchmarkLookup(b *testing.B) {
	tbl, err := NewTable(sample())
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		tbl.Lookup("smol-latest")
	}
}

// TestPickBackendDraw pins the draw to its definition: the backend whose
// cumulative weight interval holds ring.Uniform(id) × total.
func TestPickBackendDraw(t *testing.T) {
	r := Route{Model: "m", Backends: []Backend{{"a", 0.25}, {"b", 0.5}, {"c", 0.25}}}
	for i := range 200 {
		id := fmt.Sprintf("r%d", i)
		u := ring.Uniform(id)
		want := "c"
		switch {
		case u < 0.25:
			want = "a"
		case u < 0.75:
			want = "b"
		}
		if got := PickBackend(r, id); got != want {
			t.Fatalf("PickBackend(%q) = %q, want %q (u = %v)", id, got, want, u)
		}
	}
}
