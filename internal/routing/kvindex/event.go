package kvindex

import "strings"

// Medium is the cache tier a block is held in. Engines name it in their
// events (vLLM's and SGLang's medium: "GPU", "CPU", a connector's disk or
// remote store); a block held in several tiers counts as its best.
type Medium uint8

// The tiers, best first.
const (
	GPU Medium = iota
	CPU
	Disk
	// Other is a medium the gateway does not know: weighed like Disk.
	Other
	numMedia
)

// NumMedia is the number of tiers.
const NumMedia = int(numMedia)

// MediumOf maps an event's medium to its tier: no medium (the field
// absent or null) is the GPU, as vLLM sends it; names are matched without
// case.
func MediumOf(s string) Medium {
	switch strings.ToLower(s) {
	case "", "gpu", "cuda", "hbm", "device", "xpu", "npu", "tpu":
		return GPU
	case "cpu", "cpu_pinned", "dram", "host", "l2", "cpu_tier":
		return CPU
	case "disk", "localdisk", "local_disk", "ssd", "nvme", "l3", "gds", "file", "fs":
		return Disk
	}
	return Other
}

// String is the tier's name in metrics and the admin API.
func (m Medium) String() string {
	switch m {
	case GPU:
		return "gpu"
	case CPU:
		return "cpu"
	case Disk:
		return "disk"
	}
	return "other"
}

// Kind says what an event reports.
type Kind uint8

// The kinds of event vLLM and SGLang publish.
const (
	// Stored: blocks were cached (BlockStored).
	Stored Kind = iota + 1
	// Removed: blocks were evicted from one tier (BlockRemoved).
	Removed
	// Cleared: the engine dropped its whole cache (AllBlocksCleared).
	Cleared
)

// Event is one KV cache event of an engine, decoded from either wire
// encoding (internal/wire/kvevents).
type Event struct {
	Kind Kind
	// Hashes are the engine's block hashes, in chain order for Stored: its
	// own opaque names of the blocks, as 64-bit values (a hash sent as
	// bytes is reduced to 64 bits by the decoder, the same way every
	// time).
	Hashes []uint64
	// Parent is the engine hash of the block before the first of Hashes;
	// HasParent is false when the first block starts a sequence.
	Parent    uint64
	HasParent bool
	// Tokens are the blocks' token ids, BlockSize per block (Stored); none
	// when the event copies blocks the engine holds to another tier (vLLM's
	// OffloadingConnector), which the hashes alone name.
	Tokens    []uint32
	BlockSize int
	// Medium is the tier the event is about.
	Medium Medium
	// LoRA names the adapter the blocks were computed with ("" for the
	// base model). An adapter known only by vLLM's deprecated integer
	// lora_id is named "#lora-id:N", which no request matches.
	LoRA string
	// Salt is the cache salt the blocks were computed with (vLLM's
	// cache_salt on a sequence's first block, SGLang's metadata); "" when
	// the event names none. A Stored event with a parent inherits its
	// parent's.
	Salt string
	// Extra is, per block, a digest of the block's extra keys beyond the
	// adapter and the salt (multimodal identifiers, prompt embeddings); 0
	// for a block with none, nil when no block has any. A block with extra
	// keys never matches a text prompt's block, nor do the blocks after it.
	Extra []uint64
	// Group is the KV cache group (vLLM's group_idx for hybrid models);
	// only group 0 is indexed.
	Group int
}

// Batch is one published batch of events.
type Batch struct {
	// TS is the engine's timestamp of the batch (seconds since the epoch).
	TS float64
	// Rank is the data-parallel rank that published it (0 when absent).
	Rank int
	// Events are the batch's events, in order.
	Events []Event
	// Unknown counts events of kinds the decoder does not know, skipped.
	Unknown int
}
