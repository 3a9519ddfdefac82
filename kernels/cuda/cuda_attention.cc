#include "kernels/cuda/cuda_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/launch.h"

namespace chunkattn::cuda {
namespace {

constexpr float kLog2e = 1.4426950408889634f;

bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// The attention launch's arguments that do not depend on the work.
AttendParams LayerParams(const KvPoolView& kv, const AttentionShape& shape, const void* q, void* o) {
  AttendParams p;
  p.k = kv.k;
  p.v = kv.v;
  p.num_kv_heads = kv.num_kv_heads;
  p.chunk_size = kv.chunk_size;
  p.log2_chunk = Log2ChunkSize(kv.chunk_size);
  p.num_heads = shape.num_heads;
  p.group = shape.group_size();
  p.scale_log2 = shape.EffectiveScale() * kLog2e;
  p.q = q;
  p.o = o;
  return p;
}

template <typename T>
size_t Bytes(const std::vector<T>& v) {
  return v.size() * sizeof(T);
}

}  // namespace

DeviceBuffer::~DeviceBuffer() {
  if (ptr_ != nullptr) cudaFree(ptr_);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (ptr_ != nullptr) cudaFree(ptr_);
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

absl::StatusOr<DeviceBuffer> DeviceBuffer::Allocate(size_t bytes) {
  DeviceBuffer b;
  if (bytes == 0) return b;
  RETURN_IF_ERROR(CudaStatus(cudaMalloc(&b.ptr_, bytes), absl::StrFormat("cudaMalloc of %d bytes", bytes)));
  b.bytes_ = bytes;
  return b;
}

absl::StatusOr<std::unique_ptr<CudaAttention>> CudaAttention::Create(const Options& options) {
  const int n = DeviceCount();
  if (options.device < 0 || options.device >= n) {
    return absl::FailedPreconditionError(
        absl::StrFormat("CUDA device %d requested, %d visible", options.device, n));
  }
  if (options.plan.concurrent_items < 0 || options.plan.min_piece_tokens < 1) {
    return absl::InvalidArgumentError("plan options: concurrent_items must be >= 0 and min_piece_tokens >= 1");
  }
  std::unique_ptr<CudaAttention> a(new CudaAttention(options));
  CUDA_RETURN_IF_ERROR(cudaSetDevice(options.device));
  CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&a->num_sms_, cudaDevAttrMultiProcessorCount, options.device));
  int merge_binary = 0;
  CUDA_RETURN_IF_ERROR(MergeKernelBinaryVersion(&merge_binary));
  a->programmatic_merge_ = merge_binary >= 90;
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&a->staged_, cudaEventDisableTiming));
  ASSIGN_OR_RETURN(a->d_counts_, DeviceBuffer::Allocate(4 * sizeof(int32_t)));
  CUDA_RETURN_IF_ERROR(cudaMemset(a->d_counts_.get(), 0, 4 * sizeof(int32_t)));
  return a;
}

CudaAttention::~CudaAttention() {
  cudaSetDevice(options_.device);
  if (staged_ != nullptr) {
    cudaEventSynchronize(staged_);
    cudaEventDestroy(staged_);
  }
  if (staging_ != nullptr) cudaFreeHost(staging_);
}

absl::Status CudaAttention::Reserve(DeviceBuffer* buf, size_t bytes) {
  if (buf->bytes() >= bytes) return absl::OkStatus();
  const size_t grown = std::max(bytes, buf->bytes() + buf->bytes() / 2);
  *buf = DeviceBuffer();  // cudaFree waits for the kernels that may read it
  ASSIGN_OR_RETURN(*buf, DeviceBuffer::Allocate(grown));
  return absl::OkStatus();
}

