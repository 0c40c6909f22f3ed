package enginesim

import (
	"errors"
	"testing"

	"github.com/tlgate/tlgate/enginesim/tokenizer"
)

// FuzzParseRequest holds the engine's request parsing to never panic and
// to refuse bad input only with errBadRequest (a 400 naming the problem);
// an accepted request is well formed.
func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","prompt":"hi","max_tokens":3,"seed":1}`,
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"add_generation_prompt":false,"continue_final_message":true}`,
		`{"model":"m","prompt":[1,2,3],"kv_transfer_params":{"do_remote_prefill":true,"remote_block_ids":[[1,2]],"remote_host":"h","remote_port":1,"remote_request_id":"x"}}`,
		`{"model":"m","prompt":"x","bootstrap_host":"h","bootstrap_port":8998,"bootstrap_room":18446744073709551615}`,
		`{"model":"m","prompt":"x","stop":["a",""],"logprobs":5,"stream":true,"stream_options":{"include_usage":true}}`,
		`{"model":"m","prompt":"x","bootstrap_room":-1}`,
		`[]`, `{`, ``,
	} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	tok := tokenizer.Default()
	f.Fuzz(func(t *testing.T, body []byte, chat bool) {
		_, g, err := parseRequest(tok, body, chat)
		if err != nil {
			if !errors.Is(err, errBadRequest) {
				t.Fatalf("error %v does not wrap errBadRequest", err)
			}
			return
		}
		if len(g.prompt) == 0 && !chat || g.maxTokens < 1 || g.topLogprobs < 0 || g.topLogprobs > maxTopLogprobs {
			t.Fatalf("accepted a malformed request: %+v", g)
		}
		for _, id := range g.prompt {
			if int(id) >= tok.VocabSize() {
				t.Fatalf("accepted token %d outside the vocabulary", id)
			}
		}
		if g.kvParams != nil {
			if _, err := g.kvParams.blockIDs(); err != nil && !errors.Is(err, errBadRequest) {
				t.Fatalf("block ids error %v", err)
			}
		}
	})
}
