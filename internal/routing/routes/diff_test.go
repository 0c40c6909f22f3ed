package routes

import (
	"reflect"
	"testing"
)

// TestDiff: routes added, removed and changed (with the fields that
// differ), sorted by model; an empty list and an absent one are equal.
func TestDiff(t *testing.T) {
	old := []Route{
		{Model: "a", Backends: []Backend{{"m", 1}}},
		{Model: "b", Aliases: []string{"bb"}},
		{Model: "c", Cascade: []Step{{"a", "mean_logprob > -1"}, {"m", ""}}},
	}
	next := []Route{
		{Model: "c", Cascade: []Step{{"a", "mean_logprob > -2"}, {"m", ""}}, OnEscalationFailure: EscalationError},
		{Model: "a", Backends: []Backend{{"m", 1}}, Aliases: []string{}},
		{Model: "d"},
	}
	got := Diff(old, next)
	type short struct {
		Model, Kind string
		Fields      []string
	}
	var s []short
	for _, ch := range got {
		s = append(s, short{ch.Model, ch.Kind, ch.Fields})
		if (ch.Before == nil) != (ch.Kind == ChangeAdded) || (ch.After == nil) != (ch.Kind == ChangeRemoved) {
			t.Errorf("%s %s: before %v after %v", ch.Model, ch.Kind, ch.Before, ch.After)
		}
	}
	want := []short{{"b", ChangeRemoved, nil}, {"c", ChangeChanged, []string{"cascade", "on_escalation_failure"}}, {"d", ChangeAdded, nil}}
	if !reflect.DeepEqual(s, want) {
		t.Fatalf("Diff = %+v, want %+v", s, want)
	}
	if Diff(old, old) != nil {
		t.Fatal("a table against itself has changes")
	}
}

// TestUnserved: every model a request would be sent to that no worker
// serves is warned about, by path, saying whether the gateway knows it.
func TestUnserved(t *testing.T) {
	rs := []Route{
		{Model: "smol", Backends: []Backend{{"v3", 0.9}, {"v4", 0.1}}},
		{Model: "auto", Cascade: []Step{{"smol", "mean_logprob > -1"}, {"big", ""}}},
		{Model: "own"},
	}
	serving := map[string]Serving{"v3": ServedNow, "v4": Known, "own": ServedNow}
	if got := Served(rs); !reflect.DeepEqual(got, []string{"big", "own", "v3", "v4"}) {
		t.Fatalf("Served = %v", got)
	}
	var paths []string
	for _, w := range Unserved(rs, func(m string) Serving { return serving[m] }) {
		paths = append(paths, w.Path)
	}
	if want := []string{"routes[0].backends[1].model", "routes[1].cascade[1].model"}; !reflect.DeepEqual(paths, want) {
		t.Fatalf("Unserved paths %v, want %v", paths, want)
	}
}