absl::Status CudaAttention::ReserveDecodeBuffers(const DecodeWorkBounds& bounds, int num_heads, int head_dim) {
  const size_t partials = static_cast<size_t>(bounds.slots) * num_heads;
  const std::pair<DeviceBuffer*, size_t> wanted[] = {
      {&d_items_, bounds.items * sizeof(WorkItem)},
      {&d_table_chunk_, bounds.table * sizeof(int32_t)},
      {&d_table_tokens_, bounds.table * sizeof(int32_t)},
      {&d_merge_seq_, bounds.merge_seqs * sizeof(int32_t)},
      {&d_merge_begin_, (bounds.merge_seqs + 1) * sizeof(int32_t)},
      {&d_merge_slot_, bounds.merge_slots * sizeof(int32_t)},
      {&d_part_o_, partials * head_dim * sizeof(float)},
      {&d_part_m_, partials * sizeof(float)},
      {&d_part_n_, partials * sizeof(float)},
  };
  bool bumped = false;
  for (const auto& [buf, bytes] : wanted) {
    if (buf->bytes() >= bytes) continue;
    // Graphs holding the old pointers are stale from here, even if the
    // allocation below fails.
    if (!bumped) ++generation_;
    bumped = true;
    RETURN_IF_ERROR(Reserve(buf, bytes));
  }
  return absl::OkStatus();
}

absl::Status CudaAttention::ReserveDecode(DecodeImpl impl, int max_seqs, int max_seq_chunks, DType dtype,
                                          const AttentionShape& shape) {
  if (max_seqs < 1 || max_seq_chunks < 1) {
    return absl::InvalidArgumentError("decode reservation: max_seqs and max_seq_chunks must be >= 1");
  }
  if (!HasAttendKernel(dtype, shape.head_dim) || shape.num_kv_heads < 1 || shape.num_heads % shape.num_kv_heads) {
    return absl::InvalidArgumentError("decode reservation: unsupported shape");
  }
  CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device));
  ASSIGN_OR_RETURN(const int concurrent, ConcurrentItems(dtype, shape.head_dim));
  PlanOptions opt = options_.plan;
  opt.concurrent_items = concurrent;
  return ReserveDecodeBuffers(BoundDecodeWork(impl, max_seqs, max_seq_chunks, shape, opt), shape.num_heads,
                              shape.head_dim);
}

absl::Status CudaAttention::Upload(absl::Span<const Piece> pieces, cudaStream_t stream) {
  size_t total = 0;
  for (const Piece& p : pieces) total += (p.bytes + 15) / 16 * 16;
  if (total == 0) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(cudaEventSynchronize(staged_));  // the last upload has left the staging buffer
  if (staging_bytes_ < total) {
    if (staging_ != nullptr) CUDA_RETURN_IF_ERROR(cudaFreeHost(staging_));
    staging_ = nullptr;
    staging_bytes_ = 0;
    const size_t bytes = std::max<size_t>(total, 64 << 10);
    CUDA_RETURN_IF_ERROR(cudaMallocHost(&staging_, bytes));
    staging_bytes_ = bytes;
  }
  size_t off = 0;
  for (const Piece& p : pieces) {
    if (p.bytes == 0) continue;
    char* const src = static_cast<char*>(staging_) + off;
    std::memcpy(src, p.src, p.bytes);
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(p.dst, src, p.bytes, cudaMemcpyHostToDevice, stream));
    off += (p.bytes + 15) / 16 * 16;
  }
  CUDA_RETURN_IF_ERROR(cudaEventRecord(staged_, stream));
  return absl::OkStatus();
}

absl::Status CudaAttention::CheckPool(const KvPoolView& kv, const AttentionShape& shape) const {
  RETURN_IF_ERROR(ValidateAttentionArgs(kv, shape));
  if (!HasAttendKernel(kv.dtype, kv.head_dim)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the CUDA kernels store KV as fp16 or bf16 with head dim 64 or 128, not %s with %d", DTypeName(kv.dtype),
        kv.head_dim));
  }
  if (!Aligned16(kv.k) || !Aligned16(kv.v)) return absl::InvalidArgumentError("KV pool not 16-byte aligned");
  return absl::OkStatus();
}

absl::StatusOr<int> CudaAttention::ConcurrentItems(DType dtype, int head_dim) {
  int& slot = concurrent_[dtype == DType::kBFloat16][head_dim == 128];
  if (slot == 0) {
    int blocks = 0;
    CUDA_RETURN_IF_ERROR(PrepareAttendKernel(dtype, head_dim, &blocks));
    if (blocks < 1) return absl::InternalError("the attention kernel does not fit on an SM");
    slot = blocks * num_sms_;
  }
  return options_.plan.concurrent_items > 0 ? options_.plan.concurrent_items : slot;
}

