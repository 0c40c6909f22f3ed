package auth

import "strings"

// BearerToken returns the token of an Authorization value "Bearer <token>".
// The scheme is matched case-insensitively (RFC 6750 and RFC 9110: "bearer"
// and "BEARER" are the same scheme); the token must be non-empty and hold
// no blank. The HTTP edge and the gRPC registry both use it, so a credential
// accepted by one is accepted by the other.
func BearerToken(h string) (string, bool) {
	scheme, token, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" || strings.ContainsAny(token, " \t") {
		return "", false
	}
	return token, true
}
