// Package jsontest reads JSON the way the fuzz targets of the wire
// packages compare against: as encoding/json decodes it, numbers kept
// exact (json.Number).
package jsontest

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"
)

// Plain reports whether b is valid JSON in UTF-8 none of whose objects
// gives a key twice: JSON that every reader reads alike (with a key given
// twice, gjson's readers take the first, encoding/json and Python's json
// the last).
func Plain(b []byte) bool {
	return json.Valid(b) && utf8.Valid(b) && !duplicateKey(json.NewDecoder(bytes.NewReader(b)))
}

// duplicateKey reports whether the next value of d, valid JSON, has an
// object that gives a key twice.
func duplicateKey(d *json.Decoder) bool {
	tok, err := d.Token()
	if err != nil {
		return false
	}
	switch tok {
	case json.Delim('{'):
		seen := map[string]bool{}
		for d.More() {
			k, _ := d.Token()
			key, _ := k.(string)
			if seen[key] || duplicateKey(d) {
				return true
			}
			seen[key] = true
		}
		_, _ = d.Token()
	case json.Delim('['):
		for d.More() {
			if duplicateKey(d) {
				return true
			}
		}
		_, _ = d.Token()
	}
	return false
}

// Decode returns the value of the JSON b as encoding/json decodes it into
// an any, numbers as json.Number; nil when b is not JSON.
func Decode(b []byte) any {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil
	}
	return v
}
