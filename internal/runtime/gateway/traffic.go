package gateway

import (
	"net/http"
	"strconv"
	"time"

	"github.com/tlgate/tlgate/actors/request"
	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/internal/adapter/traffic"
)

// feedTraffic chains the traffic recorder after the failover and cascade
// hooks already set on d.
func feedTraffic(d *request.Deps, tr *traffic.Recorder) {
	onFailover, onCascade := d.OnFailover, d.OnCascade
	d.OnFailover = func(ex *request.Exchange, t router.Target, reason string) {
		if onFailover != nil {
			onFailover(ex, t, reason)
		}
		tr.Failover(t.Route)
	}
	d.OnCascade = func(ex *request.Exchange, route string, step int, accepted bool) {
		if onCascade != nil {
			onCascade(ex, route, step, accepted)
		}
		tr.Cascade(route, accepted)
	}
}

// recordTraffic records a finished request under its route (requests that
// named no route under traffic.NoRoute), with a streamed request's time
// from arrival to its first byte as its TTFT.
func recordTraffic(tr *traffic.Recorder, ex *request.Exchange, o request.Outcome) {
	tr.Request(o.Log.Route, trafficCode(o), time.Since(ex.Received), streamedTTFB(o))
}

// trafficCode is the error code a finished request counts under, empty
// for a success: the answer's code, client_gone for a client that left,
// upstream_failed for a stream cut after its first byte, else http_<status>
// for an error status.
func trafficCode(o request.Outcome) string {
	switch {
	case o.Log.ClientGone || o.Status == 499:
		return "client_gone"
	case o.Code != "":
		return o.Code
	case o.Streamed && o.Log.Committed && o.Status == http.StatusOK && !o.Log.Done:
		return "upstream_failed"
	case o.Status >= 400:
		return "http_" + strconv.Itoa(o.Status)
	}
	return ""
}
