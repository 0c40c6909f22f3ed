package openai

// Model is one entry of GET /v1/models, and the body of GET /v1/models/{id}.
type Model struct {
	ID      string `json:"id"`
	Object  string `json:"object"` // always "model"
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
	// Parent is a LoRA adapter's base model (as vLLM lists adapters);
	// empty for a model that is not an adapter.
	Parent string `json:"parent,omitempty"`
}

// ModelList is the body of GET /v1/models.
type ModelList struct {
	Object string  `json:"object"` // always "list"
	Data   []Model `json:"data"`
}

// NewModel returns a Model with Object set.
func NewModel(id string, created int64, ownedBy string) Model {
	return Model{ID: id, Object: "model", Created: created, OwnedBy: ownedBy}
}

// NewModelList returns a ModelList with Object set; Data is never nil, so it
// encodes as [] when empty.
func NewModelList(models []Model) ModelList {
	if models == nil {
		models = []Model{}
	}
	return ModelList{Object: "list", Data: models}
}
