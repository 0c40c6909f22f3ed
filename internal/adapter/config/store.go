package config

import (
	"fmt"
	"net/url"
	"strings"
	"time"
)

// Kinds of store (gateway.store.kind).
const (
	StoreFile = "file"
	StoreEtcd = "etcd"
)

// Defaults of [gateway.store].
const (
	DefaultStorePrefix      = "/tlgate/"
	DefaultStoreDialTimeout = 5 * time.Second
)

// Store is the [gateway.store] table: where the route table and the
// drains are kept.
type Store struct {
	// Kind is file (state_dir, one replica) or etcd (shared by replicas).
	Kind string `toml:"kind"`
	// Endpoints are the etcd members' client URLs (http:// or https://)
	// or host:port; required with kind = "etcd".
	Endpoints []string `toml:"endpoints"`
	// Prefix is put in front of every etcd key; it must end with "/".
	Prefix string `toml:"prefix"`
	// DialTimeout bounds reaching etcd: at start the gateway refuses to
	// start past it.
	DialTimeout Duration `toml:"dial_timeout"`
	// Username authenticates to etcd; PasswordEnv names the environment
	// variable holding its password (both or neither).
	Username    string `toml:"username"`
	PasswordEnv string `toml:"password_env"`
	// CAFile verifies etcd's certificate; CertFile and KeyFile are the
	// client certificate (both or neither).
	CAFile   string `toml:"ca_file"`
	CertFile string `toml:"cert_file"`
	KeyFile  string `toml:"key_file"`
}

// Password returns the etcd password from password_env (read now), or ""
// when none is configured.
func (s Store) Password() (string, error) {
	if s.PasswordEnv == "" {
		return "", nil
	}
	v, err := envValue(s.PasswordEnv)
	if err != nil {
		return "", fmt.Errorf("config: gateway.store.password_env: %w", err)
	}
	return v, nil
}

// store checks [gateway.store].
func (v *checker) store(s *Store) {
	switch s.Kind {
	case StoreFile:
		return
	case StoreEtcd:
	default:
		v.add("gateway.store.kind", "must be %q or %q, got %q", StoreFile, StoreEtcd, s.Kind)
		return
	}
	if len(s.Endpoints) == 0 {
		v.add("gateway.store.endpoints", "at least one etcd endpoint required with kind = %q", StoreEtcd)
	}
	for i, e := range s.Endpoints {
		key := fmt.Sprintf("gateway.store.endpoints[%d]", i)
		if strings.Contains(e, "://") {
			u, err := url.Parse(e)
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				v.add(key, "want http://host:port, https://host:port or host:port, got %q", e)
			}
			continue
		}
		v.hostPort(key, e, true, false)
	}
	if !strings.HasPrefix(s.Prefix, "/") || !strings.HasSuffix(s.Prefix, "/") {
		v.add("gateway.store.prefix", "must start and end with \"/\", got %q", s.Prefix)
	}
	v.positive("gateway.store.dial_timeout", s.DialTimeout)
	switch {
	case s.Username != "" && s.PasswordEnv == "":
		v.add("gateway.store.password_env", "required with username")
	case s.PasswordEnv != "" && s.Username == "":
		v.add("gateway.store.username", "required with password_env")
	case s.PasswordEnv != "":
		if _, err := envValue(s.PasswordEnv); err != nil {
			v.add("gateway.store.password_env", "%s", err)
		}
	}
	v.together("gateway.store.cert_file", s.CertFile, "gateway.store.key_file", s.KeyFile)
	v.file("gateway.store.ca_file", s.CAFile)
	v.file("gateway.store.cert_file", s.CertFile)
	v.file("gateway.store.key_file", s.KeyFile)
}
