#include "services/core/scheduler.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/hash.h"
#include "base/status_macros.h"
#include "base/tenant_namespace.h"

namespace chunkattn {
namespace {

// Waiting requests looked at per admission round: bounds the in-batch sharing
// scan when the queue is long.
constexpr int kAdmissionScan = 64;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Sample i's seed: the request's seed for sample 0, a mix of it for the rest,
// so samples differ but the whole request is reproducible from one seed.
uint64_t SampleSeed(uint64_t seed, int index) {
  if (index == 0) return seed;
  return Mix64(seed + kGoldenGamma * static_cast<uint64_t>(index));
}

}  // namespace

struct Scheduler::Seq {
  SeqId id = 0;
  Request* request = nullptr;
  // Sample indices this sequence produces: one, or every unfinished sample
  // of a fresh request until its first token (then it forks).
  std::vector<int32_t> samples;
  std::vector<TokenId> tokens;  // as in the forest
  int32_t computed = 0;         // leading tokens with KV in the pool
  TokenId pending = -1;         // sampled, to be appended and fed next step
  bool loading = false;         // blocks from a KV tier land in the step in flight (PlanLoads)
  bool more_to_load = false;    // and more in later steps (max_tier_loads_per_step): still loading after it
  std::unique_ptr<BlockKeyChain> keys;  // its full blocks' tier keys, made when first needed
  int32_t written_through = 0;          // blocks WriteThrough kept
};

struct Scheduler::Request {
  RequestId id = 0;
  RequestSpec spec;
  QueuedRequest queued;  // queued.sequence: arrival order
  AdmissionKey key;      // of `queued`, kept: the queue compares it often
  bool running = false;
  int32_t cached_prompt_tokens = -1;  // of the first admission
  absl::Time probe_until = absl::InfinitePast();  // not admitted before, while its shared-tier probe runs
  absl::Time retain_until = absl::InfiniteFuture();  // spec.retention's end
  struct Sample {
    std::vector<TokenId> generated;
    bool finished = false;
    int64_t sampler_key = 0;  // 0: no sampler state on the workers
  };
  std::vector<Sample> samples;
  std::vector<std::unique_ptr<Seq>> seqs;
};

void SubsetContext(const ChunkContext& full, const std::vector<bool>& keep, uint64_t version,
                   ChunkContext* out) {
  const int n = full.num_seqs();
  std::vector<int32_t> index(n + 1, 0);  // kept sequences before s
  for (int s = 0; s < n; ++s) index[s + 1] = index[s] + (keep[s] ? 1 : 0);
  const int m = index[n];
  out->chunk_size = full.chunk_size;
  out->version = version;
  out->seq_ids.clear();
  out->seq_len.clear();
  for (int s = 0; s < n; ++s) {
    if (!keep[s]) continue;
    out->seq_ids.push_back(full.seq_ids[s]);
    out->seq_len.push_back(full.seq_len[s]);
  }
  out->shared_chunk.clear();
  out->shared_begin.clear();
  out->shared_end.clear();
  out->shared_tokens.clear();
  // Demoted entries per kept reader, in table order (= position order).
  std::vector<std::vector<std::pair<int32_t, int32_t>>> demoted(m);
  for (int k = 0; k < full.num_shared(); ++k) {
    const int32_t i = index[full.shared_begin[k]];
    const int32_t j = index[full.shared_end[k]];
    if (j - i >= 2) {
      out->shared_chunk.push_back(full.shared_chunk[k]);
      out->shared_begin.push_back(i);
      out->shared_end.push_back(j);
      out->shared_tokens.push_back(full.shared_tokens[k]);
    } else if (j - i == 1) {
      demoted[i].emplace_back(full.shared_chunk[k], full.shared_tokens[k]);
    }
  }
  out->private_begin.assign(m, 0);
  out->private_end.assign(m, 0);
  out->private_chunk.clear();
  out->private_tokens.clear();
  for (int s = 0, t = 0; s < n; ++s) {
    if (!keep[s]) continue;
    out->private_begin[t] = static_cast<int32_t>(out->private_chunk.size());
    for (const auto& [chunk, tokens] : demoted[t]) {
      out->private_chunk.push_back(chunk);
      out->private_tokens.push_back(tokens);
    }
    for (int32_t e = full.private_begin[s]; e < full.private_end[s]; ++e) {
      out->private_chunk.push_back(full.private_chunk[e]);
      out->private_tokens.push_back(full.private_tokens[e]);
    }
    out->private_end[t] = static_cast<int32_t>(out->private_chunk.size());
    ++t;
  }
}

std::vector<TokenId> StopTokens(const RequestSpec& spec, const std::vector<TokenId>& eos) {
  std::vector<TokenId> out = spec.stop_token_ids;
  if (!spec.ignore_eos) out.insert(out.end(), eos.begin(), eos.end());
  return out;
}

absl::StatusOr<std::unique_ptr<Scheduler>> Scheduler::Create(const SchedulerOptions& options) {
  if (options.max_batch_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("max_batch_size must be >= 1, got %d", options.max_batch_size));
  }
  if (options.max_tokens_per_step < options.max_batch_size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "max_tokens_per_step (%d) must be >= max_batch_size (%d): a full decode step feeds one "
        "token per sequence",
        options.max_tokens_per_step, options.max_batch_size));
  }
  if (options.priority_aging < absl::ZeroDuration() || options.priority_aging > AdmissionPolicy::kMaxAging) {
    return absl::InvalidArgumentError(absl::StrCat("priority_aging must be in [0, ",
                                                   absl::FormatDuration(AdmissionPolicy::kMaxAging), "], got ",
                                                   absl::FormatDuration(options.priority_aging)));
  }
  if (options.max_context < 2) {
    return absl::InvalidArgumentError(
        absl::StrFormat("max_context must be >= 2, got %d", options.max_context));
  }
  if (!(options.tenant_max_batch_share > 0 && options.tenant_max_batch_share <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("tenant_max_batch_share must be in (0, 1], got %g", options.tenant_max_batch_share));
  }
  PrefixForestOptions fo;
  fo.chunk_size = options.chunk_size;
  fo.num_chunks = options.num_chunks;
  fo.max_seq_len = options.max_context;
  fo.clock = options.clock;
  ASSIGN_OR_RETURN(std::unique_ptr<PrefixForest> forest, PrefixForest::Create(fo));
  forest->set_record_block_events(options.record_block_events);
  return std::unique_ptr<Scheduler>(new Scheduler(options, std::move(forest)));
}