absl::Status CudaAttention::Decode(DecodeImpl impl, const ChunkContext& ctx, const KvPoolView& kv,
                                   const AttentionShape& shape, const void* q, void* o, cudaStream_t stream) {
  RETURN_IF_ERROR(PrepareDecode(impl, ctx, kv, shape, stream));
  return LaunchDecode(kv, shape, q, o, stream);
}

absl::Status CudaAttention::PrepareDecode(DecodeImpl impl, const ChunkContext& ctx, const KvPoolView& kv,
                                          const AttentionShape& shape, cudaStream_t stream) {
  CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device));
  RETURN_IF_ERROR(CheckPool(kv, shape));
  if (ctx.chunk_size != kv.chunk_size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "decode: context chunk size %d differs from the pool's %d", ctx.chunk_size, kv.chunk_size));
  }
  ASSIGN_OR_RETURN(const int concurrent, ConcurrentItems(kv.dtype, kv.head_dim));
  const DecodeKey key{impl, shape.num_heads, shape.num_kv_heads, shape.head_dim, kv.dtype, kv.num_chunks, concurrent};
  const bool same_key = decode_ && decode_key_ == key;
  std::vector<Piece> pieces;
  std::optional<DecodeWork> planned;
  int32_t counts[2] = {0, 0};
  if (!same_key || decode_->version != ctx.version) {
    PlanOptions opt = options_.plan;
    opt.concurrent_items = concurrent;
    decode_.reset();  // a failure below leaves no stale plan behind
    ASSIGN_OR_RETURN(DecodeWork work, PlanDecodeWork(impl, ctx, kv.num_chunks, shape, opt));
    DecodeWorkBounds sizes;  // this plan's own
    sizes.items = static_cast<int64_t>(work.items.size());
    sizes.table = static_cast<int64_t>(work.table_chunk.size());
    sizes.merge_seqs = static_cast<int64_t>(work.merge_seq.size());
    sizes.merge_slots = static_cast<int64_t>(work.merge_slot.size());
    sizes.slots = work.num_slots;
    RETURN_IF_ERROR(ReserveDecodeBuffers(sizes, shape.num_heads, shape.head_dim));
    planned = std::move(work);
  }
  const DecodeWork& work = planned ? *planned : *decode_;
  RETURN_IF_ERROR(FillTokens(work, ctx, &tokens_));
  if (planned) {
    counts[0] = static_cast<int32_t>(work.items.size());
    counts[1] = static_cast<int32_t>(work.merge_seq.size());
    pieces = {{work.items.data(), Bytes(work.items), d_items_.get()},
              {work.table_chunk.data(), Bytes(work.table_chunk), d_table_chunk_.get()},
              {work.merge_seq.data(), Bytes(work.merge_seq), d_merge_seq_.get()},
              {work.merge_begin.data(), Bytes(work.merge_begin), d_merge_begin_.get()},
              {work.merge_slot.data(), Bytes(work.merge_slot), d_merge_slot_.get()},
              {counts, sizeof(counts), d_counts_.get()}};
  }
  pieces.push_back({tokens_.data(), Bytes(tokens_), d_table_tokens_.get()});
  RETURN_IF_ERROR(Upload(pieces, stream));
  if (planned) {
    decode_ = std::move(planned);
    decode_key_ = key;
    decode_grid_ = concurrent;
  }
  return absl::OkStatus();
}

