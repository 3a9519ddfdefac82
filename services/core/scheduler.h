// The iteration-level scheduler of the cache coordinator: it owns the prefix
// forest (and so the chunk allocator) and turns the requests in flight into
// one StepPlan per iteration for the tensor-parallel workers (section 4.6 of
// the vLLM paper: one scheduler and one KV manager, SPMD workers that receive
// every memory decision with the step).
//
// A request's life:
//  - Add(): checked against the pool (RESOURCE_EXHAUSTED if it could never
//    fit alone), queued in the AdmissionPolicy's order (by priority, then
//    arrival; policies.h).
//  - Admission (in Schedule): its prompt is inserted into the forest, which
//    finds the longest cached prefix; the rest is prefilled, possibly over
//    several steps when the per-step token budget is short (chunked prefill).
//    A request whose prompt shares at least one more chunk with a prompt
//    still being prefilled waits a step, so it reuses that KV instead of
//    computing a second copy (in-batch prefix sharing). Between named
//    tenants, admission takes the tenant holding the fewest sequences next,
//    and the step that prefills its first token leaves out the rows of the
//    tenants holding more (one step at a time; scheduler.cc, ChooseRows).
//  - The last prompt token always runs as a decode row over the (C, i, j)
//    context (its logits give the first token), so every row that is
//    sampled is a decode row and prefill never needs logits. A fully cached
//    prompt therefore still recomputes its last token.
//  - Each sampled token is appended (a new chunk when the tail is full,
//    copy-on-write when the tail is shared) and fed back the next step.
//    n > 1 samples all come from the prompt's last row, then fork and share
//    every prompt chunk.
//  - When an Append finds no chunk, the PreemptionPolicy's victim (the
//    running request admission would take last) is preempted:
//    its sequences leave the forest (their computed KV stays cached) and it
//    goes back to the queue, to be recomputed from prompt + generated tokens
//    (mostly a cache hit) when memory allows.
//
// The decode context sent to workers holds only the sequences with a decode
// row in the step (the forest's context also holds sequences mid-prefill):
// SubsetContext() drops the others. It is resent only when its version
// changes (the forest's structure or the decode set changed); otherwise a
// plan carries only the new lengths.
//
// Not thread-safe: owned by the coordinator's loop thread.
#ifndef CHUNKATTN_SERVICES_CORE_SCHEDULER_H_
#define CHUNKATTN_SERVICES_CORE_SCHEDULER_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "base/thread_pool.h"
#include "kernels/api/chunk_context.h"
#include "proto/plan/sampling_params.h"
#include "proto/plan/step_plan.h"
#include "services/core/prefix_forest.h"
#include "services/core/kv_tiers.h"
#include "services/core/policies.h"
#include "services/core/retention.h"
#include "services/core/token_constraint.h"

