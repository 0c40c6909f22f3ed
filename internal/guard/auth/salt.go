package auth

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
)

// saltPrefix starts every salt CacheSalt derives, naming its derivation.
const saltPrefix = "tl1-"

// saltLabel separates the salts from any other use of a key's digest.
const saltLabel = "tlgate cache_salt\x00"

// CacheSalt returns the cache_salt a request of k sends to the engines and
// keys the gateway's prefix index with, for the client's cache_salt
// (empty: it sent none), so that no other key can reach the prefix-cache
// entries of k's salted requests by sending the same salt.
//
// The salt is "tl1-" and the HMAC-SHA256 of the client's salt under the
// SHA-256 of k's secret, in unpadded base64url (47 bytes in all). It is the
// same on every replica that has the key (the digest is in their common
// configuration), so an engine's cache and fleet sync's prefix records
// serve a key's requests whichever replica routes them; nobody without the
// key's secret or digest can compute it, and it reveals neither. A new
// secret for a key starts its salted entries afresh.
//
// The client's salt is returned as it is when k is the AnonymousKey
// (authentication off: there are no tenants), and "" when the client sent
// none and k does not isolate its cache: such requests share the prefix
// cache with every key's unsalted ones.
func (k Key) CacheSalt(client string) string {
	if k.Anonymous || client == "" && !k.IsolateCache {
		return client
	}
	m := hmac.New(sha256.New, k.digest[:])
	m.Write([]byte(saltLabel))
	m.Write([]byte(client))
	return saltPrefix + base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}