Scheduler::Scheduler(const SchedulerOptions& options, std::unique_ptr<PrefixForest> forest)
    : options_(options),
      clock_(options.clock != nullptr ? options.clock : Clock::Real()),
      admission_(options.priority_aging),
      preemption_(&admission_),
      forest_(std::move(forest)),
      tiers_([&] {
        KvTierMapOptions t = options.tiers;
        if (t.clock == nullptr) t.clock = options.clock;
        return t;
      }()) {
  if (tiers_.enabled()) forest_->set_on_evict_block([this](const EvictedBlock& b) { OnEvictBlock(b); });
}

void Scheduler::OnEvictBlock(const EvictedBlock& block) {
  if (block.chunks.empty()) return;
  tiers_.Keep(EvictedKey(block), block.chunk, &pending_moves_, block.grants, block.ns);
}

uint64_t Scheduler::EvictedKey(const EvictedBlock& block) {
  if (has_evicted_digest_.empty()) {
    evicted_digests_.resize(options_.num_chunks);
    has_evicted_digest_.assign(options_.num_chunks, false);
  }
  const int c = options_.chunk_size;
  const int32_t last = static_cast<int32_t>(block.chunks.size()) - 1;
  // The deepest ancestor already digested, then one hash per block below it.
  int32_t from = last - 1;
  while (from >= 0 && !has_evicted_digest_[block.chunks[from]]) --from;
  BlockDigest digest = from >= 0 ? evicted_digests_[block.chunks[from]] : NoneDigest(options_.block_hash_seed);
  for (int32_t b = from + 1; b <= last; ++b) {
    digest = ChainDigest(digest, block.path.subspan(static_cast<size_t>(b) * c, c),
                         b == 0 ? block.ns : std::string_view());
    if (b < last) {
      evicted_digests_[block.chunks[b]] = digest;
      has_evicted_digest_[block.chunks[b]] = true;
    }
  }
  has_evicted_digest_[block.chunk] = false;  // its chunk is freed now
  return PublishedHash(digest);
}

absl::Status Scheduler::WriteThrough(Seq* seq) {
  const int c = options_.chunk_size;
  if (seq->keys == nullptr) seq->keys = std::make_unique<BlockKeyChain>(Namespace(*seq->request), options_.block_hash_seed);
  const int32_t blocks = seq->computed / c;
  if (blocks <= seq->written_through) return absl::OkStatus();
  seq->keys->Extend(absl::MakeConstSpan(seq->tokens).first(static_cast<size_t>(blocks) * c), c);
  const std::vector<uint64_t>& keys = seq->keys->keys();
  ASSIGN_OR_RETURN(const std::vector<ChunkId> chunks, forest_->Chunks(seq->id));
  const std::string ns = Namespace(*seq->request);
  for (int32_t b = seq->written_through; b < blocks; ++b) {
    tiers_.Keep(keys[b], chunks[b], &pending_moves_, nullptr, ns);
  }
  seq->written_through = blocks;
  return absl::OkStatus();
}

