// Package enginev1 is the generated Go code of tl.engine.v1, the calls from
// the gateway to an engine: EngineControl/Prefill on a prefill worker, which
// pushes the prompt's KV to a decode worker and returns its handle.
package enginev1
