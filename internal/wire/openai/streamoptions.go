package openai

import "github.com/tidwall/gjson"

// streamOptions checks stream_options: null, or an object whose
// include_usage, when given, is a boolean; it reports whether that asks
// for the usage chunk. Checked here so that an engine's decoding error,
// which may name its internals, never becomes the answer.
func streamOptions(name string, v gjson.Result) (bool, *FieldError) {
	switch {
	case v.Type == gjson.Null:
		return false, nil
	case !v.IsObject():
		return false, fieldErr(name, "%s must be an object", name)
	}
	iu := v.Get("include_usage")
	if iu.Exists() && iu.Type != gjson.True && iu.Type != gjson.False && iu.Type != gjson.Null {
		return false, fieldErr(name+".include_usage", "%s.include_usage must be a boolean", name)
	}
	return iu.Type == gjson.True, nil
}