absl::Status Scheduler::PlanLoads(Seq* seq, std::string_view ns) {
  const int c = options_.chunk_size;
  const int32_t len = static_cast<int32_t>(seq->tokens.size());
  // Whole blocks from the first one the pool lacks, up to the last prompt
  // token, which the prefill computes for the first logits.
  const int32_t first = seq->computed / c, last = (len - 1) / c;
  if (first >= last) return absl::OkStatus();
  if (seq->keys == nullptr) seq->keys = std::make_unique<BlockKeyChain>(ns, options_.block_hash_seed);
  seq->keys->Extend(absl::MakeConstSpan(seq->tokens).first(static_cast<size_t>(last) * c), c);
  const std::vector<uint64_t>& keys = seq->keys->keys();
  if (!tiers_.Find(keys[first]).has_value()) return absl::OkStatus();
  const int32_t bound = options_.max_tier_loads_per_step;
  const int32_t room = bound > 0 ? bound - step_tier_loads_ : last - first;
  seq->loading = true;
  if (room <= 0) {  // the step's loads are spoken for: all of them next time
    seq->more_to_load = true;
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(const std::vector<ChunkId> chunks, forest_->Chunks(seq->id));
  const int32_t first_move = static_cast<int32_t>(pending_moves_.size());
  int32_t count = 0;
  std::vector<RetentionGrants> grants;
  for (int32_t b = first; b < last && count < room && tiers_.Find(keys[b]).has_value(); ++b, ++count) {
    grants.push_back(tiers_.Load(keys[b], chunks[b], &pending_moves_));
  }
  step_tier_loads_ += count;
  // Cut by the bound: the next block may still be in a tier then.
  seq->more_to_load = first + count < last && tiers_.Find(keys[first + count]).has_value();
  // The loaded blocks' grants come back to the pool, each ancestor taking
  // its descendants' too (a grant covers a prefix: the forest's eviction
  // order relies on it, and the pool's copy of an ancestor may have lost
  // what the tier kept).
  RetentionGrants below;
  for (int32_t b = first + count - 1; b >= 0; --b) {
    if (b >= first) below.Merge(grants[b - first]);
    if (below.empty()) continue;
    RETURN_IF_ERROR(forest_->MergeGrants(seq->id, b, below));
  }
  step_loads_.push_back({seq->id, first_move, count, first});
  return absl::OkStatus();
}

absl::Status Scheduler::ContinueLoads(const std::vector<Request*>& running) {
  for (Request* r : running) {
    for (auto& seq : r->seqs) {
      if (!seq->more_to_load) continue;
      // The blocks may have left their tiers since: the prefill computes them.
      seq->loading = seq->more_to_load = false;
      RETURN_IF_ERROR(PlanLoads(seq.get(), Namespace(*r)));
    }
  }
  return absl::OkStatus();
}

Scheduler::~Scheduler() = default;

void Scheduler::AwaitSharedProbe(RequestId id, absl::Duration wait) {
  auto it = requests_.find(id);
  if (it == requests_.end() || !tiers_.shared()) return;
  it->second->probe_until = clock_->Now() + wait;
}

void Scheduler::SharedProbeDone(RequestId id, absl::Span<const uint64_t> keys) {
  tiers_.NoteShared(keys);
  if (auto it = requests_.find(id); it != requests_.end()) it->second->probe_until = absl::InfinitePast();
}

absl::Status Scheduler::Add(RequestId id, RequestSpec spec) {
  if (requests_.count(id) != 0) {
    return absl::InvalidArgumentError(absl::StrFormat("request %d is already in flight", id));
  }
  if (spec.prompt.empty()) return absl::InvalidArgumentError("prompt is empty");
  if (spec.priority < kMinPriority || spec.priority > kMaxPriority) {
    return absl::InvalidArgumentError(
        absl::StrFormat("priority must be in [%d, %d], got %d", kMinPriority, kMaxPriority, spec.priority));
  }
  if (spec.n < 1 || spec.n > kMaxSamples) {
    return absl::InvalidArgumentError(
        absl::StrFormat("n must be in [1, %d], got %d", kMaxSamples, spec.n));
  }
  const int64_t len = static_cast<int64_t>(spec.prompt.size());
  if (spec.max_new_tokens < 1 || len + spec.max_new_tokens > options_.max_context) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "max_new_tokens (%d) must be >= 1 and fit the context of %d tokens with the %d prompt "
        "tokens",
        spec.max_new_tokens, options_.max_context, len));
  }
  const int c = options_.chunk_size;
  const int64_t needed = CeilDiv(len + spec.max_new_tokens, c) +
                         int64_t{spec.n - 1} * (CeilDiv(spec.max_new_tokens, c) + 1);
  if (needed > options_.num_chunks) {
    absl::Status never = absl::ResourceExhaustedError(absl::StrFormat(
        "the request needs up to %d KV chunks (%d prompt tokens, max_new_tokens %d, n %d) and the "
        "pool holds %d",
        needed, len, spec.max_new_tokens, spec.n, options_.num_chunks));
    never.SetPayload(kNeverFitsPayload, absl::Cord());
    return never;
  }
  if (spec.retention.has_value()) {
    const RetentionSpec& rs = *spec.retention;
    if (rs.priority < kMinRetentionPriority || rs.priority > kMaxRetentionPriority) {
      return absl::InvalidArgumentError(absl::StrFormat("retention priority must be in [%d, %d], got %d",
                                                        kMinRetentionPriority, kMaxRetentionPriority, rs.priority));
    }
    if (rs.duration <= absl::ZeroDuration() ||
        (rs.duration > kMaxRetentionDuration && rs.duration != absl::InfiniteDuration())) {
      return absl::InvalidArgumentError(absl::StrCat("retention duration must be in (0, ",
                                                     absl::FormatDuration(kMaxRetentionDuration), "], got ",
                                                     absl::FormatDuration(rs.duration)));
    }
    if (rs.prefix_tokens < 0 || rs.prefix_tokens > len) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "retention prefix_tokens must be in [0, %d] (the prompt), got %d", len, rs.prefix_tokens));
    }
  }
  auto r = std::make_unique<Request>();
  r->id = id;
  r->queued = {spec.priority, clock_->Now(), next_arrival_++};
  if (spec.retention.has_value()) r->retain_until = r->queued.arrival + spec.retention->duration;
  r->key = admission_.Key(r->queued);
  r->samples.resize(spec.n);
  r->spec = std::move(spec);
  Enqueue(r.get());
  requests_.emplace(id, std::move(r));
  return absl::OkStatus();
}

int32_t Scheduler::max_retained_chunks() const {
  return options_.max_retained_chunks_per_tenant >= 0 ? options_.max_retained_chunks_per_tenant
                                                      : options_.num_chunks / 4;
}

absl::Status Scheduler::Retain(const Request& r, SeqId seq) {
  const RetentionSpec& rs = *r.spec.retention;
  int64_t raised = 0;
  for (const auto& [ns, n] : RaisedPerNamespace()) raised += TenantOwnsNamespace(r.spec.tenant, ns) ? n : 0;
  const int32_t budget = static_cast<int32_t>(std::max<int64_t>(0, max_retained_chunks() - raised));
  const int32_t prefix = rs.prefix_tokens > 0 ? rs.prefix_tokens : static_cast<int32_t>(r.spec.prompt.size());
  ASSIGN_OR_RETURN(const RetainResult done, forest_->Retain(seq, prefix, {rs.priority, r.retain_until}, budget));
  retention_capped_ += done.capped_chunks;
  return absl::OkStatus();
}

std::vector<std::pair<std::string, int64_t>> Scheduler::RaisedPerNamespace() const {
  std::vector<std::pair<std::string, int64_t>> out;
  for (const auto& [ns, n] : forest_->RaisedPerNamespace()) out.emplace_back(ns, n);
  if (tiers_.enabled()) {
    for (auto& entry : tiers_.RaisedPerNamespace()) out.push_back(std::move(entry));
  }
  return out;
}

std::string Scheduler::Namespace(const Request& r) const {
  // Without sharing every request is its own tenant (a name no client can
  // send: it starts with a NUL byte).
  if (!options_.prefix_sharing) return absl::StrCat(std::string(1, '\0'), r.id);
  return r.spec.cache_namespace;
}

void Scheduler::EndSampler(int64_t key) {
  if (key != 0) pending_sampler_ends_.push_back(key);
}

void Scheduler::ReleaseSeqs(Request* r) {
  for (auto& seq : r->seqs) {
    (void)forest_->Remove(seq->id);  // known to the forest by construction
    seqs_.erase(seq->id);
  }
  r->seqs.clear();
}

void Scheduler::Preempt(Request* r) {
  ReleaseSeqs(r);
  for (auto& s : r->samples) {
    EndSampler(s.sampler_key);
    s.sampler_key = 0;
  }
  r->running = false;
  Enqueue(r);
  ++preemptions_;
}

void Scheduler::Enqueue(Request* r) {
  // upper_bound: most arrivals go last, in O(log n) and O(1) to insert.
  auto it = std::upper_bound(waiting_.begin(), waiting_.end(), r,
                             [](const Request* a, const Request* b) { return a->key < b->key; });
  waiting_.insert(it, r);
}

