package enginesim

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

func TestOpenAIClient(t *testing.T) {
	e := startEngine(t, Config{Model: "sim-small"})
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	client := openai.NewClient(option.WithBaseURL(e.URL()+"/v1/"), option.WithAPIKey("unused"),
		option.WithHTTPClient(&http.Client{Transport: tr}), option.WithMaxRetries(0))
	ctx := context.Background()

	comp, err := client.Completions.New(ctx, openai.CompletionNewParams{
		Model:     "sim-small",
		Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String("Say something")},
		MaxTokens: openai.Int(12),
		Seed:      openai.Int(7),
		Logprobs:  openai.Int(2),
	})
	if err != nil {
		t.Fatalf("completions: %v", err)
	}
	if len(comp.Choices) != 1 || comp.Choices[0].Text == "" || comp.Usage.CompletionTokens != 12 ||
		len(comp.Choices[0].Logprobs.TokenLogprobs) != 12 {
		t.Fatalf("completion %+v", comp)
	}

	params := openai.ChatCompletionNewParams{
		Model:       "sim-small",
		Messages:    []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("Be brief."), openai.UserMessage("Hello!")},
		MaxTokens:   openai.Int(10),
		Seed:        openai.Int(7),
		Logprobs:    openai.Bool(true),
		TopLogprobs: openai.Int(2),
	}
	chat, err := client.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatalf("chat: %v", err)
	}
	msg := chat.Choices[0].Message.Content
	if msg == "" || chat.Choices[0].FinishReason != "length" || len(chat.Choices[0].Logprobs.Content) != 10 ||
		len(chat.Choices[0].Logprobs.Content[0].TopLogprobs) != 2 {
		t.Fatalf("chat %+v", chat)
	}

	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	stream := client.Chat.Completions.NewStreaming(ctx, params)
	var acc openai.ChatCompletionAccumulator
	for stream.Next() {
		acc.AddChunk(stream.Current())
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("chat stream: %v", err)
	}
	stream.Close()
	if got := acc.Choices[0].Message.Content; got != msg || acc.Usage.CompletionTokens != 10 {
		t.Fatalf("streamed %q (usage %+v), want %q", got, acc.Usage, msg)
	}

	_, err = client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model: "gpt-4o", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}})
	apiErr, ok := errors.AsType[*openai.Error](err)
	if !ok || apiErr.StatusCode != http.StatusNotFound || apiErr.Code != "model_not_found" || !strings.Contains(apiErr.Message, "gpt-4o") {
		t.Fatalf("unknown model: %v", err)
	}

	models, err := client.Models.List(ctx)
	if err != nil || len(models.Data) != 1 || models.Data[0].ID != "sim-small" {
		t.Fatalf("models: %+v, %v", models, err)
	}
}