absl::Status CudaAttention::LaunchDecode(const KvPoolView& kv, const AttentionShape& shape, const void* q, void* o,
                                         cudaStream_t stream) {
  if (!decode_ || decode_key_.num_heads != shape.num_heads || decode_key_.num_kv_heads != shape.num_kv_heads ||
      decode_key_.head_dim != shape.head_dim || decode_key_.dtype != kv.dtype ||
      decode_key_.num_chunks != kv.num_chunks || kv.chunk_size != decode_->chunk_size) {
    return absl::FailedPreconditionError("decode: PrepareDecode was not called for this shape and pool");
  }
  if (q == nullptr || o == nullptr || !Aligned16(q) || !Aligned16(o)) {
    return absl::InvalidArgumentError("decode: q and o must be non-null and 16-byte aligned");
  }
  CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device));
  AttendParams p = LayerParams(kv, shape, q, o);
  p.items = static_cast<const WorkItem*>(d_items_.get());
  p.num_items = static_cast<const int32_t*>(d_counts_.get());
  p.table_chunk = static_cast<const int32_t*>(d_table_chunk_.get());
  p.table_tokens = static_cast<const int32_t*>(d_table_tokens_.get());
  p.part_o = static_cast<float*>(d_part_o_.get());
  p.part_m = static_cast<float*>(d_part_m_.get());
  p.part_n = static_cast<float*>(d_part_n_.get());
  CUDA_RETURN_IF_ERROR(LaunchAttend(p, kv.dtype, kv.head_dim, decode_grid_, stream));
  MergeParams m;
  m.merge_seq = static_cast<const int32_t*>(d_merge_seq_.get());
  m.merge_begin = static_cast<const int32_t*>(d_merge_begin_.get());
  m.merge_slot = static_cast<const int32_t*>(d_merge_slot_.get());
  m.num_merge = static_cast<const int32_t*>(d_counts_.get()) + 1;
  m.part_o = p.part_o;
  m.part_m = p.part_m;
  m.part_n = p.part_n;
  m.o = o;
  m.num_heads = shape.num_heads;
  m.head_dim = shape.head_dim;
  // Launched even when nothing merges (it reads the count from the device), so
  // a captured graph stays valid for later plans.
  CUDA_RETURN_IF_ERROR(LaunchMerge(m, kv.dtype, 2 * num_sms_, programmatic_merge_, stream));
  return absl::OkStatus();
}

absl::Status CudaAttention::Prefill(const PrefillBatch& batch, const KvPoolView& kv, const AttentionShape& shape,
                                    const void* q, void* o, cudaStream_t stream) {
  RETURN_IF_ERROR(PreparePrefill(batch, kv, shape, stream));
  return LaunchPrefill(kv, shape, q, o, stream);
}

absl::Status CudaAttention::PreparePrefill(const PrefillBatch& batch, const KvPoolView& kv,
                                           const AttentionShape& shape, cudaStream_t stream) {
  prefill_ready_ = false;
  CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device));
  RETURN_IF_ERROR(CheckPool(kv, shape));
  ASSIGN_OR_RETURN(const int concurrent, ConcurrentItems(kv.dtype, kv.head_dim));
  ASSIGN_OR_RETURN(const PrefillWork work, PlanPrefillWork(batch, kv.chunk_size, kv.num_chunks, shape));
  const int32_t count = static_cast<int32_t>(work.items.size());
  if (count > 0) {
    RETURN_IF_ERROR(Reserve(&d_pf_items_, Bytes(work.items)));
    RETURN_IF_ERROR(Reserve(&d_pf_chunk_, Bytes(work.table_chunk)));
    RETURN_IF_ERROR(Reserve(&d_pf_tokens_, Bytes(work.table_tokens)));
    int32_t* const d_count = static_cast<int32_t*>(d_counts_.get()) + 2;
    const Piece pieces[] = {{work.items.data(), Bytes(work.items), d_pf_items_.get()},
                            {work.table_chunk.data(), Bytes(work.table_chunk), d_pf_chunk_.get()},
                            {work.table_tokens.data(), Bytes(work.table_tokens), d_pf_tokens_.get()},
                            {&count, sizeof(count), d_count}};
    RETURN_IF_ERROR(Upload(pieces, stream));
  }
  prefill_key_ = {DecodeImpl::kTpp, shape.num_heads, shape.num_kv_heads, shape.head_dim, kv.dtype, kv.num_chunks, 0};
  prefill_chunk_size_ = kv.chunk_size;
  prefill_grid_ = std::min(count, concurrent);  // 0 for an empty batch
  prefill_ready_ = true;
  return absl::OkStatus();
}