Scheduler::Request* Scheduler::PreemptionVictim() {
  std::vector<Request*> running;
  std::vector<QueuedRequest> queued;
  for (auto& [id, r] : requests_) {
    if (!r->running) continue;
    running.push_back(r.get());
    queued.push_back(r->queued);
  }
  const int victim = preemption_.Victim(queued);
  return victim < 0 ? nullptr : running[victim];
}

void Scheduler::EraseRequest(RequestId id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  Request* r = it->second.get();
  ReleaseSeqs(r);
  for (auto& s : r->samples) EndSampler(s.sampler_key);
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), r), waiting_.end());
  requests_.erase(it);
}

void Scheduler::Abort(RequestId id) { EraseRequest(id); }

bool Scheduler::FinishSample(RequestId id, int32_t index) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return false;
  Request* r = it->second.get();
  if (index < 0 || index >= static_cast<int32_t>(r->samples.size())) return false;
  auto& sample = r->samples[index];
  if (sample.finished) return false;
  sample.finished = true;
  EndSampler(sample.sampler_key);
  sample.sampler_key = 0;
  for (size_t k = 0; k < r->seqs.size(); ++k) {
    Seq* seq = r->seqs[k].get();
    auto pos = std::find(seq->samples.begin(), seq->samples.end(), index);
    if (pos == seq->samples.end()) continue;
    seq->samples.erase(pos);
    if (seq->samples.empty()) {
      (void)forest_->Remove(seq->id);
      seqs_.erase(seq->id);
      r->seqs.erase(r->seqs.begin() + static_cast<std::ptrdiff_t>(k));
    }
    break;
  }
  const bool done = std::all_of(r->samples.begin(), r->samples.end(),
                                [](const Request::Sample& s) { return s.finished; });
  if (done) EraseRequest(id);
  return done;
}

bool Scheduler::ShouldDefer(const Request& r) const {
  if (!options_.prefix_sharing) return false;
  const auto& prompt = r.spec.prompt;
  for (const auto& [id, seq] : seqs_) {
    if (seq->computed + 1 >= static_cast<int32_t>(seq->tokens.size())) continue;  // not mid-prefill
    if (seq->request->spec.cache_namespace != r.spec.cache_namespace) continue;
    const size_t limit = std::min(prompt.size(), seq->tokens.size());
    size_t lcp = 0;
    while (lcp < limit && prompt[lcp] == seq->tokens[lcp]) ++lcp;
    if (static_cast<int64_t>(lcp) >= int64_t{seq->computed} + options_.chunk_size) return true;
  }
  return false;
}

absl::Status Scheduler::Admit(Request* r, std::vector<KvCopy>* copies) {
  const std::string ns = Namespace(*r);
  const bool fresh = std::all_of(r->samples.begin(), r->samples.end(),
                                 [](const Request::Sample& s) { return s.generated.empty(); });
  // (tokens, samples) of each sequence to insert.
  std::vector<std::pair<std::vector<TokenId>, std::vector<int32_t>>> plan;
  if (fresh) {
    std::vector<int32_t> all;
    for (int32_t i = 0; i < static_cast<int32_t>(r->samples.size()); ++i) {
      if (!r->samples[i].finished) all.push_back(i);
    }
    plan.emplace_back(r->spec.prompt, std::move(all));
  } else {
    for (int32_t i = 0; i < static_cast<int32_t>(r->samples.size()); ++i) {
      const auto& s = r->samples[i];
      if (s.finished) continue;
      std::vector<TokenId> tokens = r->spec.prompt;
      tokens.insert(tokens.end(), s.generated.begin(), s.generated.end());
      plan.emplace_back(std::move(tokens), std::vector<int32_t>{i});
    }
  }
  for (auto& [tokens, samples] : plan) {
    absl::StatusOr<InsertResult> inserted = forest_->Insert(tokens, ns);
    if (!inserted.ok()) {
      // Copies already listed stay: a copy-on-write target may now be a
      // cached chunk that claims the copied KV.
      ReleaseSeqs(r);
      return inserted.status();
    }
    copies->insert(copies->end(), inserted->copies.begin(), inserted->copies.end());
    auto seq = std::make_unique<Seq>();
    seq->id = inserted->seq_id;
    seq->request = r;
    seq->samples = std::move(samples);
    const int32_t len = static_cast<int32_t>(tokens.size());
    seq->computed = std::min(inserted->matched_tokens, len - 1);
    seq->tokens = std::move(tokens);
    if (fresh && r->cached_prompt_tokens < 0) r->cached_prompt_tokens = seq->computed;
    seqs_[seq->id] = seq.get();
    // Once per admission: every sequence holds the prompt's chunks.
    if (r->spec.retention.has_value() && r->seqs.empty()) RETURN_IF_ERROR(Retain(*r, seq->id));
    if (tiers_.enabled() && !tiers_.empty()) RETURN_IF_ERROR(PlanLoads(seq.get(), ns));
    r->seqs.push_back(std::move(seq));
  }
  if (r->cached_prompt_tokens < 0) r->cached_prompt_tokens = 0;
  for (int32_t i = 0; i < static_cast<int32_t>(r->samples.size()); ++i) {
    auto& s = r->samples[i];
    if (s.finished) continue;
    s.sampler_key = next_sampler_key_++;
    SamplerStart start;
    start.key = s.sampler_key;
    start.params = r->spec.sampling;
    start.params.return_logprobs = false;
    start.params.seed = SampleSeed(r->spec.sampling.seed, i);
    if (r->spec.sampling.repetition_penalty != 1.0f) {
      start.history = r->spec.prompt;
      start.history.insert(start.history.end(), s.generated.begin(), s.generated.end());
    }
    // A constrained sample's min_tokens is in its mask (ConstraintMask).
    if (r->spec.constraint == nullptr && static_cast<int32_t>(s.generated.size()) < r->spec.min_tokens) {
      start.min_tokens = r->spec.min_tokens;
      start.suppress_ids = StopTokens(r->spec, options_.eos_token_ids);
    }
    pending_starts_.push_back(std::move(start));
  }
  r->running = true;
  return absl::OkStatus();
}

