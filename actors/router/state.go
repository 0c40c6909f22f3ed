package router

import (
	"errors"
	"time"

	"github.com/tlgate/tlgate/internal/routing/cascade"
	"github.com/tlgate/tlgate/internal/routing/fleet"
	"github.com/tlgate/tlgate/internal/routing/kvindex"
	"github.com/tlgate/tlgate/internal/routing/policy"
	"github.com/tlgate/tlgate/internal/routing/prefixindex"
	"github.com/tlgate/tlgate/internal/routing/routes"
)

// Errors a Route answer can carry.
var (
	// ErrModelNotFound: no route and no worker knows the model.
	ErrModelNotFound = errors.New("model not found")
	// ErrNoCapacity: the model is known but no routable worker is left.
	ErrNoCapacity = errors.New("no routable worker")
)

// Config holds the routing settings.
type Config struct {
	Policy     policy.Name
	LoadFactor float64 // affinity_load_factor c
	// CacheAware weighs the cache_aware policy (zero: the defaults) and
	// PrefixIndex sets its index's chunking.
	CacheAware  policy.CacheAwareConfig
	PrefixIndex prefixindex.Config
	// KVIndex bounds the exact view of the workers that publish KV cache
	// events (exact.go), and Tokenizers maps a base model to the base URL
	// of a tokenizer of it ("": ask one of its workers).
	KVIndex    kvindex.Config
	Tokenizers map[string]string
	// NoExact keeps no exact views: the gateway follows no engine's KV
	// events, and cache_aware routes on the prefix index alone.
	NoExact bool
	// IndexAgreement is the share of a model's latest exact picks the
	// prefix index must have agreed with for its requests to be routed on
	// the index without being tokenized, all but one in AgreementSample
	// (zero: DefaultAgreementSample); 0: every request is tokenized
	// (agreement.go).
	IndexAgreement  float64
	AgreementSample int
	// Ejection and Admission are passive health and admission control
	// (ejection.go, admission.go); Observe receives their events.
	Ejection  EjectionConfig
	Admission AdmissionConfig
	Observe   Observer
	// Sync is fleet sync with the other replicas (sync.go).
	Sync SyncConfig
	// NoCapacityRetryAfter is the Retry-After of a no_capacity answer
	// (zero: 1 s): about when a worker that registers or comes back would
	// be routable.
	NoCapacityRetryAfter time.Duration
	// RecentModels is how long a model stays known after its last worker
	// left (zero: DefaultRecentModels; negative: not at all), so that its
	// clients get no_capacity through an outage rather than
	// model_not_found.
	RecentModels time.Duration
}

// Request is what routing needs to know of a client request.
type Request struct {
	Model     string
	RequestID string
	PrefixKey []byte
	Stream    bool
	// Step is the cascade step to route (0 for the first or a non-cascade
	// route). A streamed request on a cascade route always goes to the last
	// step, whatever Step says, and so does one whose answer no step's
	// accept_if can judge (Unjudged).
	Step int
	// Unjudged: the answer is not one a cascade step's accept_if can
	// judge (several choices, an echoed prompt).
	Unjudged bool
	// Exclude lists worker ids that already failed this request.
	Exclude map[string]bool
	// Prompt is the whole rendered prompt (openai.Request.Prompt), which
	// the cache_aware policy looks up in its prefix index.
	Prompt string
	// Hashes, when set, keeps Prompt's chunk hashes across the request's
	// Routes (failover retries, cascade steps) and its dispatch scans in
	// the queue, so that the prefix index hashes the prompt once. The
	// router alone reads and fills it; nil: hashed on every lookup.
	Hashes *prefixindex.PromptHashes
	// Key is the API key's name: the queue's fair shares are per key.
	Key string
	// Ask is what the request and its key say of its priority, TTFT
	// objective and fairness id (priority.go).
	Ask Ask
	// LeastLoaded: the request keeps no KV cache worth routing for
	// (embeddings, rerank, score, tokenize): it goes to the least loaded
	// worker whatever the policy, to the last step of a cascade and to a
	// unified worker of a disaggregated route, and is not recorded in the
	// prefix index.
	LeastLoaded bool
	// AnyRole: any worker of the served model will do, whatever its role
	// (tokenize, detokenize); the least loaded is taken.
	AnyRole bool
	// Pin, when set, is the only worker that may serve the request (it
	// holds state the request refers to): ErrPinnedGone when it is gone,
	// never another worker.
	Pin string
	// CacheSalt is the request's cache_salt, as sent to the engine: the
	// prefix index matches it only against prompts sent with the same
	// salt, and the exact view only against blocks computed with it.
	CacheSalt string
	// Tokens are the prompt's token ids per base model, as the engines of
	// that model tokenize it (exact.go): a cache_aware pick among workers
	// with an exact view asks for them (NeedTokensError) unless NoTokens
	// says they could not be had, or NoAsk that none may be asked.
	// Read-only to the router.
	Tokens   map[string][]uint32
	NoTokens map[string]bool
	NoAsk    bool
	// Partial names the models whose Tokens are a prefix of the prompt's
	// only (a conversation's earlier turn's): the prompt's length is then
	// estimated from its bytes, at least theirs.
	Partial map[string]bool
	// Keys, when set, keeps the tokens' block keys across Routes (like
	// Hashes).
	Keys *TokenKeys
	// KeepPrefill, on a disaggregated route, is the prefill worker that
	// holds the prompt's KV for the request already (its decode failed
	// before the first byte): the pair keeps it while it is routable.
	KeepPrefill string
}

