// One iteration's plan, as the scheduler makes it and a worker runs it: every
// memory decision (copies, chunk lists, the decode context) and which rows
// are sampled with which sampler. Plain C++; plan_proto.h converts it to and
// from worker.proto at the gRPC boundary only, so an in-process engine
// never serializes.
//
// Row order: the prefill pieces' tokens first (prefill.q_begin offsets),
// then one decode row per context sequence when has_decode.
#ifndef CHUNKATTN_PROTO_PLAN_STEP_PLAN_H_
#define CHUNKATTN_PROTO_PLAN_STEP_PLAN_H_

#include <cstdint>
#include <vector>

#include "kernels/api/attention.h"
#include "kernels/api/chunk_context.h"
#include "proto/plan/sampling_params.h"

namespace chunkattn {

// A sample stream the sampling rank keeps between steps (repetition-penalty
// history and parameters), named by a key unique within the session.
struct SamplerStart {
  int64_t key = 0;
  SamplingParams params;  // return_logprobs is not carried: the front end's
  std::vector<int32_t> history;  // tokens so far (prompt, and any generated)
  // Tokens never sampled while the sample's step (SampleRow::step) is below
  // min_tokens: EOS and stop tokens, for the request's min_tokens.
  int32_t min_tokens = 0;
  std::vector<int32_t> suppress_ids;
};

struct SampleRow {
  int32_t row = 0;    // index into logits_rows
  int64_t key = 0;    // SamplerStart::key
  uint64_t step = 0;  // index of the token being generated for this sample
  // A constrained output's (structured outputs) allowed next tokens: bit
  // t % 32 of word t / 32 set for token t; tokens past the words are not
  // allowed. Empty: no constraint.
  std::vector<uint32_t> allowed;
};

// The KV tiers below a worker's pool (issue 41): its host memory and its
// local disk, each an array of chunk-sized slots, and a store shared by every
// replica (Redis, the coordinator's --kv_store_url), keyed by the block's
// chained hash alone (no slot). The coordinator owns the map of what is
// where (services/core/kv_tiers.h); each rank moves its own shard of a chunk.
enum class KvTier : uint8_t { kHost = 1, kDisk = 2, kShared = 3 };

// One move of one chunk's KV (every layer, K and V: the rank's shard).
//   kStore:  pool chunk `chunk` -> `tier` slot `slot`, tagged `key` (the
//            block's chained hash) and a checksum of its bytes.
//   kLoad:   `tier` slot `slot` -> pool chunk `chunk`. Fails unless the slot
//            holds `key` with bytes that match their checksum; the chunk's
//            contents are then unspecified (the coordinator recomputes it).
//   kDemote: host slot `slot` -> disk slot `to_slot`, key and checksum kept.
// With tier kShared (stores and loads only) `slot` is 0 and the shared
// store's key is made from `key` (workers/server/shared_kv_store.h).
// A failed move is reported (StepResult::failed_moves), never an error of
// the step: a tier that is full, slow, corrupt or gone costs a recompute.
struct KvMove {
  enum class Kind : uint8_t { kStore = 0, kLoad = 1, kDemote = 2 };
  Kind kind = Kind::kStore;
  KvTier tier = KvTier::kHost;
  int64_t slot = 0;
  int64_t to_slot = 0;  // kDemote
  int32_t chunk = -1;   // kStore, kLoad
  uint64_t key = 0;

  static KvMove Store(KvTier tier, int64_t slot, int32_t chunk, uint64_t key) {
    return {Kind::kStore, tier, slot, 0, chunk, key};
  }
  static KvMove Load(KvTier tier, int64_t slot, int32_t chunk, uint64_t key) {
    return {Kind::kLoad, tier, slot, 0, chunk, key};
  }
  static KvMove Demote(int64_t host_slot, int64_t disk_slot, uint64_t key) {
    return {Kind::kDemote, KvTier::kHost, host_slot, disk_slot, -1, key};
  }
  friend bool operator==(const KvMove& a, const KvMove& b) {
    return a.kind == b.kind && a.tier == b.tier && a.slot == b.slot && a.to_slot == b.to_slot &&
           a.chunk == b.chunk && a.key == b.key;
  }
};

struct StepPlan {
  uint64_t step = 0;
  int64_t num_kv_chunks = 0;  // first plan of a session only: the pool size
  std::vector<SamplerStart> sampler_starts;
  std::vector<int64_t> sampler_ends;  // applied after the step's samples
  // Applied in order first, before the copies; a worker may run them beside
  // the step's pass when it touches none of their chunks (PlanExecutor).
  std::vector<KvMove> moves;
  std::vector<KvCopy> copies;         // applied before any KV write of the step
  std::vector<int32_t> tokens;        // every input row
  PrefillBatch prefill;
  // The decode context when its version changed (seq_len not set: that is
  // the per-step seq_len below); else the worker keeps the last one.
  bool has_context = false;
  ChunkContext context;
  bool has_decode = false;
  std::vector<int32_t> seq_len;      // per context sequence, every step with decode rows
  std::vector<int32_t> logits_rows;  // rows whose logits are computed
  std::vector<SampleRow> samples;    // the sampling rank samples these
  // The samples' `allowed` masks are sent after the plan, while the ranks
  // run its forward pass (Scheduler::FillMasks; plan_proto.h's MasksToProto).
  bool masks_follow = false;
};

struct StepResult {
  uint64_t step = 0;
  std::vector<int32_t> tokens;  // per StepPlan::samples (the sampling rank only)
  std::vector<float> logprobs;
  // Per StepPlan::samples, its sampler's params.top_logprobs entries (most
  // likely first), concatenated: token ids and their logprobs.
  std::vector<int32_t> top_token_ids;
  std::vector<float> top_logprobs;
  double compute_seconds = 0;
  // Indices into StepPlan::moves of the moves that failed on this rank (the
  // coordinator takes the union over ranks), in increasing order.
  std::vector<int32_t> failed_moves;
  // Seconds this rank spent loading from the shared tier (Redis round trips
  // and checks) in this step's moves; the coordinator keeps the slowest
  // rank's.
  double shared_load_seconds = 0;
};

}  // namespace chunkattn

#endif  // CHUNKATTN_PROTO_PLAN_STEP_PLAN_H_