// One step, in five phases: feed back last step's tokens (preempting when
// the pool is full), admit waiting requests, choose the rows, then write the
// prefill pieces and the decode rows into the plan.
absl::StatusOr<bool> Scheduler::Schedule(StepPlan* plan) {
  if (in_step_) return absl::InternalError("Schedule called before Complete");
  *plan = StepPlan();
  std::vector<Request*> running = RunningInAdmissionOrder();
  RETURN_IF_ERROR(FeedBackTokens(&running, &plan->copies));
  // Sequences already loading take the step's loads first.
  step_tier_loads_ = 0;
  RETURN_IF_ERROR(ContinueLoads(running));
  RETURN_IF_ERROR(AdmitWaiting(&running, &plan->copies));
  const std::vector<Work> work = ChooseRows(running);

  UpdatePeaks();
  // Nothing for the workers: the sampler ends wait for the next plan. A plan
  // without rows still goes out when it has copies (they must land before any
  // later write) or sampler starts.
  if (work.empty() && plan->copies.empty() && pending_starts_.empty() && pending_moves_.empty()) return false;
  // Tier moves first on the workers: a chunk evicted above is stored before
  // anything of this step writes it.
  plan->moves = std::move(pending_moves_);
  pending_moves_.clear();
  step_moves_ = plan->moves;
  plan->sampler_starts = std::move(pending_starts_);
  pending_starts_.clear();
  plan->sampler_ends = std::move(pending_sampler_ends_);
  pending_sampler_ends_.clear();

  step_seqs_.clear();
  step_samples_.clear();
  mask_jobs_.clear();
  RETURN_IF_ERROR(WritePrefill(work, plan));
  RETURN_IF_ERROR(WriteDecode(work, plan));
  if (!options_.defer_masks) FillMasks(plan);
  plan->step = ++step_;
  in_step_ = true;
  return true;
}

std::vector<Scheduler::Request*> Scheduler::RunningInAdmissionOrder() const {
  std::vector<Request*> running;
  for (const auto& [id, r] : requests_) {
    if (r->running) running.push_back(r.get());
  }
  std::sort(running.begin(), running.end(), [](const Request* a, const Request* b) { return a->key < b->key; });
  return running;
}

// Phase 1: feed back last step's tokens in admission order; preempt the
// policy's victim when no chunk is left. Preempted requests leave `running`.
absl::Status Scheduler::FeedBackTokens(std::vector<Request*>* running, std::vector<KvCopy>* copies) {
  for (Request* r : *running) {
    if (!r->running) continue;  // preempted for an older request
    for (size_t k = 0; k < r->seqs.size() && r->running; ++k) {
      Seq* seq = r->seqs[k].get();
      if (seq->pending < 0) continue;
      while (true) {
        absl::StatusOr<AppendResult> appended = forest_->Append(seq->id, absl::Span<const TokenId>(&seq->pending, 1));
        if (appended.ok()) {
          copies->insert(copies->end(), appended->copies.begin(), appended->copies.end());
          seq->tokens.push_back(seq->pending);
          seq->pending = -1;
          break;
        }
        if (!absl::IsResourceExhausted(appended.status())) {
          return absl::InternalError(absl::StrCat("append: ", appended.status().ToString()));
        }
        Request* victim = PreemptionVictim();  // not null: r is running
        Preempt(victim);
        if (victim == r) break;
      }
    }
  }
  running->erase(std::remove_if(running->begin(), running->end(), [](Request* r) { return !r->running; }),
                 running->end());
  return absl::OkStatus();
}

// Phase 2: admission in the policy's order, bounded by the batch size and the
// free chunks. A request counts its live samples, not its sequences: the n
// samples of a prompt share one sequence until they fork, and then each
// decodes its own row. Admitted requests join `running`.
absl::Status Scheduler::AdmitWaiting(std::vector<Request*>* running, std::vector<KvCopy>* copies) {
  const int c = options_.chunk_size;
  auto footprint = [](const Request* r) {
    int64_t live_samples = 0;
    for (const auto& s : r->samples) live_samples += s.finished ? 0 : 1;
    return std::max<int64_t>(live_samples, static_cast<int64_t>(r->seqs.size()));
  };
  int64_t batch_seqs = 0;
  absl::flat_hash_map<std::string, int64_t> held;  // live sequences running, per tenant
  for (Request* r : *running) {
    batch_seqs += footprint(r);
    held[r->spec.tenant] += footprint(r);
  }
  // Fair share: of the first kAdmissionScan waiting requests, each round
  // takes the first of the tenant holding the fewest sequences (with one
  // tenant: the policy's order).
  std::vector<Request*> candidates;
  const int64_t tenant_cap = std::max<int64_t>(
      1, static_cast<int64_t>(options_.tenant_max_batch_share * options_.max_batch_size));
  auto over_share = [&](const Request* r) {
    return !r->spec.tenant.empty() && held[r->spec.tenant] + footprint(r) > tenant_cap &&
           held[r->spec.tenant] > 0;  // a request alone may pass the cap (n > the share)
  };
  int scanned = 0;
  const absl::Time now = clock_->Now();
  for (auto it = waiting_.begin(); it != waiting_.end() && scanned < kAdmissionScan; ++it, ++scanned) {
    if (ShouldDefer(**it) || (!admitting_ && (*it)->cached_prompt_tokens < 0)) continue;
    if ((*it)->probe_until > now) continue;  // its shared-tier probe has not answered yet
    candidates.push_back(*it);
  }
  while (!candidates.empty()) {
    size_t pick = 0;
    for (size_t i = 1; i < candidates.size(); ++i) {
      if (held[candidates[i]->spec.tenant] < held[candidates[pick]->spec.tenant]) pick = i;
    }
    Request* r = candidates[pick];
    // A prefix another admitted request computes first; or a tenant at its share.
    if (ShouldDefer(*r) || over_share(r)) {
      candidates.erase(candidates.begin() + static_cast<std::ptrdiff_t>(pick));
      continue;
    }
    const int64_t live_samples = footprint(r);
    if (batch_seqs + live_samples > options_.max_batch_size) break;
    // Room for the whole prompt (ignoring what the cache may match) plus one
    // chunk of growth per running sequence, so admission does not just cause
    // preemption.
    const CacheStats cs = forest_->stats();
    int64_t prompt_len = static_cast<int64_t>(r->spec.prompt.size());
    for (const auto& s : r->samples) {
      prompt_len = std::max<int64_t>(prompt_len, r->spec.prompt.size() + s.generated.size());
    }
    const int64_t need = CeilDiv(prompt_len, c) * live_samples + batch_seqs;
    if (need > int64_t{cs.free_chunks} + cs.cached_chunks && !running->empty()) break;
    absl::Status admitted = Admit(r, copies);
    if (absl::IsResourceExhausted(admitted)) break;
    if (!admitted.ok()) return absl::InternalError(absl::StrCat("admit: ", admitted.ToString()));
    candidates.erase(candidates.begin() + static_cast<std::ptrdiff_t>(pick));
    waiting_.erase(std::find(waiting_.begin(), waiting_.end(), r));
    running->push_back(r);
    batch_seqs += footprint(r);
    held[r->spec.tenant] += footprint(r);
  }
  return absl::OkStatus();
}

