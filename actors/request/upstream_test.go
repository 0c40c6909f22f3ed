package request

import (
	"errors"
	"strings"
	"testing"

	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/internal/wire/proxy"
)

func TestExhausted(t *testing.T) {
	fail := func(r proxy.Failure) error {
		return &proxy.AttemptError{Reason: r, Err: errors.New("engine said: Go struct field .x")}
	}
	cases := []struct {
		name   string
		last   error
		status int
		code   string
	}{
		{"last a 5xx", fail(proxy.FailStatus5xx), 502, "upstream_failed"},
		{"last a bad answer", fail(proxy.FailBadAnswer), 502, "upstream_failed"},
		{"last a truncated answer", fail(proxy.FailTruncated), 502, "upstream_failed"},
		{"last closed before answering", fail(proxy.FailEOF), 503, "no_capacity"},
		{"last refused", fail(proxy.FailRefused), 503, "no_capacity"},
		{"last a 503", fail(proxy.FailStatus503), 503, "no_capacity"},
		{"last not an attempt error", errors.New("tokenize: boom"), 503, "no_capacity"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := exhausted("smol", 2, tc.last)
			if o.Status != tc.status || o.Code != tc.code || !strings.Contains(o.Message, "2 attempt(s)") {
				t.Fatalf("exhausted = %+v, want %d %s", o, tc.status, tc.code)
			}
			if strings.Contains(o.Message, "Go struct") {
				t.Fatalf("the engine's detail reaches the client: %q", o.Message)
			}
		})
	}
}

func TestEscalatesOnFailure(t *testing.T) {
	five := &proxy.AttemptError{Reason: proxy.FailStatus5xx, Err: errors.New("500")}
	refused := &proxy.AttemptError{Reason: proxy.FailRefused, Err: errors.New("refused")}
	truncated := &proxy.AttemptError{Reason: proxy.FailTruncated, Err: errors.New("unexpected EOF")}
	cases := []struct {
		name string
		t    router.Target
		err  error
		want bool
	}{
		{"step 0 of 2, a 5xx", router.Target{CascadeStep: 0, CascadeSteps: 2}, five, true},
		{"last step, a 5xx", router.Target{CascadeStep: 1, CascadeSteps: 2}, five, false},
		{"step 0 of 2, refused: another worker of the step", router.Target{CascadeStep: 0, CascadeSteps: 2}, refused, false},
		{"no cascade", router.Target{}, five, false},
		{"step 0 of 2, truncated: another worker of the step", router.Target{CascadeStep: 0, CascadeSteps: 2}, truncated, false},
	}
	for _, tc := range cases {
		if got := escalatesOnFailure(tc.t, tc.err); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
