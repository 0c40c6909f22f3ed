// Package kvv1 is the generated Go code of tl.kv.v1, the KV transfer
// between a prefill and a decode worker (Push) and the release of a pushed
// handle that will not be used (Release).
package kvv1