// Phase 3: every decode row first, then prefill pieces in admission order
// within the token budget. A newcomer's first token comes first between
// named tenants: in a step that prefills a request with no token yet for a
// tenant holding fewer sequences than another, that other tenant's rows sit
// the step out, so a flood's decode rows do not slow another tenant's time to
// first token (on a CPU a decode row costs about what a prompt row does).
// Never two steps in a row: a flood waits at most every other step.
std::vector<Scheduler::Work> Scheduler::ChooseRows(const std::vector<Request*>& running) {
  absl::flat_hash_map<std::string, int64_t> held;  // sequences running, per tenant
  for (const Request* r : running) held[r->spec.tenant] += static_cast<int64_t>(r->seqs.size());
  int64_t newcomer = -1;  // the fewest held by a named tenant prefilling a request with no token yet
  for (const Request* r : running) {
    if (r->spec.tenant.empty()) continue;
    const bool first_token = std::all_of(r->samples.begin(), r->samples.end(),
                                         [](const Request::Sample& s) { return s.generated.empty(); });
    const bool prefills = std::any_of(r->seqs.begin(), r->seqs.end(), [](const std::unique_ptr<Seq>& seq) {
      return static_cast<int32_t>(seq->tokens.size()) - seq->computed > 1;
    });
    if (first_token && prefills && (newcomer < 0 || held[r->spec.tenant] < newcomer)) newcomer = held[r->spec.tenant];
  }
  absl::flat_hash_set<std::string> sit_out;
  for (const auto& [tenant, n] : held) {
    if (!tenant.empty() && newcomer >= 0 && n > newcomer && !sat_out_.contains(tenant)) sit_out.insert(tenant);
  }
  sat_out_ = sit_out;

  std::vector<Work> work;
  int64_t rows = 0;
  for (Request* r : running) {
    if (sit_out.contains(r->spec.tenant)) continue;
    for (auto& seq : r->seqs) {
      if (!seq->loading && static_cast<int32_t>(seq->tokens.size()) - seq->computed == 1) ++rows;
    }
  }
  for (Request* r : running) {
    if (sit_out.contains(r->spec.tenant)) continue;
    for (auto& seq_ptr : r->seqs) {
      Seq* seq = seq_ptr.get();
      if (seq->loading) continue;  // its prefill starts once the loaded blocks are in
      const int32_t len = static_cast<int32_t>(seq->tokens.size());
      const int32_t todo = len - seq->computed;
      if (todo <= 0) continue;
      if (todo == 1) {
        work.push_back({seq, seq->computed, seq->computed, true});
        continue;
      }
      const int64_t room = options_.max_tokens_per_step - rows;
      if (room <= 0) continue;
      if (todo <= room) {
        work.push_back({seq, seq->computed, len - 1, true});
        rows += todo;
      } else {
        work.push_back({seq, seq->computed, seq->computed + static_cast<int32_t>(room), false});
        rows += room;
      }
    }
  }
  return work;
}

// Phase 4: the prefill pieces' rows and chunk tables.
absl::Status Scheduler::WritePrefill(const std::vector<Work>& work, StepPlan* plan) {
  for (const Work& w : work) {
    if (w.end <= w.begin) continue;
    PrefillBatch& prefill = plan->prefill;
    if (prefill.q_begin.empty()) {
      prefill.q_begin.push_back(0);
      prefill.chunk_begin.push_back(0);
    }
    plan->tokens.insert(plan->tokens.end(), w.seq->tokens.begin() + w.begin, w.seq->tokens.begin() + w.end);
    prefill.prefix_len.push_back(w.begin);
    prefill.q_begin.push_back(static_cast<int32_t>(plan->tokens.size()));
    ASSIGN_OR_RETURN(std::vector<ChunkId> chunks, forest_->Chunks(w.seq->id));
    prefill.chunk_ids.insert(prefill.chunk_ids.end(), chunks.begin(), chunks.end());
    prefill.chunk_begin.push_back(static_cast<int32_t>(prefill.chunk_ids.size()));
  }
  return absl::OkStatus();
}

// Phase 5: the decode rows over the subset of the forest's context (sent
// only when it changed), after the prefill rows.
absl::Status Scheduler::WriteDecode(const std::vector<Work>& work, StepPlan* plan) {
  const int32_t prefill_rows = static_cast<int32_t>(plan->tokens.size());
  bool any_decode = false;
  for (const Work& w : work) {
    any_decode |= w.decode;
    step_seqs_.push_back({w.seq->id, w.decode ? static_cast<int32_t>(w.seq->tokens.size()) : w.end});
  }
  if (!any_decode) return absl::OkStatus();
  const ChunkContext& full = forest_->Context();
  std::vector<bool> keep(full.num_seqs(), false);
  for (const Work& w : work) {
    if (!w.decode) continue;
    const int32_t idx = forest_->ContextIndex(w.seq->id);
    if (idx < 0) return absl::InternalError("a decoding sequence is not in the context");
    keep[idx] = true;
  }
  std::vector<SeqId> set;
  for (int s = 0; s < full.num_seqs(); ++s) {
    if (keep[s]) set.push_back(full.seq_ids[s]);
  }
  if (full.version != forest_version_ || set != decode_set_) {
    SubsetContext(full, keep, ++decode_version_, &decode_ctx_);
    forest_version_ = full.version;
    decode_set_ = std::move(set);
    plan->has_context = true;
    plan->context = decode_ctx_;
    plan->context.seq_len.clear();
  }
  plan->has_decode = true;
  for (size_t s = 0; s < decode_set_.size(); ++s) {
    Seq* seq = seqs_.at(decode_set_[s]);
    plan->seq_len.push_back(static_cast<int32_t>(seq->tokens.size()));
    plan->tokens.push_back(seq->tokens.back());
    plan->logits_rows.push_back(prefill_rows + static_cast<int32_t>(s));
    Request* r = seq->request;
    for (int32_t index : seq->samples) {
      plan->samples.push_back(
          {static_cast<int32_t>(s), r->samples[index].sampler_key, r->samples[index].generated.size(), {}});
      if (r->spec.constraint != nullptr) {
        mask_jobs_.push_back({plan->samples.size() - 1, r, index});
        plan->masks_follow = options_.defer_masks;
      }
      step_samples_.push_back({r->id, index, r->spec.sampling.top_logprobs});
    }
  }
  return absl::OkStatus();
}

