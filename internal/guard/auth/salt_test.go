package auth

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strings"
	"testing"
)

// keyOf authenticates secret against a keyring built from specs, as a
// replica configured with them does.
func keyOf(t *testing.T, specs []KeySpec, secret string) Key {
	t.Helper()
	kr, err := New(specs)
	if err != nil {
		t.Fatal(err)
	}
	r, _ := http.NewRequest(http.MethodPost, "/", nil)
	r.Header.Set("Authorization", "Bearer "+secret)
	k, err := kr.Authenticate(r)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// TestKeyCacheSalt: a key's salt for a client's salt is the same on every
// replica configured with the key (by secret or by its digest), differs
// between keys and between client salts, does not contain the client's,
// and is a valid cache_salt; unsalted requests stay unsalted unless the
// key isolates its cache; without keys the client's salt is kept.
func TestKeyCacheSalt(t *testing.T) {
	sum := sha256.Sum256([]byte("secret-a"))
	specs := []KeySpec{
		{Name: "a", Secret: "secret-a", Scopes: []string{"inference"}},
		{Name: "b", Secret: "secret-b", Scopes: []string{"inference"}},
		{Name: "iso", Secret: "secret-iso", Scopes: []string{"inference"}, IsolateCache: true},
	}
	a := keyOf(t, specs, "secret-a")
	replica := keyOf(t, []KeySpec{{Name: "a", SHA256: hex.EncodeToString(sum[:]), Scopes: []string{"inference"}}}, "secret-a")
	b := keyOf(t, specs, "secret-b")
	iso := keyOf(t, specs, "secret-iso")

	sa := a.CacheSalt("team")
	if sa != replica.CacheSalt("team") {
		t.Fatalf("two replicas with key a derive %q and %q", sa, replica.CacheSalt("team"))
	}
	if len(sa) != 47 || !strings.HasPrefix(sa, "tl1-") || strings.Contains(sa, "team") {
		t.Fatalf("a's salt %q", sa)
	}
	for what, other := range map[string]string{"key b, same salt": b.CacheSalt("team"), "key a, another salt": a.CacheSalt("team2"),
		"isolated key, same salt": iso.CacheSalt("team"), "isolated key, unsalted": iso.CacheSalt("")} {
		if other == sa || other == "" {
			t.Errorf("%s: %q (a's %q)", what, other, sa)
		}
	}
	if s := a.CacheSalt(""); s != "" {
		t.Errorf("a shared key salts an unsalted request: %q", s)
	}
	if s := AnonymousKey().CacheSalt("team"); s != "team" {
		t.Errorf("without keys the salt is %q, want the client's", s)
	}
	if s := AnonymousKey().CacheSalt(""); s != "" {
		t.Errorf("without keys an unsalted request gets %q", s)
	}
}
