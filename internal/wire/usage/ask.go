package usage

import (
	"fmt"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"
)

// Asked reports whether a streamed request body asks for the usage chunk
// itself ("stream_options": {"include_usage": true}).
func Asked(body []byte) bool {
	return gjson.GetBytes(body, "stream_options.include_usage").Type == gjson.True
}

// AskInStream returns a streamed request body that asks the engine for the
// usage chunk: "stream_options.include_usage" set to true, any other
// stream_options field kept. body is not modified.
func AskInStream(body []byte) ([]byte, error) {
	if Asked(body) {
		return body, nil
	}
	b, err := sjson.SetBytesOptions(body, "stream_options.include_usage", true, &sjson.Options{})
	if err != nil {
		return nil, fmt.Errorf("usage: ask for the usage chunk: %w", err)
	}
	return b, nil
}
