package request

import (
	"net/http"

	"github.com/tlgate/tlgate/internal/wire/proxy"
	"github.com/tlgate/tlgate/internal/wire/usage"
)

// streamWriter returns the writer a streamed attempt relays to: the
// client's, wrapped to read the usage chunk the attempt's body asks for
// (body sets stream_options.include_usage) and to keep that chunk from a
// client that did not ask for it.
func (a *requestActor) streamWriter() http.ResponseWriter {
	a.sniff = usage.NewWriter(a.ex.W, !usage.Asked(a.ex.Body))
	return a.sniff
}

// countStreamed adds the usage of a streamed attempt that reached the
// client with a 2xx answer: the engine's usage chunk, else the estimate.
func (a *requestActor) countStreamed(r proxy.Result) {
	if a.sniff == nil || !r.Committed || r.Status/100 != 2 {
		return
	}
	a.log.Usage.Add(a.sniff.Usage(a.ex.Req.Prompt))
	a.sniff = nil
}

// countFetched adds the usage of a non-streamed 200 answer (every cascade
// step that answered, accepted or not): its usage object, else the
// estimate.
func (a *requestActor) countFetched(resp *proxy.Response) {
	if resp.Status != http.StatusOK {
		return
	}
	a.log.Usage.Add(usage.Estimate(resp.Body, a.ex.Req.Prompt))
}
