package tokenizer

import "strings"

// Message is one chat message: its role and its text content.
type Message struct {
	Role    string
	Content string
}

// RenderChat is the engine's fixed chat template with the generation
// prompt: every message as "role\ncontent\n" in order, then "assistant\n"
// for the answer. Chat completions and POST /tokenize with messages both
// use it, so the rendered prompt starts exactly like the gateway's prefix
// key.
func RenderChat(msgs []Message) string {
	return RenderChatWith(msgs, ChatOptions{AddGenerationPrompt: true})
}

// ChatOptions are the chat template's switches, vLLM's request fields of
// the same names.
type ChatOptions struct {
	// AddGenerationPrompt ends the prompt with "assistant\n", the start
	// of the answer.
	AddGenerationPrompt bool
	// ContinueFinalMessage leaves the last message open (no newline after
	// its content), for the model to continue it; it excludes
	// AddGenerationPrompt.
	ContinueFinalMessage bool
}

// RenderChatWith renders msgs with the template and opts.
func RenderChatWith(msgs []Message, opts ChatOptions) string {
	n := len("assistant\n")
	for _, m := range msgs {
		n += len(m.Role) + len(m.Content) + 2
	}
	var b strings.Builder
	b.Grow(n)
	for i, m := range msgs {
		b.WriteString(m.Role)
		b.WriteByte('\n')
		b.WriteString(m.Content)
		if !opts.ContinueFinalMessage || i < len(msgs)-1 {
			b.WriteByte('\n')
		}
	}
	if opts.AddGenerationPrompt && !opts.ContinueFinalMessage {
		b.WriteString("assistant\n")
	}
	return b.String()
}
