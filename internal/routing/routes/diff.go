package routes

import (
	"fmt"
	"reflect"
	"sort"
)

// The kinds of a Change.
const (
	ChangeAdded   = "added"
	ChangeRemoved = "removed"
	ChangeChanged = "changed"
)

// Change is one route that a new table adds, removes or changes, by its
// model: Before and After are the route in the old and the new table
// (absent for an added or a removed one), Fields the keys whose values
// differ (changed routes only), in the order Route declares them.
type Change struct {
	Model  string   `json:"model"`
	Kind   string   `json:"change"`
	Fields []string `json:"fields,omitempty"`
	Before *Route   `json:"before,omitempty"`
	After  *Route   `json:"after,omitempty"`
}

// Diff lists what replacing old by next changes, route by route (a route
// is its model), sorted by model; nil when nothing does. A route whose
// only difference is an empty list against an absent one is unchanged.
func Diff(old, next []Route) []Change {
	before := make(map[string]Route, len(old))
	for _, r := range old {
		before[r.Model] = r
	}
	var out []Change
	seen := make(map[string]bool, len(next))
	for _, r := range next {
		seen[r.Model] = true
		b, ok := before[r.Model]
		after := r.Clone()
		switch {
		case !ok:
			out = append(out, Change{Model: r.Model, Kind: ChangeAdded, After: &after})
		default:
			if fields := changedFields(b, r); len(fields) > 0 {
				was := b.Clone()
				out = append(out, Change{Model: r.Model, Kind: ChangeChanged, Fields: fields, Before: &was, After: &after})
			}
		}
	}
	for _, r := range old {
		if !seen[r.Model] {
			was := r.Clone()
			out = append(out, Change{Model: r.Model, Kind: ChangeRemoved, Before: &was})
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Model < out[j].Model })
	return out
}

// changedFields names the JSON keys of a and b (one route) whose values
// differ.
func changedFields(a, b Route) []string {
	var out []string
	va, vb := reflect.ValueOf(a), reflect.ValueOf(b)
	t := va.Type()
	for i := range t.NumField() {
		fa, fb := va.Field(i), vb.Field(i)
		if fa.Kind() == reflect.Slice && fa.Len() == 0 && fb.Len() == 0 {
			continue
		}
		if !reflect.DeepEqual(fa.Interface(), fb.Interface()) {
			out = append(out, jsonName(t.Field(i)))
		}
	}
	return out
}

// jsonName is a field's JSON key.
func jsonName(f reflect.StructField) string {
	tag := f.Tag.Get("json")
	for i := 0; i < len(tag); i++ {
		if tag[i] == ',' {
			return tag[:i]
		}
	}
	if tag == "" {
		return f.Name
	}
	return tag
}

// Warning is something about a valid table that is likely a mistake,
// with the path of the field it is about ("routes[0].backends[1].model").
type Warning struct {
	Path    string `json:"path"`
	Message string `json:"message"`
}

// Serving says what the gateway knows of a served model: ServedNow, a
// worker serves it; Known, none does now but it is configured or was
// served lately; Unknown, it has never seen it.
type Serving int

// The values of Serving.
const (
	Unknown Serving = iota
	Known
	ServedNow
)

// Served lists the models requests for table rs would be sent to, as
// Unserved checks them (sorted, each once).
func Served(rs []Route) []string {
	seen := map[string]bool{}
	eachServed(rs, func(_, model string) { seen[model] = true })
	out := make([]string, 0, len(seen))
	for m := range seen {
		out = append(out, m)
	}
	sort.Strings(out)
	return out
}

// eachServed calls fn with the path and model of every model requests
// for table rs would be sent to: a route's backends, else its cascade's
// steps that are no route of rs, else its own model.
func eachServed(rs []Route, fn func(path, model string)) {
	names := map[string]bool{}
	for _, r := range rs {
		for _, n := range r.Names() {
			names[n] = true
		}
	}
	for i, r := range rs {
		at := fmt.Sprintf("routes[%d]", i)
		switch {
		case len(r.Backends) > 0:
			for k, b := range r.Backends {
				fn(fmt.Sprintf("%s.backends[%d].model", at, k), b.Model)
			}
		case len(r.Cascade) > 0:
			for k, s := range r.Cascade {
				if !names[s.Model] {
					fn(fmt.Sprintf("%s.cascade[%d].model", at, k), s.Model)
				}
			}
		default:
			fn(at+".model", r.Model)
		}
	}
}

// Unserved warns, for table rs, about every model a request would be sent
// to that no worker serves now (a backend, a route's own model, a cascade
// step that is no route of the table), by how the gateway knows it
// (serving). Requests for them are answered 503 no_capacity, not routed.
func Unserved(rs []Route, serving func(model string) Serving) []Warning {
	var out []Warning
	eachServed(rs, func(path, model string) {
		switch serving(model) {
		case ServedNow:
		case Known:
			out = append(out, Warning{Path: path, Message: fmt.Sprintf("no worker serves %q now (the gateway knows the model: a configured engine of it is down, or its workers left)", model)})
		default:
			out = append(out, Warning{Path: path, Message: fmt.Sprintf("no worker serves %q, and the gateway has never seen it served: requests for it are answered 503 no_capacity (is it misspelt?)", model)})
		}
	})
	return out
}
