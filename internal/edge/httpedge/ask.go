package httpedge

import (
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/internal/guard/auth"
	"github.com/tlgate/tlgate/internal/routing/echo"
	"github.com/tlgate/tlgate/internal/routing/routes"
)

// Headers a request sets its place in the admission queue with.
const (
	// HeaderPriority is the request's priority (an integer; higher is
	// served first, negative is sheddable), honoured up to its key's
	// max_priority.
	HeaderPriority = "X-Tlgate-Priority"
	// HeaderTTFTObjective is its time-to-first-token objective in
	// milliseconds.
	HeaderTTFTObjective = "X-Slo-Ttft-Ms"
	// HeaderFairnessID names the key's end user the request takes turns
	// as, inside the key's share of the queue.
	HeaderFairnessID = "X-Tlgate-Fairness-Id"
	// MaxFairnessIDLen bounds HeaderFairnessID.
	MaxFairnessIDLen = 128
)

// askOf reads r's admission headers and key's settings into the router's
// Ask; for a malformed header it returns the client's error message,
// naming it.
func askOf(r *http.Request, key auth.Key) (router.Ask, string) {
	a := router.Ask{Key: router.KeyClass{
		Priority: key.Admission.Priority, MaxPriority: key.Admission.MaxPriority,
		Objective: key.Admission.Objective, ServeLate: key.Admission.ServeLate, Trusted: key.Anonymous,
	}}
	if v, ok, msg := oneHeader(r, HeaderPriority); msg != "" {
		return a, msg
	} else if ok {
		p, err := strconv.Atoi(v)
		if err != nil || p < -routes.MaxPriority || p > routes.MaxPriority {
			return a, fmt.Sprintf("The %s header must be an integer from %d to %d, got %s.", HeaderPriority, -routes.MaxPriority, routes.MaxPriority, echo.Quote(v))
		}
		a.Priority = &p
	}
	if v, ok, msg := oneHeader(r, HeaderTTFTObjective); msg != "" {
		return a, msg
	} else if ok {
		ms, err := strconv.Atoi(v)
		if err != nil || ms < 1 || ms > routes.MaxTTFTObjectiveMs {
			return a, fmt.Sprintf("The %s header must be a whole number of milliseconds from 1 to %d, got %s.", HeaderTTFTObjective, routes.MaxTTFTObjectiveMs, echo.Quote(v))
		}
		a.Objective = time.Duration(ms) * time.Millisecond
	}
	if v, ok, msg := oneHeader(r, HeaderFairnessID); msg != "" {
		return a, msg
	} else if ok {
		if !validFairnessID(v) {
			return a, fmt.Sprintf("The %s header must be 1 to %d printable ASCII characters without spaces, got %s.", HeaderFairnessID, MaxFairnessIDLen, echo.Quote(v))
		}
		a.FairnessID = v
	}
	return a, ""
}

// oneHeader returns header name's value, whether it was sent, and the
// client's error message when it was sent more than once.
func oneHeader(r *http.Request, name string) (string, bool, string) {
	vs := r.Header.Values(name)
	switch len(vs) {
	case 0:
		return "", false, ""
	case 1:
		return vs[0], true, ""
	}
	return "", false, fmt.Sprintf("The %s header was sent %d times; send it once.", name, len(vs))
}

func validFairnessID(s string) bool {
	if s == "" || len(s) > MaxFairnessIDLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}