absl::Status CudaAttention::LaunchPrefill(const KvPoolView& kv, const AttentionShape& shape, const void* q, void* o,
                                          cudaStream_t stream) {
  const DecodeKey key{DecodeImpl::kTpp, shape.num_heads, shape.num_kv_heads, shape.head_dim, kv.dtype, kv.num_chunks, 0};
  if (!prefill_ready_ || !(key == prefill_key_) || kv.chunk_size != prefill_chunk_size_) {
    return absl::FailedPreconditionError("prefill: PreparePrefill was not called for this shape and pool");
  }
  if (q == nullptr || o == nullptr || !Aligned16(q) || !Aligned16(o)) {
    return absl::InvalidArgumentError("prefill: q and o must be non-null and 16-byte aligned");
  }
  if (prefill_grid_ == 0) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device));
  AttendParams p = LayerParams(kv, shape, q, o);
  p.items = static_cast<const WorkItem*>(d_pf_items_.get());
  p.num_items = static_cast<const int32_t*>(d_counts_.get()) + 2;
  p.table_chunk = static_cast<const int32_t*>(d_pf_chunk_.get());
  p.table_tokens = static_cast<const int32_t*>(d_pf_tokens_.get());
  CUDA_RETURN_IF_ERROR(LaunchAttend(p, kv.dtype, kv.head_dim, prefill_grid_, stream));
  return absl::OkStatus();
}

absl::Status CudaAttention::AppendKv(const KvPoolView& kv, const void* k, const void* v,
                                     absl::Span<const int64_t> slots, cudaStream_t stream) {
  CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device));
  RETURN_IF_ERROR(CheckPool(kv, {kv.num_kv_heads, kv.num_kv_heads, kv.head_dim, 0}));
  if (slots.empty()) return absl::OkStatus();
  if (k == nullptr || v == nullptr || !Aligned16(k) || !Aligned16(v)) {
    return absl::InvalidArgumentError("append: k and v must be non-null and 16-byte aligned");
  }
  RETURN_IF_ERROR(ValidateSlots(kv, slots));
  if (slots.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return absl::InvalidArgumentError("append: too many tokens");
  }
  RETURN_IF_ERROR(Reserve(&d_slots_, slots.size() * sizeof(int64_t)));
  const Piece piece{slots.data(), slots.size() * sizeof(int64_t), d_slots_.get()};
  RETURN_IF_ERROR(Upload({&piece, 1}, stream));
  AppendParams p;
  p.k = k;
  p.v = v;
  p.slots = static_cast<const int64_t*>(d_slots_.get());
  p.num_tokens = static_cast<int>(slots.size());
  p.pool_k = kv.k;
  p.pool_v = kv.v;
  p.num_kv_heads = kv.num_kv_heads;
  p.chunk_size = kv.chunk_size;
  p.row_bytes = kv.head_dim * DTypeBytes(kv.dtype);
  CUDA_RETURN_IF_ERROR(LaunchAppendKv(p, stream));
  return absl::OkStatus();
}

absl::Status CudaAttention::CopyKv(const KvPoolView& kv, absl::Span<const KvCopy> copies, cudaStream_t stream) {
  CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device));
  RETURN_IF_ERROR(CheckPool(kv, {kv.num_kv_heads, kv.num_kv_heads, kv.head_dim, 0}));
  RETURN_IF_ERROR(ValidateKvCopies(copies, kv.num_chunks, kv.chunk_size));
  const size_t row = static_cast<size_t>(kv.head_dim) * DTypeBytes(kv.dtype);
  const size_t head = row * kv.chunk_size;
  for (const KvCopy& cp : copies) {
    if (cp.src_chunk == cp.dst_chunk || cp.num_tokens == 0) continue;
    for (void* base : {kv.k, kv.v}) {
      char* const p = static_cast<char*>(base);
      // One row per KV head: its first num_tokens slots.
      CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(p + size_t(cp.dst_chunk) * kv.num_kv_heads * head, head,
                                             p + size_t(cp.src_chunk) * kv.num_kv_heads * head, head, cp.num_tokens * row,
                                             kv.num_kv_heads, cudaMemcpyDeviceToDevice, stream));
    }
  }
  return absl::OkStatus();
}

}  // namespace chunkattn::cuda
