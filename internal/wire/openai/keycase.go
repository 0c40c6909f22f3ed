package openai

import "strings"

// caseVariant returns the known top-level field that key equals only up to
// case ("STREAM" for "stream", "ſtream" with a long s), or "" when there is
// none. Engines written in Go decode JSON keys case-insensitively (with
// Unicode simple folding), so such a key would be read one way by the
// gateway, which matches keys exactly, and another way by the engine.
func caseVariant(key string) string {
	for _, name := range requestFields {
		if strings.EqualFold(key, name) {
			return name
		}
	}
	return ""
}