void Scheduler::FillMasks(StepPlan* plan) {
  auto fill = [&](int64_t k, int /*thread*/) {
    const MaskJob& job = mask_jobs_[k];
    ConstraintMask(*job.request, job.index, &plan->samples[job.sample].allowed);
  };
  const int64_t n = static_cast<int64_t>(mask_jobs_.size());
  if (options_.mask_pool != nullptr && options_.mask_pool->num_threads() > 1 && n > 1) {
    options_.mask_pool->ParallelFor(n, fill);  // distinct samples: no state shared (TokenConstraint)
  } else {
    for (int64_t k = 0; k < n; ++k) fill(k, 0);
  }
  mask_jobs_.clear();
}

void Scheduler::ConstraintMask(const Request& r, int32_t index, std::vector<uint32_t>* mask) const {
  TokenConstraint& constraint = *r.spec.constraint;
  mask->assign(static_cast<size_t>(constraint.mask_words()), 0);
  const std::vector<TokenId> stops = StopTokens(r.spec, options_.eos_token_ids);
  auto set_stops = [&](bool on) {
    for (TokenId t : stops) {
      const size_t w = static_cast<size_t>(t) / 32;
      if (t < 0 || w >= mask->size()) continue;
      if (on) {
        (*mask)[w] |= uint32_t{1} << (t % 32);
      } else {
        (*mask)[w] &= ~(uint32_t{1} << (t % 32));
      }
    }
  };
  const int32_t tokens_left = r.spec.max_new_tokens - static_cast<int32_t>(r.samples[index].generated.size());
  if (!constraint.FillNextTokenMask(index, tokens_left, absl::MakeSpan(*mask))) {
    // Broken (the matcher gave up): only a stop token, and Accept ends it.
    std::fill(mask->begin(), mask->end(), 0);
    set_stops(true);
    if (std::all_of(mask->begin(), mask->end(), [](uint32_t w) { return w == 0; })) (*mask)[0] = 1;
    return;
  }
  // Under min_tokens the stop tokens wait, unless the constraint allows
  // nothing else: then it ends the output (its sampler suppresses nothing).
  if (static_cast<int32_t>(r.samples[index].generated.size()) < r.spec.min_tokens) {
    const std::vector<uint32_t> full = *mask;
    set_stops(false);
    if (std::all_of(mask->begin(), mask->end(), [](uint32_t w) { return w == 0; })) *mask = full;
  }
}

