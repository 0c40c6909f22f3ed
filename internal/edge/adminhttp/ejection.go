package adminhttp

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/internal/routing/echo"
	"github.com/tlgate/tlgate/internal/routing/fleet"
	"github.com/tlgate/tlgate/internal/wire/openai"
)

// LiftBody is the body of a 200 POST /admin/v1/workers/{id}:lift-ejection:
// the worker, whether it was ejected on this replica, and whether the
// other replicas were told to lift it too (fleet sync on).
type LiftBody struct {
	Worker string `json:"worker"`
	Lifted bool   `json:"lifted"`
	Fleet  bool   `json:"fleet"`
}

// liftAction is the action of POST /admin/v1/workers/{id}:lift-ejection.
const liftAction = ":lift-ejection"

// liftEjection serves POST /admin/v1/workers/{id}:lift-ejection: the
// worker's ejection ends on this replica and, through fleet sync, on the
// others; its passive-health record starts afresh.
func (h *handler) liftEjection(w http.ResponseWriter, r *http.Request) {
	id, ok := strings.CutSuffix(r.PathValue("target"), liftAction)
	if !ok {
		openai.WriteError(w, http.StatusNotFound, CodeNotFound,
			fmt.Sprintf("No admin endpoint POST %s: use /admin/v1/workers/{id}%s.", r.URL.Path, liftAction), nil)
		return
	}
	if !fleet.ValidWorkerID(id) {
		openai.WriteError(w, http.StatusNotFound, CodeNotFound,
			fmt.Sprintf("Worker %s: not a worker id ([A-Za-z0-9._:-]{1,128}).", echo.Quote(id)), nil)
		return
	}
	res, ok := h.ask(w, h.d.Router, &router.LiftEjection{Worker: id})
	if !ok {
		return
	}
	lr, ok := res.(*router.LiftResult)
	if !ok {
		internal(w, res)
		return
	}
	if !lr.Known {
		openai.WriteError(w, http.StatusNotFound, CodeNotFound, fmt.Sprintf("Worker %q is not known to this replica.", id), nil)
		return
	}
	writeJSON(w, http.StatusOK, LiftBody{Worker: id, Lifted: lr.Lifted, Fleet: lr.Told})
}