namespace chunkattn {

using RequestId = int64_t;

// The most parallel samples (n) one request may ask for.
inline constexpr int kMaxSamples = 64;

enum class FinishReason { kNone, kLength, kStopToken, kStopString, kCancelled };

// A validated request (the input processor, services/coordinator/input_processor.h,
// checks every field before the engine sees it).
struct RequestSpec {
  std::vector<TokenId> prompt;
  std::string cache_namespace;
  // return_logprobs is the front end's. The worker returns min(top_logprobs,
  // vocab) entries and Complete() expects top_logprobs: the front clamps it
  // to the vocabulary.
  SamplingParams sampling;
  int32_t max_new_tokens = 16;
  std::vector<TokenId> stop_token_ids;
  bool ignore_eos = false;
  // The first min_tokens tokens of each sample are never EOS (unless
  // ignore_eos) nor a stop token: the worker masks them. <= max_new_tokens.
  int32_t min_tokens = 0;
  int32_t n = 1;
  int32_t priority = 0;  // lower first, in [kMinPriority, kMaxPriority]
  // Who sent it (the front's caller identity): admission takes next the
  // waiting request of the tenant running the fewest sequences, so one
  // tenant's flood queues behind every other tenant's next request. Priority
  // orders requests within that (it is the caller's to set, so it cannot
  // outrank another tenant's share). Empty: one shared tenant.
  std::string tenant;
  // Structured outputs: each sample draws only what this allows, and ends
  // (kStopToken) when it says so, min_tokens or not. Null: none.
  std::shared_ptr<TokenConstraint> constraint;
  // Retention (retention.h): at admission the chunks of the prompt's first
  // prefix_tokens get this priority until `duration` after Add, within the
  // tenant's bound (SchedulerOptions::max_retained_chunks_per_tenant). Unset: none.
  std::optional<RetentionSpec> retention;
};

// Marks Add's RESOURCE_EXHAUSTED for a request that can never fit the pool
// (the client's to change), as against a full queue (worth a retry).
inline constexpr char kNeverFitsPayload[] = "chunkattn.scheduler.never_fits";

// The tokens that end a sample of `spec`: its stop_token_ids, then the
// model's `eos` unless ignore_eos (what min_tokens holds off).
std::vector<TokenId> StopTokens(const RequestSpec& spec, const std::vector<TokenId>& eos);

struct SchedulerOptions {
  int chunk_size = kDefaultChunkSize;
  int32_t num_chunks = 0;            // the KV pool, chunks
  int32_t max_context = 4096;        // tokens
  int32_t max_batch_size = 256;      // sequences with rows in one step
  int32_t max_tokens_per_step = 2048;  // input rows in one step
  // The most of max_batch_size one named tenant (RequestSpec::tenant not
  // empty) may hold: the rest stays free for the others, so a flood leaves
  // another tenant's next request a slot at once. 1 = no bound.
  double tenant_max_batch_share = 1.0;
  bool prefix_sharing = true;        // false: no cross-request sharing (the baseline)
  std::vector<TokenId> eos_token_ids;
  absl::Duration priority_aging = absl::ZeroDuration();  // see AdmissionPolicy
  const Clock* clock = nullptr;  // borrowed: arrivals, cache ages (null: the wall clock)
  bool record_block_events = false;  // the forest records BlockEvents (KV events; TakeBlockEvents)
  // Schedule() leaves the constrained samples' masks to FillMasks() and marks
  // the plan masks_follow, so a caller that sends plans to workers can send
  // the masks while the workers run the step's forward pass.
  bool defer_masks = false;
  // The workers' KV tiers below the pool (services/core/kv_tiers.h): blocks
  // the pool evicts are kept there and loaded back for a later prompt.
  KvTierMapOptions tiers;
  std::string block_hash_seed = "0";  // the tiers' keys: block_hash.h's seed
  // Write-through: every block is kept in a tier as soon as its KV is
  // computed (a copy; the pool keeps it too), not only when the pool evicts
  // it (write-back, the default): more tier traffic, and a block survives a
  // burst of evictions that outruns the stores.
  bool tier_write_through = false;
  // The most blocks one step loads back from the KV tiers (0: no bound). A
  // load costs a worker a check and a copy of the chunk, beside the step's
  // forward pass where it can (on a busy CPU worker those cores are the
  // pass's too), so a burst of hits slows the running batch's step; with a
  // bound, a prompt's blocks come back over several steps (its prefill
  // waits for all of them, sequences already loading go first) and each
  // step carries at most this many.
  int32_t max_tier_loads_per_step = 0;
  // Retention: the most chunks one tenant (RequestSpec::tenant; "" is one
  // tenant too) may hold above the default priority, in the pool and the
  // KV tiers together, so pinning cannot starve the others; a grant past
  // it is accepted, its excess not raised
  // (SchedulerStats::retention_capped_chunks). -1: a quarter of the pool;
  // 0: no chunk is raised.
  int32_t max_retained_chunks_per_tenant = -1;
  // Borrowed; with more than one thread, a step's constrained samples get
  // their masks in parallel (each sample's matcher is its own; at ~40 us a
  // mask inside a free JSON string, 256 rows would take 10 ms on one
  // thread). Null: on the calling thread.
  ThreadPool* mask_pool = nullptr;
};

// One sampled token of one sample, in the order they were produced.
struct SampleEvent {
  RequestId request = 0;
  int32_t index = 0;  // sample index
  TokenId token = 0;
  float logprob = 0;
  // With sampling.top_logprobs = N > 0: the N most likely tokens at this
  // position, most likely first, and their logprobs; else empty.
  std::vector<TokenId> top_token_ids;
  std::vector<float> top_logprobs;
  FinishReason finish = FinishReason::kNone;  // set when this token ends the sample
  bool request_done = false;                  // every sample of the request has finished
  int32_t prompt_tokens = 0;
  int32_t cached_prompt_tokens = 0;  // of the first admission
  int32_t completion_tokens = 0;     // of this sample, so far
};

// One tenant's share of the scheduler (RequestSpec::tenant).
struct TenantLoad {
  int64_t running_requests = 0;
  int64_t waiting_requests = 0;
  int64_t running_sequences = 0;  // live samples of its running requests
};

struct SchedulerStats {
  int64_t running_requests = 0;
  int64_t waiting_requests = 0;
  int64_t waiting_prompt_tokens = 0;  // the prompts of the waiting requests
  int64_t preemptions_total = 0;
  int64_t unshared_chunks = 0;       // chunks the live sequences would need without sharing
  int64_t peak_used_chunks = 0;
  int64_t peak_unshared_chunks = 0;  // at the step of peak_used_chunks
  int64_t retention_capped_chunks = 0;  // chunks a grant left unraised for the tenant's bound (total)
};

// The decode context of the sequences of `full` with keep[s] (context
// order preserved). A shared entry left with one kept reader becomes that
// reader's private chunk; since a chunk's readers are a subset of its
// parent's, such chunks are always at the end of the reader's shared part,
// so they go before its private chunks. O(num_shared + table size).
// REQUIRES: keep.size() == full.num_seqs().
void SubsetContext(const ChunkContext& full, const std::vector<bool>& keep, uint64_t version,
                   ChunkContext* out);

class Scheduler {
 public:
  // INVALID_ARGUMENT for a bad chunk size, pool or budget.
  static absl::StatusOr<std::unique_ptr<Scheduler>> Create(const SchedulerOptions& options);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request. INVALID_ARGUMENT: duplicate id, empty prompt, n < 1,
  // max_new_tokens < 1, prompt + max_new_tokens over max_context, priority
  // out of range.
  // RESOURCE_EXHAUSTED: its n sequences at full length need more chunks than
  // the pool holds, so it could never run.
  absl::Status Add(RequestId id, RequestSpec spec);

