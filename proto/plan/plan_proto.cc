#include "proto/plan/plan_proto.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_format.h"

namespace chunkattn {
namespace {

template <typename T, typename Repeated>
void Append(const std::vector<T>& from, Repeated* to) {
  to->Add(from.begin(), from.end());
}

template <typename T, typename Repeated>
void Assign(const Repeated& from, std::vector<T>* to) {
  to->assign(from.begin(), from.end());
}

}  // namespace

namespace {

// The most mask words a plan may name: the largest vocabulary the samplers
// take (kernels/cuda/sample_row.h's 2^23), plus one so that a longer mask
// still reaches the executor's check (and is refused there) without the
// wire choosing how much this side allocates.
constexpr uint32_t kMaxMaskWords = (uint32_t{1} << 23) / 32 + 1;
constexpr bool kLittleEndian = __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__;

// A mask as ids where that is smaller: a varint id costs 1 to 3 bytes, a
// word 4 bytes per 32 tokens.
void EncodeAllowed(const std::vector<uint32_t>& allowed, internal::v1::SampleRow* row) {
  // Counted only up to where ids stop paying (a dense mask stops early).
  const int64_t limit = static_cast<int64_t>(allowed.size()) * 4 / 3;
  int64_t set = 0;
  for (size_t w = 0; w < allowed.size() && set <= limit; ++w) {
    if (allowed[w] != 0) set += __builtin_popcount(allowed[w]);
  }
  if (set <= limit) {
    row->set_allowed_words(static_cast<uint32_t>(allowed.size()));
    for (size_t w = 0; w < allowed.size(); ++w) {
      for (uint32_t bits = allowed[w]; bits != 0; bits &= bits - 1) {
        row->add_allowed_ids(static_cast<int32_t>(w * 32 + __builtin_ctz(bits)));
      }
    }
    return;
  }
  std::string* bytes = row->mutable_allowed_tokens();
  bytes->resize(allowed.size() * 4);
  if constexpr (kLittleEndian) {
    std::memcpy(bytes->data(), allowed.data(), bytes->size());  // the wire's byte order already
  } else {
    for (size_t w = 0; w < allowed.size(); ++w) {
      for (int b = 0; b < 4; ++b) (*bytes)[w * 4 + b] = static_cast<char>((allowed[w] >> (8 * b)) & 0xff);
    }
  }
}

// Ids outside the named words are dropped (they cannot be allowed); a
// partial last word of bytes reads as zero bits.
void DecodeAllowed(const internal::v1::SampleRow& row, std::vector<uint32_t>* allowed) {
  allowed->clear();
  if (row.allowed_words() > 0) {
    allowed->assign(std::min(row.allowed_words(), kMaxMaskWords), 0);
    const int64_t tokens = static_cast<int64_t>(allowed->size()) * 32;
    for (int32_t id : row.allowed_ids()) {
      if (id >= 0 && id < tokens) (*allowed)[id / 32] |= uint32_t{1} << (id % 32);
    }
    return;
  }
  const std::string& bytes = row.allowed_tokens();
  allowed->assign(std::min<size_t>((bytes.size() + 3) / 4, kMaxMaskWords), 0);
  const size_t n = std::min(bytes.size(), allowed->size() * 4);
  if constexpr (kLittleEndian) {
    if (n > 0) std::memcpy(allowed->data(), bytes.data(), n);  // an empty vector's data() may be null
  } else {
    for (size_t i = 0; i < n; ++i) {
      (*allowed)[i / 4] |= static_cast<uint32_t>(static_cast<uint8_t>(bytes[i])) << (8 * (i % 4));
    }
  }
}

using WireMove = internal::v1::KvMove;

WireMove::Kind ToWire(KvMove::Kind kind) {
  switch (kind) {
    case KvMove::Kind::kStore:
      return WireMove::KIND_STORE;
    case KvMove::Kind::kLoad:
      return WireMove::KIND_LOAD;
    case KvMove::Kind::kDemote:
      return WireMove::KIND_DEMOTE;
  }
  return WireMove::KIND_UNSPECIFIED;  // a value outside the enum: refused by the receiver
}

internal::v1::KvTier ToWire(KvTier tier) {
  switch (tier) {
    case KvTier::kHost:
      return internal::v1::KV_TIER_HOST;
    case KvTier::kDisk:
      return internal::v1::KV_TIER_DISK;
    case KvTier::kShared:
      return internal::v1::KV_TIER_SHARED;
  }
  return internal::v1::KV_TIER_UNSPECIFIED;
}

absl::Status MoveFromProto(const WireMove& m, int index, KvMove* out) {
  switch (m.kind()) {
    case WireMove::KIND_STORE:
      out->kind = KvMove::Kind::kStore;
      break;
    case WireMove::KIND_LOAD:
      out->kind = KvMove::Kind::kLoad;
      break;
    case WireMove::KIND_DEMOTE:
      out->kind = KvMove::Kind::kDemote;
      break;
    default:
      return absl::InvalidArgumentError(absl::StrFormat("KV move %d: unknown kind %d", index, m.kind()));
  }
  switch (m.tier()) {
    case internal::v1::KV_TIER_HOST:
      out->tier = KvTier::kHost;
      break;
    case internal::v1::KV_TIER_DISK:
      out->tier = KvTier::kDisk;
      break;
    case internal::v1::KV_TIER_SHARED:
      out->tier = KvTier::kShared;
      break;
    default:
      return absl::InvalidArgumentError(absl::StrFormat("KV move %d: unknown tier %d", index, m.tier()));
  }
  if (m.slot() < 0 || m.to_slot() < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("KV move %d: negative slot (slot %d, to_slot %d)", index, m.slot(), m.to_slot()));
  }
  if (out->kind != KvMove::Kind::kDemote && m.chunk() < 0) {
    return absl::InvalidArgumentError(absl::StrFormat("KV move %d: negative chunk %d", index, m.chunk()));
  }
  out->slot = m.slot();
  out->to_slot = m.to_slot();
  out->chunk = m.chunk();
  out->key = m.key();
  return absl::OkStatus();
}

}  // namespace

void ToProto(const StepPlan& plan, internal::v1::StepPlan* out) {
  out->Clear();
  out->set_step(plan.step);
  out->set_num_kv_chunks(plan.num_kv_chunks);
  for (const SamplerStart& s : plan.sampler_starts) {
    auto* start = out->add_sampler_starts();
    start->set_key(s.key);
    auto* p = start->mutable_params();
    p->set_temperature(s.params.temperature);
    p->set_top_k(s.params.top_k);
    p->set_top_p(s.params.top_p);
    p->set_min_p(s.params.min_p);
    p->set_repetition_penalty(s.params.repetition_penalty);
    p->set_seed(s.params.seed);
    p->set_top_logprobs(s.params.top_logprobs);
    Append(s.history, start->mutable_history());
    start->set_min_tokens(s.min_tokens);
    Append(s.suppress_ids, start->mutable_suppress_ids());
  }
  Append(plan.sampler_ends, out->mutable_sampler_ends());
  for (const KvMove& m : plan.moves) {
    WireMove* move = out->add_moves();
    move->set_kind(ToWire(m.kind));
    move->set_tier(ToWire(m.tier));
    move->set_slot(m.slot);
    move->set_to_slot(m.to_slot);
    move->set_chunk(m.chunk);
    move->set_key(m.key);
  }
  for (const KvCopy& c : plan.copies) {
    auto* kc = out->add_copies();
    kc->set_src_chunk(c.src_chunk);
    kc->set_dst_chunk(c.dst_chunk);
    kc->set_num_tokens(c.num_tokens);
  }
  Append(plan.tokens, out->mutable_tokens());
  Append(plan.prefill.prefix_len, out->mutable_prefill_prefix_len());
  Append(plan.prefill.q_begin, out->mutable_prefill_q_begin());
  Append(plan.prefill.chunk_begin, out->mutable_prefill_chunk_begin());
  Append(plan.prefill.chunk_ids, out->mutable_prefill_chunk_ids());
  if (plan.has_context) {
    const ChunkContext& c = plan.context;
    auto* dc = out->mutable_context();
    dc->set_version(c.version);
    Append(c.seq_ids, dc->mutable_seq_ids());
    Append(c.shared_chunk, dc->mutable_shared_chunk());
    Append(c.shared_begin, dc->mutable_shared_begin());
    Append(c.shared_end, dc->mutable_shared_end());
    Append(c.shared_tokens, dc->mutable_shared_tokens());
    Append(c.private_begin, dc->mutable_private_begin());
    Append(c.private_end, dc->mutable_private_end());
    Append(c.private_chunk, dc->mutable_private_chunk());
    Append(c.private_tokens, dc->mutable_private_tokens());
  }
  out->set_has_decode(plan.has_decode);
  Append(plan.seq_len, out->mutable_seq_len());
  Append(plan.logits_rows, out->mutable_logits_rows());
  for (const SampleRow& s : plan.samples) {
    auto* row = out->add_samples();
    row->set_row(s.row);
    row->set_key(s.key);
    row->set_step(s.step);
    if (!s.allowed.empty()) EncodeAllowed(s.allowed, row);
  }
  out->set_masks_follow(plan.masks_follow);
}

void MasksToProto(const StepPlan& plan, internal::v1::StepPlan* out) {
  out->Clear();
  out->set_step(plan.step);
  out->set_masks_only(true);
  for (const SampleRow& s : plan.samples) {
    auto* row = out->add_samples();
    if (!s.allowed.empty()) EncodeAllowed(s.allowed, row);
  }
}

absl::Status MasksFromProto(const internal::v1::StepPlan& wire, uint64_t step, size_t samples,
                            std::vector<std::vector<uint32_t>>* masks) {
  if (!wire.masks_only() || wire.step() != step || static_cast<size_t>(wire.samples_size()) != samples) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "expected the token masks of step %d (%d samples), got a message of step %d with %d samples%s", step, samples,
        wire.step(), wire.samples_size(), wire.masks_only() ? "" : " that is not masks_only"));
  }
  masks->resize(samples);
  for (size_t k = 0; k < samples; ++k) DecodeAllowed(wire.samples(static_cast<int>(k)), &(*masks)[k]);
  return absl::OkStatus();
}

absl::Status FromProto(const internal::v1::StepPlan& plan, StepPlan* out) {
  out->step = plan.step();
  out->num_kv_chunks = plan.num_kv_chunks();
  out->sampler_starts.resize(plan.sampler_starts_size());
  for (int k = 0; k < plan.sampler_starts_size(); ++k) {
    const auto& s = plan.sampler_starts(k);
    SamplerStart& start = out->sampler_starts[k];
    start.key = s.key();
    start.params = SamplingParams();
    start.params.temperature = s.params().temperature();
    start.params.top_k = s.params().top_k();
    start.params.top_p = s.params().top_p();
    start.params.min_p = s.params().min_p();
    start.params.repetition_penalty = s.params().repetition_penalty();
    start.params.seed = s.params().seed();
    start.params.top_logprobs = s.params().top_logprobs();
    Assign(s.history(), &start.history);
    start.min_tokens = s.min_tokens();
    Assign(s.suppress_ids(), &start.suppress_ids);
  }
  Assign(plan.sampler_ends(), &out->sampler_ends);
  out->moves.resize(plan.moves_size());
  for (int k = 0; k < plan.moves_size(); ++k) {
    if (absl::Status s = MoveFromProto(plan.moves(k), k, &out->moves[k]); !s.ok()) return s;
  }
  out->copies.resize(plan.copies_size());
  for (int k = 0; k < plan.copies_size(); ++k) {
    const auto& c = plan.copies(k);
    out->copies[k] = {c.src_chunk(), c.dst_chunk(), c.num_tokens()};
  }
  Assign(plan.tokens(), &out->tokens);
  Assign(plan.prefill_prefix_len(), &out->prefill.prefix_len);
  Assign(plan.prefill_q_begin(), &out->prefill.q_begin);
  Assign(plan.prefill_chunk_begin(), &out->prefill.chunk_begin);
  Assign(plan.prefill_chunk_ids(), &out->prefill.chunk_ids);
  out->has_context = plan.has_context();
  ChunkContext& c = out->context;
  if (out->has_context) {
    const auto& dc = plan.context();
    c.version = dc.version();
    Assign(dc.seq_ids(), &c.seq_ids);
    Assign(dc.shared_chunk(), &c.shared_chunk);
    Assign(dc.shared_begin(), &c.shared_begin);
    Assign(dc.shared_end(), &c.shared_end);
    Assign(dc.shared_tokens(), &c.shared_tokens);
    Assign(dc.private_begin(), &c.private_begin);
    Assign(dc.private_end(), &c.private_end);
    Assign(dc.private_chunk(), &c.private_chunk);
    Assign(dc.private_tokens(), &c.private_tokens);
  } else {
    c = ChunkContext();
  }
  out->has_decode = plan.has_decode();
  Assign(plan.seq_len(), &out->seq_len);
  Assign(plan.logits_rows(), &out->logits_rows);
  out->samples.resize(plan.samples_size());
  for (int k = 0; k < plan.samples_size(); ++k) {
    const auto& s = plan.samples(k);
    out->samples[k] = {s.row(), s.key(), s.step(), {}};
    DecodeAllowed(s, &out->samples[k].allowed);
  }
  out->masks_follow = plan.masks_follow();
  return absl::OkStatus();
}

void ToProto(const StepResult& result, internal::v1::StepResult* out) {
  out->Clear();
  out->set_step(result.step);
  Append(result.tokens, out->mutable_tokens());
  Append(result.logprobs, out->mutable_logprobs());
  Append(result.top_token_ids, out->mutable_top_token_ids());
  Append(result.top_logprobs, out->mutable_top_logprobs());
  out->set_compute_seconds(result.compute_seconds);
  Append(result.failed_moves, out->mutable_failed_moves());
  out->set_shared_load_seconds(result.shared_load_seconds);
}

void FromProto(const internal::v1::StepResult& result, StepResult* out) {
  out->step = result.step();
  Assign(result.tokens(), &out->tokens);
  Assign(result.logprobs(), &out->logprobs);
  Assign(result.top_token_ids(), &out->top_token_ids);
  Assign(result.top_logprobs(), &out->top_logprobs);
  out->compute_seconds = result.compute_seconds();
  Assign(result.failed_moves(), &out->failed_moves);
  // A number from the network: only ever a metric, kept finite and >= 0.
  const double load = result.shared_load_seconds();
  out->shared_load_seconds = load >= 0 && load < 1e6 ? load : 0;
}

}  // namespace chunkattn