absl::Status Scheduler::Complete(const StepResult& result, std::vector<SampleEvent>* events) {
  if (!in_step_) return absl::InternalError("Complete without a scheduled step");
  in_step_ = false;
  if (result.tokens.size() != step_samples_.size() || result.logprobs.size() != result.tokens.size()) {
    return absl::InternalError(absl::StrFormat("step %d: %d sampled tokens for %d samples", result.step,
                                               result.tokens.size(), step_samples_.size()));
  }
  size_t num_top = 0;
  for (const StepSample& s : step_samples_) num_top += s.top_logprobs;
  if (result.top_token_ids.size() != num_top || result.top_logprobs.size() != num_top) {
    return absl::InternalError(absl::StrFormat("step %d: %d top token ids and %d top logprobs for %d asked",
                                               result.step, result.top_token_ids.size(),
                                               result.top_logprobs.size(), num_top));
  }
  for (const StepSeq& s : step_seqs_) {
    auto it = seqs_.find(s.seq);
    if (it == seqs_.end()) continue;
    RETURN_IF_ERROR(forest_->MarkComputed(s.seq, s.computed_after));
    it->second->computed = s.computed_after;
    if (options_.tier_write_through && tiers_.enabled()) RETURN_IF_ERROR(WriteThrough(it->second));
  }
  // Loaded blocks count from the first up to the first failed one; the
  // prefill computes the rest.
  tiers_.Complete(step_moves_, result.failed_moves);
  const absl::flat_hash_set<int32_t> failed(result.failed_moves.begin(), result.failed_moves.end());
  for (const StepLoad& l : step_loads_) {
    auto it = seqs_.find(l.seq);
    if (it == seqs_.end()) continue;
    Seq* seq = it->second;
    int32_t loaded = 0;
    while (loaded < l.count && !failed.contains(l.first_move + loaded)) ++loaded;
    // A failed load ends the sequence's loading: the prefill computes the rest.
    if (loaded < l.count) seq->more_to_load = false;
    seq->loading = seq->more_to_load;
    const int32_t upto = (l.first_block + loaded) * options_.chunk_size;
    if (upto <= seq->computed) continue;
    RETURN_IF_ERROR(forest_->MarkComputed(seq->id, upto));
    seq->computed = upto;
    Request* r = seq->request;
    const bool fresh = std::all_of(r->samples.begin(), r->samples.end(),
                                   [](const Request::Sample& s) { return s.generated.empty(); });
    if (fresh) r->cached_prompt_tokens = std::max(r->cached_prompt_tokens, upto);
  }
  step_loads_.clear();
  step_moves_.clear();
  std::vector<Seq*> sampled_seqs;
  size_t top_end = 0;
  for (size_t k = 0; k < step_samples_.size(); ++k) {
    const size_t top_begin = top_end;  // sample k's entries in result.top_*
    top_end += step_samples_[k].top_logprobs;
    auto rit = requests_.find(step_samples_[k].request);
    if (rit == requests_.end()) continue;
    Request* r = rit->second.get();
    auto& sample = r->samples[step_samples_[k].index];
    const TokenId token = result.tokens[k];
    sample.generated.push_back(token);
    SampleEvent e;
    e.request = r->id;
    e.index = step_samples_[k].index;
    e.token = token;
    e.logprob = result.logprobs[k];
    e.top_token_ids.assign(result.top_token_ids.begin() + top_begin, result.top_token_ids.begin() + top_end);
    e.top_logprobs.assign(result.top_logprobs.begin() + top_begin, result.top_logprobs.begin() + top_end);
    e.prompt_tokens = static_cast<int32_t>(r->spec.prompt.size());
    e.cached_prompt_tokens = std::max(r->cached_prompt_tokens, 0);
    e.completion_tokens = static_cast<int32_t>(sample.generated.size());
    const auto& eos = options_.eos_token_ids;
    const auto& stops = r->spec.stop_token_ids;
    // Before min_tokens the worker never samples these; a stop there is not one.
    const bool may_stop = static_cast<int32_t>(sample.generated.size()) > r->spec.min_tokens;
    if (may_stop && ((!r->spec.ignore_eos && std::find(eos.begin(), eos.end(), token) != eos.end()) ||
                     std::find(stops.begin(), stops.end(), token) != stops.end())) {
      e.finish = FinishReason::kStopToken;
    } else if (static_cast<int32_t>(sample.generated.size()) >= r->spec.max_new_tokens) {
      e.finish = FinishReason::kLength;
    }
    // The constraint has the last word: it ends the output when a stop token
    // completed it or nothing can follow (before max_new_tokens: "stop").
    if (r->spec.constraint != nullptr && r->spec.constraint->Accept(e.index, token)) {
      e.finish = FinishReason::kStopToken;
    }
    if (e.finish != FinishReason::kNone) {
      sample.finished = true;
      EndSampler(sample.sampler_key);
      sample.sampler_key = 0;
    }
    events->push_back(e);
  }
  // Sequences: feed each unfinished sample's token back; fork a fan-out.
  for (auto& [id, r] : requests_) {
    for (size_t k = 0; k < r->seqs.size();) {
      Seq* seq = r->seqs[k].get();
      if (static_cast<int32_t>(seq->tokens.size()) != seq->computed || seq->pending >= 0) {
        ++k;
        continue;  // mid-prefill, or not sampled this step
      }
      std::vector<int32_t> live;
      for (int32_t index : seq->samples) {
        if (!r->samples[index].finished) live.push_back(index);
      }
      if (live.empty()) {
        (void)forest_->Remove(seq->id);
        seqs_.erase(seq->id);
        r->seqs.erase(r->seqs.begin() + static_cast<std::ptrdiff_t>(k));
        continue;
      }
      seq->samples = {live[0]};
      seq->pending = r->samples[live[0]].generated.back();
      if (live.size() > 1) {
        ASSIGN_OR_RETURN(std::vector<SeqId> forks,
                         forest_->Fork(seq->id, static_cast<int>(live.size()) - 1));
        for (size_t f = 0; f < forks.size(); ++f) {
          auto child = std::make_unique<Seq>();
          child->id = forks[f];
          child->request = r.get();
          child->samples = {live[f + 1]};
          child->tokens = seq->tokens;
          child->computed = seq->computed;
          child->pending = r->samples[live[f + 1]].generated.back();
          seqs_[child->id] = child.get();
          r->seqs.push_back(std::move(child));
        }
      }
      ++k;
    }
  }
  // Requests whose every sample finished leave; their last event says so.
  for (auto it = events->rbegin(); it != events->rend(); ++it) {
    auto rit = requests_.find(it->request);
    if (rit == requests_.end()) continue;
    const auto& samples = rit->second->samples;
    if (std::all_of(samples.begin(), samples.end(), [](const Request::Sample& s) { return s.finished; })) {
      it->request_done = true;
      EraseRequest(it->request);
    }
  }
  return absl::OkStatus();
}

void Scheduler::ResetPeaks() {
  peak_used_ = 0;
  peak_unshared_ = 0;
  UpdatePeaks();
}

void Scheduler::UpdatePeaks() {
  int64_t unshared = 0;
  for (const auto& [id, seq] : seqs_) unshared += CeilDiv(static_cast<int64_t>(seq->tokens.size()), options_.chunk_size);
  unshared_now_ = unshared;
  const int64_t used = forest_->stats().used_chunks;
  if (used > peak_used_) {
    peak_used_ = used;
    peak_unshared_ = unshared;
  }
}

int64_t Scheduler::num_started() const {
  int64_t n = 0;
  for (const auto& [id, r] : requests_) n += r->running || r->cached_prompt_tokens >= 0;
  return n;
}

std::vector<std::pair<RequestId, RequestSpec>> Scheduler::TakeQueued() {
  std::vector<std::pair<RequestId, RequestSpec>> queued;
  for (Request* r : waiting_) queued.emplace_back(r->id, std::move(r->spec));
  waiting_.clear();
  requests_.clear();
  return queued;
}

std::vector<RequestId> Scheduler::RequestIds() const {
  std::vector<const Request*> all;
  for (const auto& [id, r] : requests_) all.push_back(r.get());
  std::sort(all.begin(), all.end(), [](const Request* a, const Request* b) { return a->queued.sequence < b->queued.sequence; });
  std::vector<RequestId> ids;
  for (const Request* r : all) ids.push_back(r->id);
  return ids;
}

std::map<std::string, TenantLoad> Scheduler::tenant_loads() const {
  std::map<std::string, TenantLoad> loads;
  for (const auto& [id, r] : requests_) {
    TenantLoad& l = loads[r->spec.tenant];
    if (!r->running) continue;
    ++l.running_requests;
    for (const auto& s : r->samples) l.running_sequences += s.finished ? 0 : 1;
  }
  for (const Request* r : waiting_) ++loads[r->spec.tenant].waiting_requests;
  return loads;
}

SchedulerStats Scheduler::stats() const {
  SchedulerStats s;
  for (const auto& [id, r] : requests_) s.running_requests += r->running ? 1 : 0;
  s.waiting_requests = static_cast<int64_t>(waiting_.size());
  for (const Request* r : waiting_) s.waiting_prompt_tokens += static_cast<int64_t>(r->spec.prompt.size());
  s.preemptions_total = preemptions_;
  s.unshared_chunks = unshared_now_;
  s.peak_used_chunks = peak_used_;
  s.peak_unshared_chunks = peak_unshared_;
  s.retention_capped_chunks = retention_capped_;
  return s;
}

}  // namespace chunkattn
