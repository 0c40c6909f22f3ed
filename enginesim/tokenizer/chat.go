package tokenizer

import "strings"

// Message is one chat message: its role and its text content.
type Message struct {
	Role    string
	Content string
}

// RenderChat is the engine's fixed chat template: every message as
// "role\ncontent\n" in order, then "assistant\n" for the answer. Chat
// completions and POST /v1/tokenize with messages both use it, so the
// rendered prompt starts exactly like the gateway's prefix key.
func RenderChat(msgs []Message) string {
	n := len("assistant\n")
	for _, m := range msgs {
		n += len(m.Role) + len(m.Content) + 2
	}
	var b strings.Builder
	b.Grow(n)
	for _, m := range msgs {
		b.WriteString(m.Role)
		b.WriteByte('\n')
		b.WriteString(m.Content)
		b.WriteByte('\n')
	}
	b.WriteString("assistant\n")
	return b.String()
}
