package config

import (
	"reflect"
	"strings"

	"github.com/BurntSushi/toml"
)

// suggestion returns the known key an unknown key k most likely meant: a
// key of the same table within a few typos of it, or that it begins
// ("" when none is close). The tables are read from the Config type's toml tags.
func suggestion(k toml.Key) string {
	if len(k) == 0 {
		return ""
	}
	t := tableType(reflect.TypeOf(Config{}), k[:len(k)-1])
	if t == nil {
		return ""
	}
	name := k[len(k)-1]
	best, bestD := "", max(2, len(name)/4)+1
	for _, cand := range tomlKeys(t) {
		d := editDistance(name, cand)
		if len(name) >= 4 && strings.HasPrefix(cand, name) {
			d = min(d, 1) // a key cut short: http_addr for http_address
		}
		if d < bestD && d < len(name) {
			best, bestD = cand, d
		}
	}
	if best == "" {
		return ""
	}
	return strings.Join(append(k[:len(k)-1:len(k)-1], best), ".")
}

// tableType is the struct type the table at path decodes into, or nil
// (an unknown table, a map).
func tableType(t reflect.Type, path []string) reflect.Type {
	for _, part := range path {
		t = elem(t)
		if t.Kind() != reflect.Struct {
			return nil
		}
		f, ok := fieldOf(t, part)
		if !ok {
			return nil
		}
		t = f.Type
	}
	if t = elem(t); t.Kind() != reflect.Struct {
		return nil
	}
	return t
}

// elem is t with pointers and slices taken off.
func elem(t reflect.Type) reflect.Type {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Array {
		t = t.Elem()
	}
	return t
}

// fieldOf is the field of struct t (or of a struct it embeds) whose toml
// key is key.
func fieldOf(t reflect.Type, key string) (reflect.StructField, bool) {
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Anonymous && f.Tag.Get("toml") == "" {
			if g, ok := fieldOf(elem(f.Type), key); ok {
				return g, true
			}
			continue
		}
		if tomlName(f) == key {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

// tomlKeys are the keys of the table struct t decodes.
func tomlKeys(t reflect.Type) []string {
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		switch {
		case f.Anonymous && f.Tag.Get("toml") == "" && elem(f.Type).Kind() == reflect.Struct:
			out = append(out, tomlKeys(elem(f.Type))...)
		case f.IsExported():
			if n := tomlName(f); n != "" && n != "-" {
				out = append(out, n)
			}
		}
	}
	return out
}

// tomlName is the key of field f, as the toml package decodes it.
func tomlName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
	if name == "" {
		return f.Name
	}
	return name
}

// editDistance is the Damerau-Levenshtein distance of a and b (optimal
// string alignment): insertions, deletions, substitutions and swaps of
// two neighbours, the typos of a key typed by hand.
func editDistance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	prev2 := make([]int, len(rb)+1)
	prev := make([]int, len(rb)+1)
	cur := make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(rb)]
}
