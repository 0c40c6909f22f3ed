// Package openai holds the OpenAI-compatible request and response shapes the
// gateway reads and rewrites: parsing and validating a client's body without
// re-encoding it, the prefix key used for affinity routing, per-attempt body
// rewrites (model, seed, forced logprobs), the OpenAI error shape and the
// models list. It does no I/O beyond writing an error to an
// http.ResponseWriter.
package openai
