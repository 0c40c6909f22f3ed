package admin

import (
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/tlgate/tlgate/internal/routing/routes"
	"github.com/tlgate/tlgate/internal/testkit/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

func TestCheckIfMatch(t *testing.T) {
	cases := []struct {
		header string
		want   error
	}{
		{"", ErrIfMatchRequired},
		{"   ", ErrIfMatchRequired},
		{`"5"`, nil},
		{`5`, nil},
		{` "5" `, nil},
		{`"4", "5"`, nil},
		{`*`, nil},
		{`"4"`, ErrETagMismatch},
		{`4`, ErrETagMismatch},
		{`"6"`, ErrETagMismatch},
		{`W/"5"`, ErrETagMismatch},
		{`"05"`, ErrETagMismatch},
		{`"5`, ErrETagMismatch},
		{`""`, ErrETagMismatch},
		{`"5"x`, ErrETagMismatch},
	}
	for _, c := range cases {
		err := CheckIfMatch(c.header, 5)
		if c.want == nil && err != nil || c.want != nil && !errors.Is(err, c.want) {
			t.Errorf("CheckIfMatch(%q, 5) = %v, want %v", c.header, err, c.want)
		}
	}
	if err := CheckIfMatch(`"4"`, 5); !strings.Contains(err.Error(), `current ETag "5"`) {
		t.Errorf("mismatch message %q does not give the current ETag", err)
	}
}

func TestETag(t *testing.T) {
	if got := ETag(0); got != `"0"` {
		t.Errorf("ETag(0) = %s", got)
	}
	if got := ETag(18446744073709551615); got != `"18446744073709551615"` {
		t.Errorf("ETag(max) = %s", got)
	}
}

func TestParseTable(t *testing.T) {
	cases := []struct {
		name, body string
		want       string // "" means valid
		path       string
	}{
		{"valid", `{"routes":[{"model":"a","backends":[{"model":"a-v1","weight":1}]}]}`, "", ""},
		{"epoch ignored", `{"epoch":99,"routes":[]}`, "", ""},
		{"bad accept_if", `{"routes":[{"model":"x"},{"model":"a","cascade":[{"model":"b","accept_if":"mean > 1"},{"model":"c"}]}]}`,
			"invalid route table: routes[1].cascade[0].accept_if: ", "routes[1].cascade[0].accept_if"},
		{"accept_if on the last step", `{"routes":[{"model":"a","cascade":[{"model":"b","accept_if":"mean_logprob > -1"},{"model":"c","accept_if":"mean_logprob > -1"}]}]}`,
			"routes[0].cascade[1].accept_if: must be empty", "routes[0].cascade[1].accept_if"},
		{"two problems on one line", `{"routes":[{"model":"a"},{"model":"a","targets":["x"]}]}`,
			"routes[1].model: \"a\" already names routes[0]; routes[1].targets[0]", "routes[1].model"},
		{"unknown field", `{"routes":[{"model":"a","wieght":1}]}`, "invalid route table: routes[0].wieght: unknown field", ""},
		{"wrong type", `{"routes":[{"model":"a","backends":[{"model":"b","weight":"x"}]}]}`, "routes[0].backends[0].weight: want a number", ""},
		{"not json", `routes`, "invalid route table: body: not valid JSON (at byte 1)", ""},
		{"empty", ``, "invalid route table: body: empty", ""},
		{"no routes", `{}`, "routes: required", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tab, err := ParseTable([]byte(c.body), nil)
			if c.want == "" {
				if err != nil || tab == nil {
					t.Fatalf("ParseTable: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("ParseTable accepted %s", c.body)
			}
			if !errors.Is(err, ErrInvalidRoutes) {
				t.Errorf("%v does not wrap ErrInvalidRoutes", err)
			}
			if !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("error %q, want one line containing %q", err, c.want)
			}
			if got := FieldPath(err); got != c.path {
				t.Errorf("FieldPath = %q, want %q", got, c.path)
			}
		})
	}
	// A nil body takes the routes given.
	if _, err := ParseTable(nil, []routes.Route{{Model: "a"}, {Model: "a"}}); !errors.Is(err, ErrInvalidRoutes) {
		t.Errorf("ParseTable(nil, duplicate) = %v", err)
	}
	if tab, err := ParseTable(nil, nil); err != nil || tab.Len() != 0 {
		t.Errorf("ParseTable(nil, nil) = %v, %v; want an empty table", tab, err)
	}
}

func mustTable(t *testing.T, rs []routes.Route) *routes.Table {
	t.Helper()
	tab, err := routes.NewTable(rs)
	if err != nil {
		t.Fatal(err)
	}
	return tab
}

func fixture(t *testing.T) *routes.Table {
	return mustTable(t, []routes.Route{
		{Model: "smol", Aliases: []string{"smol-latest"}, Backends: []routes.Backend{{Model: "smol-v3", Weight: 0.9}, {Model: "smol-v4", Weight: 0.1}}},
		{Model: "big"},
		{Model: "auto", Cascade: []routes.Step{{Model: "smol", AcceptIf: "mean_logprob > -1.2"}, {Model: "mid", AcceptIf: "min_logprob >= -3"}, {Model: "big"}}},
		{Model: "meta", Cascade: []routes.Step{{Model: "auto", AcceptIf: "mean_logprob > -1"}, {Model: "huge"}}},
		{Model: "big-pd", Backends: []routes.Backend{{Model: "big", Weight: 1}}, Targets: []string{"disaggregated"}},
	})
}

func TestServedModels(t *testing.T) {
	tab := fixture(t)
	cases := []struct {
		model string
		want  []string
		ok    bool
	}{
		{"smol", []string{"smol-v3", "smol-v4"}, true},
		{"smol-latest", []string{"smol-v3", "smol-v4"}, true},
		{"big", []string{"big"}, true},
		// Steps resolve like requests: smol through its backends, mid
		// (no route) as is, big through its own route.
		{"auto", []string{"smol-v3", "smol-v4", "mid", "big"}, true},
		// A step that is itself a cascade is followed.
		{"meta", []string{"smol-v3", "smol-v4", "mid", "big", "huge"}, true},
		{"big-pd", []string{"big"}, true},
		{"smol-v3", nil, false},
		{"nope", nil, false},
	}
	for _, c := range cases {
		got, ok := ServedModels(tab, c.model)
		if ok != c.ok || !reflect.DeepEqual(got, c.want) {
			t.Errorf("ServedModels(%q) = %v, %v; want %v, %v", c.model, got, ok, c.want, c.ok)
		}
	}
}

func TestStateResolve(t *testing.T) {
	st := NewState(fixture(t), 3)
	cases := []struct {
		model string
		on    bool
		want  []string
		ok    bool
	}{
		{"smol-latest", true, []string{"smol-v3", "smol-v4"}, true},
		{"smol-v4", true, []string{"smol-v4"}, true}, // a canary backend, before its workers exist
		{"mid", true, []string{"mid"}, true},         // a cascade step with no route
		{"worker-only", true, nil, false},            // only the router knows
		{"worker-only", false, nil, false},
	}
	for _, c := range cases {
		got, ok := st.Resolve(c.model, c.on)
		if ok != c.ok || !reflect.DeepEqual(got, c.want) {
			t.Errorf("Resolve(%q, %v) = %v, %v; want %v, %v", c.model, c.on, got, ok, c.want, c.ok)
		}
	}
	// Once drained, a model can be resumed without asking anyone, even
	// after its workers are gone.
	st.MarkDrained([]string{"worker-only"}, true)
	if got, ok := st.Resolve("worker-only", false); !ok || !reflect.DeepEqual(got, []string{"worker-only"}) {
		t.Errorf("resume of a drained model = %v, %v", got, ok)
	}
	if _, ok := st.Resolve("worker-only", true); ok {
		t.Error("a second drain of a worker's model should still ask the router")
	}
	st.MarkDrained([]string{"worker-only"}, false)
	if _, ok := st.Resolve("worker-only", false); ok {
		t.Error("resumed model still remembered as drained")
	}
}

func TestStatePrepare(t *testing.T) {
	st := NewState(fixture(t), 3)
	good := []byte(`{"routes":[{"model":"a"}]}`)
	cases := []struct {
		name string
		m    PutRoutes
		want error
	}{
		{"no If-Match", PutRoutes{Body: good}, ErrIfMatchRequired},
		// A stale writer hears 412 even when its table is also bad.
		{"stale and bad", PutRoutes{Body: []byte(`{`), IfMatch: `"2"`}, ErrETagMismatch},
		{"bad", PutRoutes{Body: []byte(`{"routes":[{"model":""}]}`), IfMatch: `"3"`}, ErrInvalidRoutes},
		{"good", PutRoutes{Body: good, IfMatch: `"3"`}, nil},
		{"good routes", PutRoutes{Routes: []routes.Route{{Model: "a"}}, IfMatch: `3`}, nil},
	}
	for _, c := range cases {
		tab, epoch, err := st.Prepare(&c.m)
		if c.want != nil {
			if !errors.Is(err, c.want) || tab != nil {
				t.Errorf("%s: Prepare = %v, %v; want %v", c.name, tab, err, c.want)
			}
			continue
		}
		if err != nil || epoch != 4 || tab.Len() != 1 {
			t.Errorf("%s: Prepare = %v, %d, %v; want one route at epoch 4", c.name, tab, epoch, err)
		}
	}
	if r := st.Routes(); r.Epoch != 3 || len(r.Routes) != 5 {
		t.Errorf("Prepare changed the state: %+v", r)
	}
}

// TestStatePrepareEpochNeverWraps: at the largest epoch a PUT is refused
// rather than given epoch 0.
func TestStatePrepareEpochNeverWraps(t *testing.T) {
	st := NewState(fixture(t), math.MaxUint64)
	tab, epoch, err := st.Prepare(&PutRoutes{Body: []byte(`{"routes":[{"model":"a"}]}`), IfMatch: `"18446744073709551615"`})
	if !errors.Is(err, ErrEpochExhausted) || tab != nil || epoch != 0 {
		t.Fatalf("Prepare at the largest epoch = %v, %d, %v; want ErrEpochExhausted", tab, epoch, err)
	}
}
