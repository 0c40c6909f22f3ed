package config

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
)

// Digest returns the SHA-256 of the key's secret, whichever way it is
// given: hashed from key or from the environment variable key_env (read
// now), or decoded from key_sha256. Comparing digests in constant time is
// how the auth layer checks a presented key. Errors name the key and the
// variable, never a secret.
func (k APIKey) Digest() ([sha256.Size]byte, error) {
	var d [sha256.Size]byte
	switch {
	case k.Key != "" && k.KeyEnv == "" && k.KeySHA256 == "":
		return sha256.Sum256([]byte(k.Key)), nil
	case k.KeyEnv != "" && k.Key == "" && k.KeySHA256 == "":
		v, err := envValue(k.KeyEnv)
		if err != nil {
			return d, fmt.Errorf("config: api key %q: %w", k.Name, err)
		}
		return sha256.Sum256([]byte(v)), nil
	case k.KeySHA256 != "" && k.Key == "" && k.KeyEnv == "":
		b, err := hex.DecodeString(k.KeySHA256)
		if err != nil || len(b) != sha256.Size {
			return d, fmt.Errorf("config: api key %q: key_sha256 must be %d hex digits", k.Name, 2*sha256.Size)
		}
		copy(d[:], b)
		return d, nil
	}
	return d, fmt.Errorf("config: api key %q: %w", k.Name, errOneSecret)
}

var errOneSecret = errors.New("exactly one of key, key_env, key_sha256 is required")

// RegistryTokenValue returns the token engines must present on heartbeats:
// registry_token, or the value of registry_token_env (read now), or "" when
// neither is set (heartbeats are then not authenticated).
func (g Gateway) RegistryTokenValue() (string, error) {
	switch {
	case g.RegistryToken != "" && g.RegistryTokenEnv != "":
		return "", errors.New("config: registry_token and registry_token_env are mutually exclusive")
	case g.RegistryTokenEnv != "":
		v, err := envValue(g.RegistryTokenEnv)
		if err != nil {
			return "", fmt.Errorf("config: registry_token_env: %w", err)
		}
		return v, nil
	}
	return g.RegistryToken, nil
}

// Authorization returns the Authorization header value to send to the
// engine: auth_header, or the value of auth_header_env (read now), or ""
// when neither is set.
func (e Engine) Authorization() (string, error) {
	switch {
	case e.AuthHeader != "" && e.AuthHeaderEnv != "":
		return "", fmt.Errorf("config: engine %q: auth_header and auth_header_env are mutually exclusive", e.ID)
	case e.AuthHeaderEnv != "":
		v, err := envValue(e.AuthHeaderEnv)
		if err != nil {
			return "", fmt.Errorf("config: engine %q: auth_header_env: %w", e.ID, err)
		}
		return v, nil
	}
	return e.AuthHeader, nil
}
