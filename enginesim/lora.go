package enginesim

import (
	"fmt"
	"net/http"
	"regexp"
	"slices"
)

// LoRA adapters, as vLLM serves them: each loaded adapter is a model id
// of its own over the base model, listed by /v1/models with its parent,
// answered on every inference path, and loaded or unloaded at run time
// with POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's
// shapes, {"lora_name", "lora_path"} and {"lora_name"}).

var adapterPattern = regexp.MustCompile(`^[A-Za-z0-9._:/-]{1,256}$`)

// checkAdapter refuses an adapter id that is no model id or is the base's.
func (c Config) checkAdapter(name string) error {
	if !adapterPattern.MatchString(name) || name == c.Model {
		return fmt.Errorf("%w: lora adapter %q must match [A-Za-z0-9._:/-]{1,256} and differ from the model", ErrConfig, name)
	}
	return nil
}

func (e *Engine) loraRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/load_lora_adapter", e.handleLoadAdapter)
	mux.HandleFunc("POST /v1/unload_lora_adapter", e.handleUnloadAdapter)
}

// Adapters returns the loaded adapters, sorted.
func (e *Engine) Adapters() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.adapters)
}

// LoadAdapter loads adapter name (a no-op when it is loaded already).
func (e *Engine) LoadAdapter(name string) error {
	if err := e.cfg.checkAdapter(name); err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if i, found := slices.BinarySearch(e.adapters, name); !found {
		e.adapters = slices.Insert(e.adapters, i, name)
	}
	return nil
}

// UnloadAdapter unloads adapter name; it reports whether it was loaded.
func (e *Engine) UnloadAdapter(name string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	i, found := slices.BinarySearch(e.adapters, name)
	if found {
		e.adapters = slices.Delete(e.adapters, i, i+1)
	}
	return found
}

// serves reports whether the engine answers to model id m: its model or
// a loaded adapter.
func (e *Engine) serves(m string) bool {
	if m == e.cfg.Model {
		return true
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	_, found := slices.BinarySearch(e.adapters, m)
	return found
}

type loraRequest struct {
	Name string `json:"lora_name"`
	Path string `json:"lora_path"`
}

func (e *Engine) handleLoadAdapter(w http.ResponseWriter, r *http.Request) {
	var req loraRequest
	if !e.readJSON(w, r, &req) {
		return
	}
	if err := e.LoadAdapter(req.Name); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_request", err.Error())
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintf(w, "Success: LoRA adapter '%s' added successfully.", req.Name)
}

func (e *Engine) handleUnloadAdapter(w http.ResponseWriter, r *http.Request) {
	var req loraRequest
	if !e.readJSON(w, r, &req) {
		return
	}
	if !e.UnloadAdapter(req.Name) {
		writeError(w, http.StatusNotFound, "invalid_request_error", "not_found",
			fmt.Sprintf("The lora adapter '%s' cannot be found.", req.Name))
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintf(w, "Success: LoRA adapter '%s' removed successfully.", req.Name)
}

// adapterJSON is an adapter's entry of /v1/models, as vLLM lists it.
func (e *Engine) adapterJSON(name string) map[string]any {
	return map[string]any{"id": name, "object": "model", "created": e.started.Unix(),
		"owned_by": "enginesim", "root": "/adapters/" + name, "parent": e.cfg.Model, "max_model_len": nil}
}