// Target is the router's answer: where an attempt goes.
type Target struct {
	Worker      fleet.Worker
	Prefill     *fleet.Worker // disaggregated routes: the prefill worker
	Route       string        // the public route model the request named
	ServedModel string        // the id the engine answers to
	Reason      string        // policy reason: least_outstanding, weighted, affinity, load
	// PrefillReason and DecodeReason say why a disaggregated pair's
	// workers were picked (pair.go); Reason is PrefillReason then.
	PrefillReason, DecodeReason string
	// Queue and Priority are the admission queue (model) the request went
	// through and its priority there, for the TTFT it reports back
	// (AttemptSucceeded).
	Queue    string
	Priority int
	// CascadeStep and CascadeSteps locate the answered step of a cascade
	// route (0 and 1 for any other route); AcceptIf is the step's rule (empty
	// on the last step).
	CascadeStep  int
	CascadeSteps int
	AcceptIf     string
	Rule         cascade.Accept // AcceptIf parsed (zero on the last step)
	// Cascade is the cascade route's steps (the table's: read only; nil
	// for any other route) and OnEscalationFailure its
	// on_escalation_failure.
	Cascade             []routes.Step
	OnEscalationFailure string
	Epoch               uint64
	// Indexing is what a cache_aware pick records in the prefix index once
	// the attempt's answer begins: the request hands it back with
	// AttemptSucceeded.
	Indexing Indexing
	// MatchedTokens is, for a cache_aware pick, the estimated prompt tokens
	// the worker holds cached (0 for other policies); PromptTokens is the
	// prompt's estimated length in tokens (cache_aware picks only). Both
	// are exact for a pick on an exact view.
	MatchedTokens, PromptTokens int
	// CacheView is how a cache_aware pick saw the worker's cache: "exact"
	// (its KV events), "approximate" (the prefix index) or ViewAgreed (the
	// prefix index, untokenized, while it agrees with the events); "" for
	// other policies.
	CacheView string
	// Policy is the route policy that picked Worker, Candidates how many
	// workers it chose among (for traces).
	Policy     string
	Candidates int
	// Skipped are the cascade steps before CascadeStep that had no
	// routable worker, in order.
	Skipped []Skip
}

// Disaggregated reports whether the target is a prefill/decode pair.
func (t Target) Disaggregated() bool { return t.Prefill != nil }

// State is the router's state. It is kept outside the actor instance so
// that a restarted router keeps its route table, epoch and in-flight counts;
// its view of the workers is rebuilt from the registry on every start.
type State struct {
	cfg      Config
	table    *routes.Table
	epoch    uint64
	workers  map[string]*fleet.Worker
	inflight map[string]*workerLoad // per worker id; outlives the worker until released
	pools    map[poolKey]*pool
	cands    []policy.Candidate // scratch, reused per pick
	members  []*fleet.Worker    // scratch, parallel to cands
	loads    []*workerLoad      // scratch, parallel to cands
	prefix   *cacheState        // the cache_aware policy's index; nil for others
	exact    *kvindex.Index     // the exact views (cache_aware only)
	needTok  *NeedTokensError   // set by a pick that needs the prompt's tokens
	asks     uint64             // tokenize asks made (needTokens), to take turns among equals
	// agreements are the prefix index's agreement with the exact picks,
	// per base model (agreement.go).
	agreements map[string]*agreement

	// dcands is the scratch of a disaggregated pair's decode pick.
	dcands []policy.DecodeCandidate

	// Passive health and admission control (ejection.go, admission.go);
	// votes are the peers' ejections waiting for evidence (sync.go), by
	// worker and replica, belied those an answer belied, until the end
	// they claimed.
	health  map[string]*health
	votes   map[string]map[string]time.Time
	belied  map[string]map[string]time.Time
	learned map[string]learned
	queues  map[string]*modelQueue
	waiters map[uint64]*Waiter
	byFrom  map[string]uint64
	seq     uint64
	// full: the last pick found a pool full (its workers at their limits,
	// or all saturated by their engines' reports: saturated, with why).
	full, saturated bool
	why             string
	// Priorities and objectives (priority.go): how fast each queue drains,
	// the recent TTFT per queue band and per worker.
	drains     map[string]*drain
	bandTTFT   map[bandKey]*ewma
	bands      map[string]int // bands of bandTTFT per queue, anyBand's aside
	workerTTFT map[string]*ewma

	// Fleet sync (sync.go): the other replicas' claims, and when each
	// replica heard from lately was last (the known ones).
	peers        map[string]*peerState
	known        map[string]time.Time
	pendingIndex map[string]pendingEntry
	// pendingStored are peers' stored responses waiting for their workers
	// (stored.go), by worker; pendingStoredN counts them.
	pendingStored  map[string][]pendingStored
	pendingStoredN int

	// Models known beyond the table and the workers (known.go): those
	// the configuration names, those of down engines, and when each model
	// a worker left serving was last served.
	configured map[string]bool
	down       []fleet.Down
	lastServed map[string]time.Time
}

// NewState returns a router state with the given table and epoch.
func NewState(cfg Config, table *routes.Table, epoch uint64) *State {
	if table == nil {
		table, _ = routes.NewTable(nil)
	}
	return &State{
		cfg: cfg, table: table, epoch: epoch,
		workers:  map[string]*fleet.Worker{},
		inflight: map[string]*workerLoad{},
		pools:    map[poolKey]*pool{},
		prefix:   newCacheState(cfg),
		exact:    newExact(cfg),
	}
}

// SetRoutes installs a new table and epoch.
func (s *State) SetRoutes(t *routes.Table, epoch uint64) { s.table, s.epoch = t, epoch }
