package config

import (
	"encoding/json"
	"fmt"
	"time"
)

// Duration is a time.Duration written as a Go duration string ("2s",
// "150ms", "1m30s") in TOML and JSON.
type Duration struct{ time.Duration }

// D returns a Duration of d.
func D(d time.Duration) Duration { return Duration{d} }

// UnmarshalText parses a Go duration string.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("want a duration such as \"2s\" or \"150ms\": %w", err)
	}
	d.Duration = v
	return nil
}

// MarshalText renders the duration as a Go duration string.
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// UnmarshalJSON accepts a JSON string holding a Go duration.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("want a duration string such as \"2s\": %w", err)
	}
	return d.UnmarshalText([]byte(s))
}

// MarshalJSON renders the duration as a JSON string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }
