#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "kernels/api/attention_state.h"
#include "kernels/cpu/internal/kernels.h"

namespace chunkattn::cpu {
namespace {

using internal::BlockArgs;
using internal::ChunkList;
using internal::IsaKernels;
using internal::KvHead;
using internal::SeqArgs;

const IsaKernels* Kernels(Isa isa, DType dtype) {
  switch (isa) {
    case Isa::kAvx512: return internal::Avx512Kernels(dtype);
    case Isa::kAvx2: return internal::Avx2Kernels(dtype);
    case Isa::kPortable: break;
  }
  return internal::PortableKernels(dtype);
}

#if defined(__x86_64__) || defined(__i386__)
// AVX-512 F, BW, VL and VNNI in CPUID, and the OS saving the opmask and
// all 32 zmm registers (XCR0 bits 5-7 beside SSE and AVX state, 1-2).
bool CpuHasAvx512() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(1, &a, &b, &c, &d) == 0 || (c & bit_OSXSAVE) == 0) return false;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d) == 0) return false;
  const bool isa = (b & bit_AVX512F) != 0 && (b & bit_AVX512BW) != 0 && (b & bit_AVX512VL) != 0 &&
                   (c & bit_AVX512VNNI) != 0;
  unsigned xcr0 = 0, xcr0_high = 0;
  __asm__("xgetbv" : "=a"(xcr0), "=d"(xcr0_high) : "c"(0));
  return isa && (xcr0 & 0xe6) == 0xe6;
}
#endif

KvHead HeadOf(const KvPoolView& kv, int h) {
  KvHead head;
  head.k = kv.k;
  head.v = kv.v;
  head.chunk_stride = kv.ChunkStride();
  head.head_offset = int64_t{h} * kv.chunk_size * kv.head_dim;
  head.chunk_size = kv.chunk_size;
  head.head_dim = kv.head_dim;
  return head;
}

// Rows of one chunk-first or prefill block: enough query rows that the K/V
// of a chunk, converted once, feed a matrix product, few enough that the
// block's scratch stays in L2.
constexpr int kPrefillRows = 64;

absl::Status CheckTokens(const int32_t* tokens, int64_t count, int chunk_size, const char* what) {
  for (int64_t i = 0; i < count; ++i) {
    if (tokens[i] < 1 || tokens[i] > chunk_size) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s entry %d holds %d tokens, outside [1, %d]", what, i, tokens[i], chunk_size));
    }
  }
  return absl::OkStatus();
}

}  // namespace

const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kAvx512: return "avx512";
    case Isa::kAvx2: return "avx2";
    case Isa::kPortable: break;
  }
  return "portable";
}

// The CPU is asked once per process: CPUID traps to the hypervisor on a VM
// (15 us each on the 2-core CI VM), and every kernel call used to ask twice,
// two CPUIDs each: some 2 ms of a 6 ms int8 decode step.
bool IsaSupported(Isa isa) {
  if (isa == Isa::kPortable) return true;
#if defined(__x86_64__) || defined(__i386__)
  static const bool avx2 = internal::Avx2Kernels(DType::kFloat32) != nullptr && __builtin_cpu_supports("avx2") &&
                           __builtin_cpu_supports("fma") && CpuHasF16c();
  static const bool avx512 = avx2 && internal::Avx512Kernels(DType::kFloat32) != nullptr && CpuHasAvx512();
  return isa == Isa::kAvx512 ? avx512 : avx2;
#else
  return false;
#endif
}

bool CpuHasF16c() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool f16c = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0;
  }();
  return f16c;
#else
  return false;
#endif
}

absl::StatusOr<Isa> ParseIsa(absl::string_view name) {
  if (name == "best") return BestIsa();
  for (Isa isa : {Isa::kAvx512, Isa::kAvx2, Isa::kPortable}) {
    if (name != IsaName(isa)) continue;
    if (!IsaSupported(isa)) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "CPU kernels %s: this CPU lacks them (avx2 needs AVX2, FMA and F16C; avx512 those and AVX-512 F, BW, VL "
          "and VNNI)",
          name));
    }
    return isa;
  }
  return absl::InvalidArgumentError(
      absl::StrFormat("CPU kernels '%s': must be best, avx512, avx2 or portable", name));
}

Isa BestIsa() {
  if (IsaSupported(Isa::kAvx512)) return Isa::kAvx512;
  return IsaSupported(Isa::kAvx2) ? Isa::kAvx2 : Isa::kPortable;
}

CpuAttention::CpuAttention(ThreadPool* pool, Isa isa)
    : pool_(pool), isa_(IsaSupported(isa) ? isa : Isa::kPortable),
      scratch_(pool ? pool->num_threads() : 1) {}

void CpuAttention::ReserveScratch(int64_t floats) {
  for (std::vector<float>& s : scratch_) {
    if (static_cast<int64_t>(s.size()) < floats) s.resize(floats);
  }
}

namespace {

void ParallelFor(ThreadPool* pool, int64_t n, const std::function<void(int64_t, int)>& fn) {
  if (pool) {
    pool->ParallelFor(n, fn);
  } else {
    for (int64_t i = 0; i < n; ++i) fn(i, 0);
  }
}

}  // namespace

absl::Status CpuAttention::Decode(DecodeImpl impl, const DecodePlan& plan, const ChunkContext& ctx,
                                  const KvPoolView& kv, const AttentionShape& shape, const float* q,
                                  float* o) {
  RETURN_IF_ERROR(ValidateAttentionArgs(kv, shape));
  if (q == nullptr || o == nullptr) return absl::InvalidArgumentError("decode: null q or o");
  if (ctx.chunk_size != kv.chunk_size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "decode: context chunk size %d differs from the pool's %d", ctx.chunk_size, kv.chunk_size));
  }
  if (plan.version != ctx.version || plan.num_seqs != ctx.num_seqs() || plan.num_shared != ctx.num_shared() ||
      static_cast<size_t>(plan.table_size) != ctx.private_chunk.size() ||
      ctx.shared_tokens.size() != static_cast<size_t>(plan.num_shared) ||
      ctx.private_tokens.size() != ctx.private_chunk.size()) {
    return absl::FailedPreconditionError("decode: the plan was made for another context version");
  }
  const int c = kv.chunk_size;
  RETURN_IF_ERROR(CheckTokens(ctx.shared_tokens.data(), plan.num_shared, c, "shared"));
  for (int s = 0; s < plan.num_seqs; ++s) {
    RETURN_IF_ERROR(CheckTokens(ctx.private_tokens.data() + ctx.private_begin[s],
                                ctx.private_end[s] - ctx.private_begin[s], c, "private"));
  }
  const IsaKernels* kern = Kernels(isa_, kv.dtype);
  const int H = shape.num_heads, kvh = shape.num_kv_heads, g = shape.group_size(), d = shape.head_dim;
  const float scale = shape.EffectiveScale();
  const bool tpp = impl == DecodeImpl::kTpp;
  const int64_t num_runs = static_cast<int64_t>(plan.runs.size());

  if (tpp && num_runs > 0) {
    part_o_.resize(plan.num_slots * H * d);
    part_m_.resize(plan.num_slots * H);
    part_n_.resize(plan.num_slots * H);
    int max_rows = 0;
    for (const DecodePlan::Run& r : plan.runs) max_rows = std::max(max_rows, (r.end - r.begin) * g);
    ReserveScratch(internal::BlockScratchFloats(max_rows, c, d));
    ParallelFor(pool_, num_runs * kvh, [&](int64_t item, int thread) {
      const DecodePlan::Run& run = plan.runs[item / kvh];
      const int h = static_cast<int>(item % kvh);
      BlockArgs a;
      a.kv = HeadOf(kv, h);
      a.list = {ctx.shared_chunk.data() + run.first, ctx.shared_tokens.data() + run.first, run.last - run.first};
      a.row_groups = run.end - run.begin;
      a.group = g;
      a.scale = scale;
      a.q = q + (int64_t{run.begin} * H + h * g) * d;
      a.q_stride = int64_t{H} * d;
      a.o = part_o_.data() + (int64_t{run.slot} * H + h * g) * d;
      a.o_stride = int64_t{H} * d;
      a.m = part_m_.data() + int64_t{run.slot} * H + h * g;
      a.n = part_n_.data() + int64_t{run.slot} * H + h * g;
      a.st_stride = H;
      a.scratch = scratch_[thread].data();
      kern->block(a);
    });
  }

  ReserveScratch(internal::SeqScratchFloats(g, c, d));
  ParallelFor(pool_, int64_t{plan.num_seqs} * kvh, [&](int64_t item, int thread) {
    const int s = static_cast<int>(item / kvh);
    const int h = static_cast<int>(item % kvh);
    float* out = o + (int64_t{s} * H + h * g) * d;
    thread_local std::vector<float> state;  // (m, n) of the group's query heads
    state.resize(2 * g);
    float* mp = state.data();
    float* np = state.data() + g;
    std::fill(out, out + int64_t{g} * d, 0.0f);
    std::fill(mp, mp + g, kEmptyStateMax);
    std::fill(np, np + g, 0.0f);
    thread_local std::vector<ChunkList> lists;
    lists.clear();
    for (int32_t i = plan.seq_run_begin[s]; i < plan.seq_run_begin[s + 1]; ++i) {
      const DecodePlan::Run& run = plan.runs[plan.seq_runs[i]];
      if (tpp) {
        const int64_t slot = run.slot + s - run.begin;
        for (int r = 0; r < g; ++r) {
          const int64_t idx = slot * H + h * g + r;
          MergeState(out + int64_t{r} * d, &mp[r], &np[r], part_o_.data() + idx * d, part_m_[idx], part_n_[idx], d);
        }
      } else {
        lists.push_back({ctx.shared_chunk.data() + run.first, ctx.shared_tokens.data() + run.first,
                         run.last - run.first});
      }
    }
    const int32_t pb = ctx.private_begin[s];
    lists.push_back({ctx.private_chunk.data() + pb, ctx.private_tokens.data() + pb, ctx.private_end[s] - pb});
    SeqArgs a;
    a.kv = HeadOf(kv, h);
    a.lists = lists.data();
    a.num_lists = static_cast<int>(lists.size());
    a.group = g;
    a.scale = scale;
    a.q = q + (int64_t{s} * H + h * g) * d;
    a.o = out;
    a.m = mp;
    a.n = np;
    a.scratch = scratch_[thread].data();
    kern->seq(a);
  });
  return absl::OkStatus();
}

absl::Status CpuAttention::Prefill(const PrefillBatch& batch, const KvPoolView& kv, const AttentionShape& shape,
                                   const float* q, float* o) {
  RETURN_IF_ERROR(ValidateAttentionArgs(kv, shape));
  RETURN_IF_ERROR(ValidatePrefillBatch(batch, kv.chunk_size, kv.num_chunks));
  if (q == nullptr || o == nullptr) return absl::InvalidArgumentError("prefill: null q or o");
  const IsaKernels* kern = Kernels(isa_, kv.dtype);
  const int H = shape.num_heads, kvh = shape.num_kv_heads, g = shape.group_size(), d = shape.head_dim;
  const int c = kv.chunk_size;
  const int tokens_per_block = std::max(1, kPrefillRows / g);

  // Filled slots of every listed chunk, and the (sequence, first token) blocks.
  std::vector<int32_t> tokens(batch.chunk_ids.size(), 0);
  struct Block {
    int32_t seq, t0, count;
  };
  std::vector<Block> blocks;
  for (int s = 0; s < batch.num_seqs(); ++s) {
    const int32_t new_tokens = batch.q_begin[s + 1] - batch.q_begin[s];
    const int64_t len = int64_t{batch.prefix_len[s]} + new_tokens;
    for (int32_t e = batch.chunk_begin[s]; e < batch.chunk_begin[s + 1]; ++e) {
      const int64_t left = len - int64_t{e - batch.chunk_begin[s]} * c;
      tokens[e] = static_cast<int32_t>(std::clamp<int64_t>(left, 0, c));
    }
    for (int32_t t0 = 0; t0 < new_tokens; t0 += tokens_per_block) {
      blocks.push_back({s, t0, std::min(tokens_per_block, new_tokens - t0)});
    }
  }
  ReserveScratch(internal::BlockScratchFloats(tokens_per_block * g, c, d));
  const float scale = shape.EffectiveScale();
  ParallelFor(pool_, static_cast<int64_t>(blocks.size()) * kvh, [&](int64_t item, int thread) {
    const Block& b = blocks[item / kvh];
    const int h = static_cast<int>(item % kvh);
    const int64_t row0 = batch.q_begin[b.seq] + b.t0;
    const int64_t last_pos = int64_t{batch.prefix_len[b.seq]} + b.t0 + b.count - 1;
    BlockArgs a;
    a.kv = HeadOf(kv, h);
    a.list = {batch.chunk_ids.data() + batch.chunk_begin[b.seq], tokens.data() + batch.chunk_begin[b.seq],
              static_cast<int>(last_pos / c + 1)};
    a.row_groups = b.count;
    a.group = g;
    a.scale = scale;
    a.q = q + (row0 * H + h * g) * d;
    a.q_stride = int64_t{H} * d;
    a.causal = true;
    a.q_pos0 = batch.prefix_len[b.seq] + b.t0;
    a.normalize = true;
    a.o = o + (row0 * H + h * g) * d;
    a.o_stride = int64_t{H} * d;
    a.scratch = scratch_[thread].data();
    kern->block(a);
  });
  return absl::OkStatus();
}

namespace {

absl::Status ValidatePool(const KvPoolView& kv) {
  AttentionShape shape;
  shape.num_heads = kv.num_kv_heads;
  shape.num_kv_heads = kv.num_kv_heads;
  shape.head_dim = kv.head_dim;
  return ValidateAttentionArgs(kv, shape);
}

}  // namespace

absl::Status AppendKv(const KvPoolView& kv, const float* k, const float* v, absl::Span<const int64_t> slots) {
  RETURN_IF_ERROR(ValidatePool(kv));
  if (!slots.empty() && (k == nullptr || v == nullptr)) return absl::InvalidArgumentError("append: null k or v");
  RETURN_IF_ERROR(ValidateSlots(kv, slots));
  const int d = kv.head_dim;
  for (size_t i = 0; i < slots.size(); ++i) {
    const int64_t chunk = slots[i] / kv.chunk_size;
    const int64_t pos = slots[i] % kv.chunk_size;
    for (int h = 0; h < kv.num_kv_heads; ++h) {
      const int64_t dst = ((chunk * kv.num_kv_heads + h) * kv.chunk_size + pos) * d;
      const int64_t src = (static_cast<int64_t>(i) * kv.num_kv_heads + h) * d;
      for (int x = 0; x < d; ++x) {
        StoreAs(kv.dtype, kv.k, dst + x, k[src + x]);
        StoreAs(kv.dtype, kv.v, dst + x, v[src + x]);
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CopyKv(const KvPoolView& kv, absl::Span<const KvCopy> copies) {
  RETURN_IF_ERROR(ValidatePool(kv));
  RETURN_IF_ERROR(ValidateKvCopies(copies, kv.num_chunks, kv.chunk_size));
  const int64_t bytes = DTypeBytes(kv.dtype);
  const int64_t head = int64_t{kv.chunk_size} * kv.head_dim * bytes;
  for (const KvCopy& cp : copies) {
    if (cp.src_chunk == cp.dst_chunk) continue;
    for (void* base : {kv.k, kv.v}) {
      auto* p = static_cast<uint8_t*>(base);
      for (int h = 0; h < kv.num_kv_heads; ++h) {
        std::memcpy(p + (cp.dst_chunk * int64_t{kv.num_kv_heads} + h) * head,
                    p + (cp.src_chunk * int64_t{kv.num_kv_heads} + h) * head, cp.num_tokens * kv.head_dim * bytes);
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<DenseKv> GatherDense(const ChunkContext& ctx, const KvPoolView& kv) {
  RETURN_IF_ERROR(ValidatePool(kv));
  RETURN_IF_ERROR(ValidateChunkContext(ctx, kv.num_chunks));
  DenseKv dense;
  dense.dtype = kv.dtype;
  dense.num_kv_heads = kv.num_kv_heads;
  dense.head_dim = kv.head_dim;
  dense.len = ctx.seq_len;
  for (int32_t l : ctx.seq_len) dense.max_len = std::max<int64_t>(dense.max_len, l);
  const int64_t bytes = DTypeBytes(kv.dtype);
  const int64_t row = kv.head_dim * bytes;
  const int64_t size = int64_t{ctx.num_seqs()} * kv.num_kv_heads * dense.max_len * row;
  dense.k.assign(size, 0);
  dense.v.assign(size, 0);
  const int64_t head = int64_t{kv.chunk_size} * row;
  for (int s = 0; s < ctx.num_seqs(); ++s) {
    const std::vector<int32_t> chunks = SequenceChunks(ctx, s);
    for (size_t e = 0; e < chunks.size(); ++e) {
      const int64_t first = static_cast<int64_t>(e) * kv.chunk_size;
      const int64_t t = std::min<int64_t>(kv.chunk_size, ctx.seq_len[s] - first);
      for (int h = 0; h < kv.num_kv_heads; ++h) {
        const int64_t src = (chunks[e] * int64_t{kv.num_kv_heads} + h) * head;
        const int64_t dst = ((int64_t{s} * kv.num_kv_heads + h) * dense.max_len + first) * row;
        std::memcpy(dense.k.data() + dst, static_cast<const uint8_t*>(kv.k) + src, t * row);
        std::memcpy(dense.v.data() + dst, static_cast<const uint8_t*>(kv.v) + src, t * row);
      }
    }
  }
  return dense;
}

absl::Status NaiveDecode(const DenseKv& kv, const AttentionShape& shape, const float* q, float* o,
                         ThreadPool* pool, Isa isa) {
  if (shape.num_kv_heads != kv.num_kv_heads || shape.head_dim != kv.head_dim || shape.num_kv_heads <= 0 ||
      shape.num_heads % shape.num_kv_heads != 0 || kv.head_dim % 16 != 0 || kv.head_dim > kMaxHeadDim) {
    return absl::InvalidArgumentError("naive decode: shape does not match the dense KV");
  }
  if (q == nullptr || o == nullptr) return absl::InvalidArgumentError("naive decode: null q or o");
  const int64_t expect = static_cast<int64_t>(kv.len.size()) * kv.num_kv_heads * kv.max_len * kv.head_dim *
                         DTypeBytes(kv.dtype);
  if (static_cast<int64_t>(kv.k.size()) != expect || static_cast<int64_t>(kv.v.size()) != expect) {
    return absl::InvalidArgumentError("naive decode: dense K/V size does not match its shape");
  }
  for (int32_t l : kv.len) {
    if (l < 1 || l > kv.max_len) return absl::InvalidArgumentError("naive decode: bad sequence length");
  }
  const IsaKernels* kern = Kernels(IsaSupported(isa) ? isa : Isa::kPortable, kv.dtype);
  const int H = shape.num_heads, kvh = shape.num_kv_heads, g = shape.group_size(), d = shape.head_dim;
  const int64_t row = int64_t{d} * DTypeBytes(kv.dtype);
  const int64_t stride = internal::RoundUp8(kv.max_len) + 8;  // ExpInPlace pads rows to 8
  std::vector<float> scores(static_cast<size_t>(kv.len.size()) * H * stride);
  const float scale = shape.EffectiveScale();
  auto args = [&](int64_t item) {
    const int64_t s = item / kvh;
    const int h = static_cast<int>(item % kvh);
    internal::NaiveArgs a;
    a.k = kv.k.data() + (s * kvh + h) * kv.max_len * row;
    a.v = kv.v.data() + (s * kvh + h) * kv.max_len * row;
    a.len = kv.len[s];
    a.head_dim = d;
    a.group = g;
    a.scale = scale;
    a.q = q + (s * H + h * g) * d;
    a.scores = scores.data() + (s * H + h * g) * stride;
    a.score_stride = stride;
    a.o = o + (s * H + h * g) * d;
    return a;
  };
  const int64_t items = static_cast<int64_t>(kv.len.size()) * kvh;
  ParallelFor(pool, items, [&](int64_t item, int) { kern->naive_scores(args(item)); });
  ParallelFor(pool, items, [&](int64_t item, int) { kern->naive_softmax(args(item)); });
  ParallelFor(pool, items, [&](int64_t item, int) { kern->naive_pv(args(item)); });
  return absl::OkStatus();
}

absl::Status LinearRows(const float* a, int64_t rows, int64_t k, const void* w, DType w_dtype, int64_t n,
                        float* c, ThreadPool* pool, Isa isa) {
  WeightView view;
  view.data = w;
  view.dtype = w_dtype;
  return LinearRows(a, rows, k, view, n, c, pool, isa);
}

absl::Status LinearRows(const float* a, int64_t rows, int64_t k, const WeightView& w, int64_t n, float* c,
                        ThreadPool* pool, Isa isa) {
  if (rows < 0 || n < 0 || k <= 0 || k % 8 != 0 || rows > std::numeric_limits<int>::max()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("LinearRows: %d rows, k %d (a positive multiple of 8), n %d", rows, k, n));
  }
  const bool q8 = w.scales != nullptr;
  if (q8 && (w.block <= 0 || w.block % 8 != 0 || k % w.block != 0)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "LinearRows: int8 block %d must be a positive multiple of 8 that divides k %d", w.block, k));
  }
  if (w.interleaved && !(q8 && Int8Interleaves(n, k, w.block))) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "LinearRows: interleaved weights must be int8 with block 32, k a multiple of %d and n of %d (n %d, k %d, "
        "block %d)",
        kInt8InterleavedSpan, kInt8GroupRows, n, k, w.block));
  }
  if (w.packed && (q8 || !Packs(n, k))) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "LinearRows: packed weights must be fp32, fp16 or bf16 with n %% 4 == 0 and k %% 8 == 0 (n %d, k %d)", n, k));
  }
  if (rows == 0 || n == 0) return absl::OkStatus();
  const IsaKernels* kern = Kernels(IsaSupported(isa) ? isa : Isa::kPortable, w.dtype);
  const auto linear = q8 ? kern->linear_q8 : kern->linear;
  internal::LinearArgs args;
  args.a = a;
  args.a_stride = k;
  args.rows = static_cast<int>(rows);
  args.w = w.data;
  args.k = k;
  args.c = c;
  args.c_stride = n;
  args.scales = w.scales;
  args.block = w.block;
  args.packed = w.packed;
  if (q8 && w.block % 32 == 0) {
    // Int8 weights dot int16 activations in integers (LinearArgs::aq): 2x
    // fewer instructions a weight than widening each weight to fp32, which
    // left decode compute-bound. Quantized once here for every column block.
    thread_local std::vector<int16_t> aq;
    thread_local std::vector<float> aq_scales;
    aq.resize(static_cast<size_t>(rows * k));
    aq_scales.resize(static_cast<size_t>(rows * (k / 32)));
    const auto quantize = w.interleaved ? kern->quantize16_interleaved : kern->quantize16;
    for (int64_t r = 0; r < rows; ++r) quantize(a + r * k, k, aq.data() + r * k, aq_scales.data() + r * (k / 32));
    args.aq = aq.data();
    args.aq_scales = aq_scales.data();
    args.interleaved = w.interleaved;
  }
  // Under 512 columns run on this thread, cheaper than waking the pool.
  if (pool == nullptr || pool->num_threads() == 1 || n < 512) {
    args.j0 = 0;
    args.j1 = n;
    linear(args);
    return absl::OkStatus();
  }
  // Each thread first takes one long run of weight rows (half the matrix on 2
  // threads), then ever smaller pieces (ShrinkingPieces; multiples of the
  // kernels' 4 rows): one stream per thread with no jumps, where blocks of
  // 128 rows handed out in turn left each thread's reads hopping. One row on
  // the 156M model, 2 threads: 0.82-0.87x the step time with int8 and bf16
  // weights, 0.95x fp32; 4 to 64 rows, compute-bound, level.
  const std::vector<int64_t> bounds = ShrinkingPieces(n, pool->num_threads(), 32, 4);
  pool->ParallelFor(static_cast<int64_t>(bounds.size()) - 1, [&](int64_t piece, int) {
    internal::LinearArgs part = args;
    part.j0 = bounds[piece];
    part.j1 = bounds[piece + 1];
    linear(part);
  });
  return absl::OkStatus();
}

absl::Status WeightRowsToFloat(const WeightView& w, int64_t k, int64_t j0, int64_t j1, float* out, ThreadPool* pool,
                               Isa isa) {
  const bool q8 = w.scales != nullptr;
  if (k <= 0 || j0 < 0 || j1 < j0 || (q8 && (w.block <= 0 || k % w.block != 0))) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "WeightRowsToFloat: rows [%d, %d), k %d, int8 block %d (must divide k)", j0, j1, k, w.block));
  }
  // The matrix's row count is not known here; the layout needs it to be a
  // multiple of 4, which the caller's LinearRows checks.
  if (w.interleaved && !(q8 && Int8Interleaves(kInt8GroupRows, k, w.block))) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "WeightRowsToFloat: interleaved weights must be int8 with block 32 and k a multiple of %d (k %d, block %d)",
        kInt8InterleavedSpan, k, w.block));
  }
  if (w.packed && (q8 || k % kPackCols != 0)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("WeightRowsToFloat: packed weights must be fp32, fp16 or bf16 with k %% 8 == 0 (k %d)", k));
  }
  if (j1 == j0) return absl::OkStatus();
  const IsaKernels* kern = Kernels(IsaSupported(isa) ? isa : Isa::kPortable, w.dtype);
  const auto convert = q8 ? kern->weight_rows_q8 : kern->weight_rows;
  internal::WeightRowsArgs args;
  args.w = w.data;
  args.scales = w.scales;
  args.block = w.block;
  args.interleaved = w.interleaved;
  args.packed = w.packed;
  args.k = k;
  args.out = out;
  // Pieces of about 64K values: a pool wake-up costs about what converting
  // 10K of them does.
  const int64_t per = std::max<int64_t>(1, (int64_t{1} << 16) / k);
  const int64_t pieces = (j1 - j0 + per - 1) / per;
  auto run = [&](int64_t piece, int) {
    internal::WeightRowsArgs part = args;
    part.j0 = j0 + piece * per;
    part.j1 = std::min(j1, part.j0 + per);
    part.out = out + (part.j0 - j0) * k;
    convert(part);
  };
  if (pool == nullptr || pool->num_threads() == 1 || pieces < 2) {
    for (int64_t p = 0; p < pieces; ++p) run(p, 0);
  } else {
    pool->ParallelFor(pieces, run);
  }
  return absl::OkStatus();
}

}  // namespace chunkattn::cpu