  // Ends a request now (cancelled, deadline, stop string on every sample):
  // its sequences leave the forest and their chunks are released. Unknown
  // ids are ignored. REQUIRES: not between Schedule() and Complete().
  void Abort(RequestId id);
  // Ends one sample (a stop string matched). Returns true when that was the
  // request's last running sample (the request is gone).
  bool FinishSample(RequestId id, int32_t index);

  // The shared KV tier (tiers.shared): request `id` (queued) is not admitted
  // until SharedProbeDone(id) or `wait` from now, whichever comes first, so
  // its prompt's blocks in the shared store are loaded rather than
  // recomputed. The probe runs elsewhere (SharedKvProbe): the loop never
  // waits on the store. Unknown ids are ignored.
  void AwaitSharedProbe(RequestId id, absl::Duration wait);
  // The probe's answer for `id`: `keys` (blocks of its prompt) are in the
  // shared store. Admits `id` from the next Schedule; the keys are kept
  // (KvTierMap::NoteShared) whether or not `id` is still queued.
  void SharedProbeDone(RequestId id, absl::Span<const uint64_t> keys);

  // Fills `plan` with the next step. Returns false (and leaves the plan
  // empty) when there is nothing to run. INTERNAL only on a broken invariant.
  absl::StatusOr<bool> Schedule(StepPlan* plan);
  // With defer_masks: the constrained samples' masks of the plan Schedule()
  // just made (plan->masks_follow), on mask_pool when there is one.
  // REQUIRES: between Schedule() and Complete(), on that plan.
  void FillMasks(StepPlan* plan);

