package main

import (
	"reflect"
	"sort"
	"strings"

	"github.com/rs/zerolog"

	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/runtime/gateway"
)

// reloadable are the keys a reload applies; every other changed key takes
// effect only at a restart.
var reloadable = map[string]bool{
	"gateway.api_keys":           true,
	"gateway.registry_token":     true,
	"gateway.registry_token_env": true,
	"gateway.engine_tokens":      true,
	"gateway.engines":            true,
}

// reloader re-reads the configuration on SIGHUP and applies what can
// change at run time: the API keys with their limits, the registry and
// engine tokens, and the list of probed engines. A bad file changes
// nothing; keys that cannot be applied (none left while keys are
// configured) leave the keys, and the engines, as they were. Every other
// key that changed is named in a warning: it was not applied and needs a
// restart.
type reloader struct {
	path     string
	running  *config.Config // as the gateway runs it (flags applied)
	gw       *gateway.Gateway
	logger   zerolog.Logger
	override func(*config.Config) error // the command line's overrides
}

func (r *reloader) reload() {
	if r.path == "" {
		r.logger.Warn().Msg("SIGHUP ignored: no -config file to reload")
		return
	}
	cfg, err := config.Load(r.path)
	if err == nil {
		err = r.override(cfg)
	}
	if err != nil {
		r.logger.Error().Err(err).Msg("reload refused; nothing changed")
		return
	}
	if err := r.gw.ApplyCredentials(&cfg.Gateway); err != nil {
		r.logger.Error().Err(err).Msg("reload refused; nothing changed")
		return
	}
	r.gw.ApplyEngines(cfg.Gateway.Engines)
	for _, k := range reloadableKeys() {
		r.setKey(k, cfg)
	}
	r.logger.Info().Int("api_keys", len(cfg.Gateway.APIKeys)).Int("engine_tokens", len(cfg.Gateway.EngineTokens)).
		Int("engines", len(cfg.Gateway.Engines)).Msg("reloaded the API keys, the registry tokens and the probed engines")
	if keys := restartKeys(r.running, cfg); len(keys) > 0 {
		r.logger.Warn().Str("config", r.path).Strs("keys", keys).
			Msg("reload: these changed keys take effect only at a restart and were not applied")
	}
}

// setKey copies reloadable key k from cfg into the running configuration,
// so the next reload compares against what is applied.
func (r *reloader) setKey(k string, cfg *config.Config) {
	name := strings.TrimPrefix(k, "gateway.")
	dst, src := reflect.ValueOf(&r.running.Gateway).Elem(), reflect.ValueOf(&cfg.Gateway).Elem()
	for i := range dst.NumField() {
		if tomlName(dst.Type().Field(i)) == name {
			dst.Field(i).Set(src.Field(i))
		}
	}
}

func reloadableKeys() []string {
	out := make([]string, 0, len(reloadable))
	for k := range reloadable {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// restartKeys lists, sorted, the keys whose values differ between the
// running configuration and a reloaded one and that a reload does not
// apply. Tables are compared key by key (gateway.store.endpoints); lists
// of tables (gateway.routes) as a whole.
func restartKeys(running, next *config.Config) []string {
	var out []string
	diff("gateway", reflect.ValueOf(running.Gateway), reflect.ValueOf(next.Gateway), &out)
	sort.Strings(out)
	return out
}

func diff(prefix string, a, b reflect.Value, out *[]string) {
	t := a.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		name := tomlName(f)
		if name == "" || !f.IsExported() {
			continue
		}
		key := prefix + "." + name
		if reloadable[key] {
			continue
		}
		fa, fb := a.Field(i), b.Field(i)
		if fa.Kind() == reflect.Struct && isTable(fa.Type()) {
			diff(key, fa, fb, out)
			continue
		}
		if !reflect.DeepEqual(fa.Interface(), fb.Interface()) {
			*out = append(*out, key)
		}
	}
}

// isTable reports whether a struct type is a TOML table of its own (its
// fields carry toml tags), not a value such as config.Duration.
func isTable(t reflect.Type) bool {
	for i := range t.NumField() {
		if tomlName(t.Field(i)) != "" {
			return true
		}
	}
	return false
}

func tomlName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
	if name == "-" {
		return ""
	}
	return name
}