  // Applies the result of the last scheduled plan (rank 0's sampled tokens)
  // and appends one event per sampled token. INTERNAL if the result has not
  // one token per sample and each sample's top_logprobs entries.
  absl::Status Complete(const StepResult& result, std::vector<SampleEvent>* events);

  // While false, requests that never ran stay queued; running and preempted
  // ones go on (the engine finishes what runs before its workers restart).
  void set_admitting(bool admitting) { admitting_ = admitting; }
  // Requests admitted at least once (running, or preempted to be recomputed).
  int64_t num_started() const;
  // Removes every request and returns them in admission order, to be Add()ed
  // to the scheduler of the next worker session. REQUIRES: num_started() == 0
  // and not between Schedule() and Complete().
  std::vector<std::pair<RequestId, RequestSpec>> TakeQueued();

  bool HasWork() const { return !requests_.empty(); }
  int64_t num_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  // Ids of every request in flight (running or waiting), oldest first.
  std::vector<RequestId> RequestIds() const;
  SchedulerStats stats() const;
  // Per tenant with a request running or waiting.
  std::map<std::string, TenantLoad> tenant_loads() const;
  // Restarts the peaks of stats() from the current use.
  void ResetPeaks();
  CacheStats cache_stats() const { return forest_->stats(); }
  const KvTierMap& tiers() const { return tiers_; }  // the KV tiers' map and its stats
  const PrefixForest& forest() const { return *forest_; }
  // The forest's block events since the last call (record_block_events).
  std::vector<BlockEvent> TakeBlockEvents() { return forest_->TakeBlockEvents(); }
  // The KV tiers' events since the last call (tiers.record_events).
  std::vector<KvTierEvent> TakeTierEvents() { return tiers_.TakeEvents(); }
  // Chunks above the default retention priority per namespace, in the pool
  // and the tiers (a namespace may appear once for each): what the tenant
  // bound counts.
  std::vector<std::pair<std::string, int64_t>> RaisedPerNamespace() const;
  const SchedulerOptions& options() const { return options_; }

 private:
  struct Request;
  struct Seq;

  explicit Scheduler(const SchedulerOptions& options, std::unique_ptr<PrefixForest> forest);
  // A block the pool evicts goes down a tier (forest callback).
  void OnEvictBlock(const EvictedBlock& block);
  // The tier key of the evicted block, from the chained digests of its
  // ancestors kept in evicted_digests_ (one SHA-256 per block, not one per
  // ancestor per eviction).
  uint64_t EvictedKey(const EvictedBlock& block);
  // Loads the leading blocks of `seq` the tiers hold into its chunks, in
  // the plan being made, as many as max_tier_loads_per_step leaves room
  // for; the sequence waits for them (Seq::loading), and for the rest in
  // later plans (Seq::more_to_load).
  absl::Status PlanLoads(Seq* seq, std::string_view ns);
  // PlanLoads again for the running sequences whose loads the bound cut.
  absl::Status ContinueLoads(const std::vector<Request*>& running);
  // tier_write_through: keeps the blocks of `seq` computed since its last
  // call in a tier (stores in the next plan, before it writes anything).
  absl::Status WriteThrough(Seq* seq);

  std::string Namespace(const Request& r) const;
  // Inserts the request's sequences; all or nothing.
  absl::Status Admit(Request* r, std::vector<KvCopy>* copies);
  // Gives the request's retention to the chunks of `seq`, within its tenant's bound.
  absl::Status Retain(const Request& r, SeqId seq);
  int32_t max_retained_chunks() const;
  // True when `r` should wait for a prompt being prefilled that it shares.
  bool ShouldDefer(const Request& r) const;
  void ReleaseSeqs(Request* r);   // every sequence leaves the forest
  void Preempt(Request* r);
  // Inserts into waiting_ at its admission key.
  void Enqueue(Request* r);
  Request* PreemptionVictim();
  void EndSampler(int64_t key);
  // The allowed next tokens of a constrained sample (RequestSpec::constraint)
  // into `mask`, min_tokens applied.
  void ConstraintMask(const Request& r, int32_t index, std::vector<uint32_t>* mask) const;
  void EraseRequest(RequestId id);
  void UpdatePeaks();

  // Schedule's phases (scheduler.cc says what each does).
  struct Work {
    Seq* seq;
    int32_t begin;  // first row's position
    int32_t end;    // one past the last prefill row
    bool decode;    // plus the decode row at tokens.size() - 1
  };
  std::vector<Request*> RunningInAdmissionOrder() const;
  absl::Status FeedBackTokens(std::vector<Request*>* running, std::vector<KvCopy>* copies);
  absl::Status AdmitWaiting(std::vector<Request*>* running, std::vector<KvCopy>* copies);
  std::vector<Work> ChooseRows(const std::vector<Request*>& running);
  absl::Status WritePrefill(const std::vector<Work>& work, StepPlan* plan);
  absl::Status WriteDecode(const std::vector<Work>& work, StepPlan* plan);

  SchedulerOptions options_;
  const Clock* clock_;
  AdmissionPolicy admission_;
  PreemptionPolicy preemption_;
  std::unique_ptr<PrefixForest> forest_;
  std::map<RequestId, std::unique_ptr<Request>> requests_;
  std::deque<Request*> waiting_;  // by admission key
  int64_t next_arrival_ = 0;
  int64_t next_sampler_key_ = 1;
  absl::flat_hash_map<SeqId, Seq*> seqs_;

  // The decode context last sent, and how to refresh it.
  ChunkContext decode_ctx_;
  uint64_t forest_version_ = ~uint64_t{0};  // never a forest's: the first decode sends the context
  std::vector<SeqId> decode_set_;
  uint64_t decode_version_ = 0;

  // What the scheduled step does, for Complete().
  struct StepSeq {
    SeqId seq = 0;
    int32_t computed_after = 0;
  };
  struct StepSample {
    RequestId request = 0;
    int32_t index = 0;
    int32_t top_logprobs = 0;  // its entries in StepResult::top_*, kept for aborted requests too
  };
  std::vector<StepSeq> step_seqs_;
  std::vector<StepSample> step_samples_;
  // The plan's constrained samples, for FillMasks().
  struct MaskJob {
    size_t sample = 0;  // index into the plan's samples
    const Request* request = nullptr;
    int32_t index = 0;  // the request's sample
  };
  std::vector<MaskJob> mask_jobs_;
  // KV tiers: the moves for the next plan, the step in flight's, and its
  // loads per sequence (blocks [first_block, first_block + count) from
  // moves [first_move, first_move + count)).
  KvTierMap tiers_;
  // Per pool chunk: the chained digest (block_hash.h) of the block it holds,
  // kept once an eviction below it computed it. A block leaves the pool only
  // by eviction, its children first, so an entry is dropped when its chunk
  // is evicted and is never stale.
  std::vector<BlockDigest> evicted_digests_;
  std::vector<bool> has_evicted_digest_;
  std::vector<KvMove> pending_moves_;
  std::vector<KvMove> step_moves_;
  struct StepLoad {
    SeqId seq = 0;
    int32_t first_move = 0;
    int32_t count = 0;
    int32_t first_block = 0;
  };
  std::vector<StepLoad> step_loads_;
  int32_t step_tier_loads_ = 0;  // loads in the plan being built (max_tier_loads_per_step)
  std::vector<SamplerStart> pending_starts_;
  std::vector<int64_t> pending_sampler_ends_;
  // Tenants whose rows sat out the last step for a newcomer's prefill (ChooseRows).
  absl::flat_hash_set<std::string> sat_out_;
  uint64_t step_ = 0;
  bool in_step_ = false;

  bool admitting_ = true;
  int64_t preemptions_ = 0;
  int64_t retention_capped_ = 0;
  int64_t peak_used_ = 0;
  int64_t peak_unshared_ = 0;
  int64_t unshared_now_ = 0;
};

}  // namespace chunkattn

#endif  // CHUNKATTN_SERVICES_CORE_SCHEDULER_H_
