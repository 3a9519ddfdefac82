#include "workers/model/cuda_llama.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <numeric>
#include <set>
#include <thread>
#include <utility>

#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "kernels/cuda/cuda_attention.h"
#include "kernels/cuda/layers.h"
#include "workers/collectives/nccl_communicator.h"
#include "workers/model/llama.h"

namespace chunkattn {
namespace {

using cuda::CudaStatus;
using cuda::DeviceBuffer;

#define CUBLAS_RETURN_IF_ERROR(expr) RETURN_IF_ERROR(CublasStatus((expr), #expr))

absl::Status CublasStatus(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  if (s == CUBLAS_STATUS_ALLOC_FAILED) {
    return absl::ResourceExhaustedError(absl::StrFormat("%s: out of device memory", what));
  }
  return absl::InternalError(absl::StrFormat("%s: %s", what, cublasGetStatusString(s)));
}

cudaDataType_t CudaType(DType t) { return t == DType::kBFloat16 ? CUDA_R_16BF : CUDA_R_16F; }

// Page-locked host memory, freed on destruction.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer() {
    if (ptr_ != nullptr) cudaFreeHost(ptr_);
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  // Replaces any earlier allocation.
  absl::Status Allocate(size_t bytes) {
    if (ptr_ != nullptr) cudaFreeHost(ptr_);
    ptr_ = nullptr;
    CUDA_RETURN_IF_ERROR(cudaMallocHost(&ptr_, bytes));
    return absl::OkStatus();
  }
  void* get() const { return ptr_; }

 private:
  void* ptr_ = nullptr;
};

// Converts fp32 host values to 16-bit `dtype` over a few threads.
void ConvertTo16(const std::vector<float>& src, DType dtype, std::vector<uint16_t>& dst) {
  dst.resize(src.size());
  const size_t n = src.size();
  const size_t threads = std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 16);
  const size_t per = (n + threads - 1) / threads;
  auto convert = [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      dst[i] = dtype == DType::kBFloat16 ? FloatToBFloat16(src[i]) : FloatToHalf(src[i]);
    }
  };
  if (n < (size_t{1} << 20)) {
    convert(0, n);
    return;
  }
  std::vector<std::thread> pool;
  for (size_t t = 0; t < threads; ++t) {
    pool.emplace_back(convert, std::min(n, t * per), std::min(n, (t + 1) * per));
  }
  for (auto& t : pool) t.join();
}

// Uploads `src` as 16-bit `dtype` and releases the host copy: as stored when
// it is held in `dtype`, else converted (a 16-bit value through fp32 is exact,
// so the device gets the same bits as from an fp32 copy). Not int8 (Create
// refuses it).
absl::StatusOr<DeviceBuffer> Upload16(WeightMatrix& src, DType dtype, std::vector<uint16_t>& scratch) {
  const WeightDType same = dtype == DType::kFloat16 ? WeightDType::kFloat16 : WeightDType::kBFloat16;
  const std::vector<uint16_t>* bits = &scratch;
  if (src.dtype == same) {
    bits = &src.half;
  } else if (src.dtype == WeightDType::kFloat32) {
    ConvertTo16(src.f32, dtype, scratch);
  } else {
    ConvertTo16(src.ToFloat(), dtype, scratch);
  }
  ASSIGN_OR_RETURN(DeviceBuffer b, DeviceBuffer::Allocate(bits->size() * sizeof(uint16_t)));
  CUDA_RETURN_IF_ERROR(cudaMemcpy(b.get(), bits->data(), bits->size() * sizeof(uint16_t), cudaMemcpyHostToDevice));
  src = WeightMatrix();
  return b;
}

absl::StatusOr<DeviceBuffer> UploadF32(const void* src, size_t bytes) {
  ASSIGN_OR_RETURN(DeviceBuffer b, DeviceBuffer::Allocate(bytes));
  CUDA_RETURN_IF_ERROR(cudaMemcpy(b.get(), src, bytes, cudaMemcpyHostToDevice));
  return b;
}

// Bytes of `n` elements rounded up to 256 (every workspace array starts aligned).
size_t Aligned(size_t bytes) { return (bytes + 255) / 256 * 256; }

// A device array and its pinned staging copy, grown on demand. Grown only
// between steps (the stream is idle then) and never read by a graph.
struct Staged {
  DeviceBuffer dev;
  PinnedBuffer host;
  size_t capacity = 0;

  absl::Status Reserve(size_t bytes) {
    if (bytes <= capacity) return absl::OkStatus();
    const size_t want = Aligned(std::max(bytes, 2 * capacity));
    ASSIGN_OR_RETURN(dev, DeviceBuffer::Allocate(want));
    RETURN_IF_ERROR(host.Allocate(want));
    capacity = want;
    return absl::OkStatus();
  }
  // Reserves `bytes` and copies them from `src` through the pinned copy.
  absl::Status Upload(const void* src, size_t bytes, cudaStream_t stream) {
    if (bytes == 0) return absl::OkStatus();
    RETURN_IF_ERROR(Reserve(bytes));
    std::memcpy(host.get(), src, bytes);
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dev.get(), host.get(), bytes, cudaMemcpyHostToDevice, stream));
    return absl::OkStatus();
  }
};

}  // namespace

struct CudaLlamaModel::Impl {
  struct Layer {
    DeviceBuffer input_norm, qkv, qkv_bias, q_norm, k_norm, o, post_norm, gate_up, down;
  };
  struct Graph {
    cudaGraphExec_t exec = nullptr;
    uint64_t attention_generation = 0;
  };

  int device = 0;
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  std::unique_ptr<cuda::CudaAttention> attention;

  std::vector<Layer> layers;
  DeviceBuffer embed, lm_head, final_norm, rope_cos, rope_sin;
  DeviceBuffer k_pool, v_pool;
  int64_t layer_elements = 0;  // of K (or V) per layer
  KvPoolView pool_view;        // the pool's geometry

  // Workspace for max_rows rows (logits for logits_block rows).
  int64_t max_rows = 0, logits_block = 0;
  DeviceBuffer inputs;  // tokens, positions, gather (i32) and slots (i64)
  DeviceBuffer x, delta, h, qkv, q, attn, gate_up, act, logits, picks, cublas_workspace;
  PinnedBuffer host_inputs, host_picks;
  // ForwardSample: the packed samples, their histories, their token masks,
  // and their picks (tokens, then logprobs, for the step's samples).
  Staged sample_params, sample_history, sample_masks, sample_picks;

  std::map<int, Graph> graphs;  // by bucket
  std::set<int> warmed;         // buckets run eagerly once (before their capture)

  // Layer l's K and V: pool_view with k/v of layer 0, offset.
  KvPoolView View(int l) const {
    const size_t layer_bytes = static_cast<size_t>(layer_elements) * DTypeBytes(pool_view.dtype);
    KvPoolView v = pool_view;
    v.k = static_cast<char*>(k_pool.get()) + l * layer_bytes;
    v.v = static_cast<char*>(v_pool.get()) + l * layer_bytes;
    return v;
  }

  // The step's inputs, laid out alike in the pinned staging buffer and on
  // the device (6 * max_rows int32s): tokens, positions, gather, then slots
  // (int64, 8-byte aligned).
  struct Inputs {
    int32_t* tokens;
    int32_t* positions;
    int32_t* gather;
    int64_t* slots;
  };
  Inputs InputsAt(void* base) const {
    int32_t* const i32 = static_cast<int32_t*>(base);
    return {i32, i32 + max_rows, i32 + 2 * max_rows, reinterpret_cast<int64_t*>(i32 + 4 * max_rows)};
  }
  // Greedy picks, alike on the device and in the pinned buffer (8 * max_rows bytes).
  struct Picks {
    int32_t* tokens;
    float* logprobs;
  };
  Picks PicksAt(void* base) const {
    int32_t* const i32 = static_cast<int32_t*>(base);
    return {i32, reinterpret_cast<float*>(i32 + max_rows)};
  }

  void DropGraphs() {
    for (auto& [bucket, g] : graphs) cudaGraphExecDestroy(g.exec);
    graphs.clear();
  }

  ~Impl() {
    cudaSetDevice(device);
    if (stream != nullptr) cudaStreamSynchronize(stream);
    DropGraphs();
    attention.reset();
    if (cublas != nullptr) cublasDestroy(cublas);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
};

CudaLlamaModel::CudaLlamaModel(const ModelConfig& config, const ModelOptions& options,
                               const CudaModelOptions& cuda, NcclCommunicator* comm)
    : config_(config), options_(options), cuda_(cuda), comm_(comm), impl_(std::make_unique<Impl>()) {}

CudaLlamaModel::~CudaLlamaModel() {
  // A step left in flight may wait on a dead peer: the communicator's wait
  // is bounded and aborts the group, where Impl's plain sync would hang.
  if (comm_ != nullptr && comm_->world_size() > 1 && !comm_->broken()) (void)comm_->Wait(impl_->stream);
}

std::string CudaLlamaModel::device() const { return absl::StrFormat("cuda:%d", cuda_.device); }

int CudaLlamaModel::num_graphs() const { return static_cast<int>(impl_->graphs.size()); }

absl::StatusOr<std::unique_ptr<CudaLlamaModel>> CudaLlamaModel::Create(const ModelConfig& config,
                                                                       ModelWeights weights,
                                                                       const ModelOptions& options,
                                                                       const CudaModelOptions& cuda,
                                                                       NcclCommunicator* comm) {
  if (options.kv_dtype != DType::kFloat16 && options.kv_dtype != DType::kBFloat16) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the GPU model runs float16 or bfloat16, not %s", DTypeName(options.kv_dtype)));
  }
  if (config.head_dim != 64 && config.head_dim != 128) {
    return absl::UnimplementedError(
        absl::StrFormat("head_dim %d: the CUDA kernels are built for 64 and 128", config.head_dim));
  }
  if (!IsValidChunkSize(options.chunk_size)) {
    return absl::InvalidArgumentError(absl::StrFormat("chunk size %d", options.chunk_size));
  }
  if (cuda.max_rows < 1 || cuda.max_rows > (int64_t{1} << 20) || cuda.max_graph_batch < 0 || cuda.max_batch < 1) {
    return absl::InvalidArgumentError("max_rows must be in [1, 2^20], max_batch >= 1 and max_graph_batch >= 0");
  }
  const ShardLayout& l = weights.layout;
  RETURN_IF_ERROR(CheckShardMatchesGroup(l, comm == nullptr ? 0 : comm->rank(),
                                         comm == nullptr ? 1 : comm->world_size()));
  const int64_t hidden = config.hidden_size, d = config.head_dim;
  const int64_t q_width = int64_t{l.num_heads} * d, kv_width = int64_t{l.num_kv_heads} * d;
  const int64_t qkv_width = q_width + 2 * kv_width;
  if (hidden % 8 != 0 || hidden > cuda::kMaxNormHidden) {
    return absl::UnimplementedError(absl::StrFormat(
        "hidden size %d: the GPU kernels need a multiple of 8 up to %d", hidden, cuda::kMaxNormHidden));
  }
  const int64_t inter = l.intermediate;
  auto sized = [](const std::vector<float>& v, int64_t n) { return static_cast<int64_t>(v.size()) == n; };
  bool int8 = false;
  auto shaped = [&int8](const WeightMatrix& m, int64_t rows, int64_t cols) {
    int8 = int8 || m.dtype == WeightDType::kInt8;
    return m.rows == rows && m.cols == cols && m.bytes() > 0;
  };
  bool match = static_cast<int>(weights.layers.size()) == config.num_layers &&
               shaped(weights.embed, config.vocab_size, hidden) && sized(weights.final_norm, hidden) &&
               (weights.lm_head.empty() || shaped(weights.lm_head, config.vocab_size, hidden));
  for (size_t i = 0; match && i < weights.layers.size(); ++i) {
    const LayerWeights& w = weights.layers[i];
    match = sized(w.input_norm, hidden) && sized(w.post_norm, hidden) && shaped(w.qkv, qkv_width, hidden) &&
            (w.qkv_bias.empty() || sized(w.qkv_bias, qkv_width)) && sized(w.q_norm, config.qk_norm ? d : 0) &&
            sized(w.k_norm, config.qk_norm ? d : 0) && shaped(w.o, hidden, q_width) &&
            shaped(w.gate_up, 2 * inter, hidden) && shaped(w.down, hidden, inter);
  }
  if (!match) return absl::InvalidArgumentError("weights do not match the config");
  if (int8) {
    return absl::UnimplementedError("int8 weights run on the CPU only: load float16, bfloat16 or float32 for a GPU");
  }

  std::unique_ptr<CudaLlamaModel> m(new CudaLlamaModel(config, options, cuda, comm));
  m->layout_ = l;
  Impl& im = *m->impl_;
  im.device = cuda.device;
  cuda::CudaAttention::Options ao;
  ao.device = cuda.device;
  ASSIGN_OR_RETURN(im.attention, cuda::CudaAttention::Create(ao));  // checks the device exists
  {
    const AttentionShape shape{l.num_heads, l.num_kv_heads, config.head_dim, 0};
    const int max_seqs = static_cast<int>(std::min<int64_t>(cuda.max_rows, cuda.max_batch));
    const int64_t max_seq_chunks = (config.max_context + options.chunk_size - 1) / options.chunk_size;
    RETURN_IF_ERROR(im.attention->ReserveDecode(options.decode_impl, max_seqs, static_cast<int>(max_seq_chunks),
                                                options.kv_dtype, shape));
  }
  CUDA_RETURN_IF_ERROR(cudaSetDevice(cuda.device));
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&im.stream, cudaStreamNonBlocking));
  CUBLAS_RETURN_IF_ERROR(cublasCreate(&im.cublas));
  CUBLAS_RETURN_IF_ERROR(cublasSetStream(im.cublas, im.stream));
  // A workspace of our own keeps cuBLAS from allocating inside graph capture.
  ASSIGN_OR_RETURN(im.cublas_workspace, DeviceBuffer::Allocate(size_t{32} << 20));
  CUBLAS_RETURN_IF_ERROR(
      cublasSetWorkspace(im.cublas, im.cublas_workspace.get(), im.cublas_workspace.bytes()));

  // Weights: matrices in 16 bits, norms and biases in fp32 (what the kernels read).
  const DType t = options.kv_dtype;
  std::vector<uint16_t> scratch;
  ASSIGN_OR_RETURN(im.embed, Upload16(weights.embed, t, scratch));
  if (!weights.lm_head.empty()) {
    ASSIGN_OR_RETURN(im.lm_head, Upload16(weights.lm_head, t, scratch));
  }
  ASSIGN_OR_RETURN(im.final_norm, UploadF32(weights.final_norm.data(), weights.final_norm.size() * 4));
  im.layers.resize(config.num_layers);
  for (int i = 0; i < config.num_layers; ++i) {
    LayerWeights& w = weights.layers[i];
    Impl::Layer& dl = im.layers[i];
    ASSIGN_OR_RETURN(dl.input_norm, UploadF32(w.input_norm.data(), w.input_norm.size() * 4));
    ASSIGN_OR_RETURN(dl.post_norm, UploadF32(w.post_norm.data(), w.post_norm.size() * 4));
    if (!w.qkv_bias.empty()) {
      ASSIGN_OR_RETURN(dl.qkv_bias, UploadF32(w.qkv_bias.data(), w.qkv_bias.size() * 4));
    }
    if (config.qk_norm) {
      ASSIGN_OR_RETURN(dl.q_norm, UploadF32(w.q_norm.data(), w.q_norm.size() * 4));
      ASSIGN_OR_RETURN(dl.k_norm, UploadF32(w.k_norm.data(), w.k_norm.size() * 4));
    }
    ASSIGN_OR_RETURN(dl.qkv, Upload16(w.qkv, t, scratch));
    ASSIGN_OR_RETURN(dl.o, Upload16(w.o, t, scratch));
    ASSIGN_OR_RETURN(dl.gate_up, Upload16(w.gate_up, t, scratch));
    ASSIGN_OR_RETURN(dl.down, Upload16(w.down, t, scratch));
    w = LayerWeights();
  }

  // Rotary tables for every position, computed as the CPU model does.
  const std::vector<float> inv_freq = RopeInverseFrequencies(config);
  const int half = config.head_dim / 2;
  std::vector<float> cos(static_cast<size_t>(config.max_context) * half), sin(cos.size());
  cuda::FillRopeTables(inv_freq.data(), half, static_cast<int>(config.max_context), cos.data(), sin.data());
  ASSIGN_OR_RETURN(im.rope_cos, UploadF32(cos.data(), cos.size() * 4));
  ASSIGN_OR_RETURN(im.rope_sin, UploadF32(sin.data(), sin.size() * 4));

  // Workspace.
  const int64_t r = cuda.max_rows;
  const size_t e16 = 2;
  im.max_rows = r;
  im.logits_block = std::min<int64_t>(std::max<int64_t>(cuda.max_graph_batch, 16), r);
  ASSIGN_OR_RETURN(im.inputs, DeviceBuffer::Allocate(Aligned(r * 6 * sizeof(int32_t))));
  ASSIGN_OR_RETURN(im.x, DeviceBuffer::Allocate(Aligned(r * hidden * 4)));
  ASSIGN_OR_RETURN(im.delta, DeviceBuffer::Allocate(Aligned(r * hidden * 4)));
  ASSIGN_OR_RETURN(im.h, DeviceBuffer::Allocate(Aligned(r * hidden * e16)));
  ASSIGN_OR_RETURN(im.qkv, DeviceBuffer::Allocate(Aligned(r * qkv_width * 4)));
  ASSIGN_OR_RETURN(im.q, DeviceBuffer::Allocate(Aligned(r * q_width * e16)));
  ASSIGN_OR_RETURN(im.attn, DeviceBuffer::Allocate(Aligned(r * q_width * e16)));
  ASSIGN_OR_RETURN(im.gate_up, DeviceBuffer::Allocate(Aligned(r * 2 * inter * e16)));
  ASSIGN_OR_RETURN(im.act, DeviceBuffer::Allocate(Aligned(r * inter * e16)));
  ASSIGN_OR_RETURN(im.logits, DeviceBuffer::Allocate(Aligned(im.logits_block * config.vocab_size * 4)));
  ASSIGN_OR_RETURN(im.picks, DeviceBuffer::Allocate(Aligned(r * 8)));
  // Padding rows of a graph bucket read whatever is here: make it finite.
  for (DeviceBuffer* b : {&im.x, &im.delta, &im.h, &im.qkv, &im.q, &im.attn, &im.gate_up, &im.act}) {
    CUDA_RETURN_IF_ERROR(cudaMemset(b->get(), 0, b->bytes()));
  }
  RETURN_IF_ERROR(im.host_inputs.Allocate(r * 6 * sizeof(int32_t)));
  RETURN_IF_ERROR(im.host_picks.Allocate(r * 8));

  if (comm != nullptr && comm->world_size() > 1) {
    // Connect the group now, so its buffers exist before KvCapacity measures
    // what is free and before any graph capture.
    RETURN_IF_ERROR(comm->AllReduceSum(static_cast<float*>(im.delta.get()), hidden, im.stream));
    RETURN_IF_ERROR(comm->Wait(im.stream));
  }
  // The uploads and memsets above ran on the legacy stream, which our
  // non-blocking stream does not wait for.
  CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  if (options.num_kv_chunks > 0) RETURN_IF_ERROR(m->AllocateKvPool(options.num_kv_chunks));
  return m;
}

absl::StatusOr<int64_t> CudaLlamaModel::KvCapacity(double gpu_memory_fraction) const {
  if (!(gpu_memory_fraction > 0 && gpu_memory_fraction <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("gpu_memory_fraction must be in (0, 1], got %g", gpu_memory_fraction));
  }
  CUDA_RETURN_IF_ERROR(cudaSetDevice(cuda_.device));
  size_t free_bytes = 0, total_bytes = 0;
  CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
  // Room for what is allocated later: the prefill plan and sampling
  // buffers, the graphs, NCCL's buffers (the decode plan and partial
  // buffers were reserved at Create and are already out of `free`).
  const int64_t reserve = int64_t{512} << 20;
  return KvChunksForMemory(static_cast<int64_t>(free_bytes), static_cast<int64_t>(total_bytes),
                           gpu_memory_fraction, reserve, KvShapeOf(config_, layout_, options_).BytesPerChunk());
}

absl::Status CudaLlamaModel::AllocateKvPool(int64_t num_chunks) {
  Impl& im = *impl_;
  if (im.k_pool.get() != nullptr) return absl::FailedPreconditionError("the KV pool is already allocated");
  if (num_chunks < 1 || num_chunks > (int64_t{1} << 31) - 1) {
    return absl::InvalidArgumentError(absl::StrFormat("KV pool of %d chunks", num_chunks));
  }
  CUDA_RETURN_IF_ERROR(cudaSetDevice(cuda_.device));
  const int64_t layer_elements = num_chunks * layout_.num_kv_heads * options_.chunk_size * config_.head_dim;
  const size_t bytes = static_cast<size_t>(layer_elements) * config_.num_layers * DTypeBytes(options_.kv_dtype);
  ASSIGN_OR_RETURN(DeviceBuffer k, DeviceBuffer::Allocate(bytes));
  ASSIGN_OR_RETURN(DeviceBuffer v, DeviceBuffer::Allocate(bytes));
  im.k_pool = std::move(k);
  im.v_pool = std::move(v);
  im.layer_elements = layer_elements;
  options_.num_kv_chunks = num_chunks;
  im.pool_view.dtype = options_.kv_dtype;
  im.pool_view.num_chunks = num_chunks;
  im.pool_view.num_kv_heads = layout_.num_kv_heads;
  im.pool_view.chunk_size = options_.chunk_size;
  im.pool_view.head_dim = config_.head_dim;
  return absl::OkStatus();
}

absl::Status CudaLlamaModel::CopyKv(absl::Span<const KvCopy> copies) {
  Impl& im = *impl_;
  if (im.k_pool.get() == nullptr) return absl::FailedPreconditionError("the KV pool is not allocated");
  if (copies.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(ValidateKvCopies(copies, options_.num_kv_chunks, options_.chunk_size));
  for (int l = 0; l < config_.num_layers; ++l) {
    RETURN_IF_ERROR(im.attention->CopyKv(im.View(l), copies, im.stream));
  }
  return absl::OkStatus();
}

namespace {

// INVALID_ARGUMENT unless `chunk` is in a pool of `num_chunks` and `bytes`
// is one chunk's.
absl::Status CheckChunkBuffer(int32_t chunk, size_t bytes, int64_t num_chunks, int64_t chunk_bytes) {
  if (chunk < 0 || chunk >= num_chunks) {
    return absl::InvalidArgumentError(absl::StrFormat("KV chunk %d is outside the pool's [0, %d)", chunk, num_chunks));
  }
  if (static_cast<int64_t>(bytes) != chunk_bytes) {
    return absl::InvalidArgumentError(absl::StrFormat("a KV chunk is %d bytes, the buffer %d", chunk_bytes, bytes));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CudaLlamaModel::CopyChunk(int32_t chunk, uint8_t* host, size_t bytes, bool to_device) {
  Impl& im = *impl_;
  if (im.k_pool.get() == nullptr) return absl::FailedPreconditionError("the KV pool is not allocated");
  RETURN_IF_ERROR(CheckChunkBuffer(chunk, bytes, options_.num_kv_chunks,
                                   KvShapeOf(config_, layout_, options_).BytesPerChunk()));
  CUDA_RETURN_IF_ERROR(cudaSetDevice(cuda_.device));
  // Per layer l, K then V (KvPool's order): a chunk is one contiguous slice
  // of (num_kv_heads, chunk_size, head_dim) in each.
  const size_t slice = static_cast<size_t>(im.pool_view.ChunkStride()) * DTypeBytes(options_.kv_dtype);
  for (int l = 0; l < config_.num_layers; ++l) {
    const KvPoolView view = im.View(l);
    for (int kv = 0; kv < 2; ++kv) {
      char* dev = static_cast<char*>(kv == 0 ? view.k : view.v) + static_cast<size_t>(chunk) * slice;
      uint8_t* at = host + (2 * static_cast<size_t>(l) + kv) * slice;
      CUDA_RETURN_IF_ERROR(to_device ? cudaMemcpyAsync(dev, at, slice, cudaMemcpyHostToDevice, im.stream)
                                     : cudaMemcpyAsync(at, dev, slice, cudaMemcpyDeviceToHost, im.stream));
    }
  }
  // The host buffer is the caller's again on return.
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(im.stream));
  return absl::OkStatus();
}

absl::Status CudaLlamaModel::ReadChunk(int32_t chunk, absl::Span<uint8_t> out) {
  return CopyChunk(chunk, out.data(), out.size(), /*to_device=*/false);
}

int64_t CudaLlamaModel::kv_chunk_bytes() const { return KvShapeOf(config_, layout_, options_).BytesPerChunk(); }

absl::Status CudaLlamaModel::WriteChunk(int32_t chunk, absl::Span<const uint8_t> in) {
  // cudaMemcpy only reads the host side of a host-to-device copy.
  return CopyChunk(chunk, const_cast<uint8_t*>(in.data()), in.size(), /*to_device=*/true);
}

absl::Status CudaLlamaModel::Forward(const ForwardBatch& batch, std::vector<float>& logits) {
  return Run(batch, Output::kLogits, &logits);
}

absl::Status CudaLlamaModel::ForwardGreedy(const ForwardBatch& batch, std::vector<int32_t>& tokens,
                                           std::vector<float>& logprobs) {
  RETURN_IF_ERROR(Run(batch, Output::kGreedy, nullptr));
  const int64_t n = static_cast<int64_t>(batch.logits_rows.size());
  const Impl::Picks picks = impl_->PicksAt(impl_->host_picks.get());
  tokens.assign(picks.tokens, picks.tokens + n);
  logprobs.assign(picks.logprobs, picks.logprobs + n);
  return absl::OkStatus();
}

bool CudaLlamaModel::has_device_sampling() const { return config_.vocab_size <= cuda::kMaxPenaltyVocab; }

absl::Status CudaLlamaModel::ForwardSample(const ForwardBatch& batch, absl::Span<const int32_t> rows,
                                           absl::Span<const SampleInput> inputs, std::vector<SampleResult>& out,
                                           const LateMasks* late_masks) {
  if (!has_device_sampling()) {
    return absl::UnimplementedError(absl::StrFormat(
        "a vocabulary of %d tokens samples on the host (the device takes up to %d)", config_.vocab_size,
        cuda::kMaxPenaltyVocab));
  }
  RETURN_IF_ERROR(PackSamples(rows, inputs, config_.vocab_size, static_cast<int64_t>(batch.logits_rows.size()),
                              &packed_));
  // By row, so each block of logits rows samples one contiguous range.
  const size_t n = packed_.params.size();
  allowed_.resize(n);
  for (size_t k = 0; k < n; ++k) allowed_[k] = inputs[k].allowed;
  order_.resize(n);
  std::iota(order_.begin(), order_.end(), 0);
  std::stable_sort(order_.begin(), order_.end(),
                   [&](int32_t a, int32_t b) { return packed_.params[a].row < packed_.params[b].row; });
  std::vector<cuda::SampleRowParams> sorted(n);
  std::vector<int32_t> sorted_top(n);
  for (size_t k = 0; k < n; ++k) {
    sorted[k] = packed_.params[order_[k]];
    sorted_top[k] = packed_.top_logprobs[order_[k]];
  }
  packed_.params.swap(sorted);
  packed_.top_logprobs.swap(sorted_top);
  // top_logprobs is a host fallback: the kernel returns only token and
  // logprob, so Run copies the logits row of each sample asking for them
  // here, and AddTopLogprobs ranks it with the Sampler's code.
  const int vocab = config_.vocab_size;
  top_slot_.assign(n, -1);
  int64_t num_top = 0;
  for (size_t k = 0; k < n; ++k) {
    if (packed_.top_logprobs[k] > 0) top_slot_[k] = static_cast<int32_t>(num_top++);
  }
  top_logits_.resize(static_cast<size_t>(num_top) * vocab);
  RETURN_IF_ERROR(Run(batch, Output::kSample, nullptr, late_masks));
  const int32_t* tokens = static_cast<const int32_t*>(impl_->sample_picks.host.get());
  const float* logprobs = reinterpret_cast<const float*>(tokens + n);
  out.resize(n);
  for (size_t k = 0; k < n; ++k) {
    SampleResult& r = out[order_[k]];
    r = {tokens[k], logprobs[k], {}};
    if (top_slot_[k] >= 0 && r.token >= 0) {
      AddTopLogprobs(top_logits_.data() + static_cast<size_t>(top_slot_[k]) * vocab, vocab, allowed_[order_[k]],
                     packed_.top_logprobs[k], &r);
    }
  }
  return absl::OkStatus();
}

namespace {

// Everything one step launches, in stream order; used eagerly and for capture.
struct StepLauncher {
  const ModelConfig& config;
  const ModelOptions& options;
  const ShardLayout& layout;
  CudaLlamaModel::Impl& im;  // NOLINT: a view for the step's duration
  NcclCommunicator* comm;

  KvPoolView View(int l) const { return im.View(l); }

  AttentionShape Shape() const {
    AttentionShape s;
    s.num_heads = layout.num_heads;
    s.num_kv_heads = layout.num_kv_heads;
    s.head_dim = config.head_dim;
    return s;
  }

  // c (m, n) = a (m, k) * w^T with w (n, k) row-major, fp32 accumulation.
  absl::Status Gemm(const void* a, int64_t m, int64_t k, const DeviceBuffer& w, int64_t n, void* c,
                    bool c_fp32) const {
    const float alpha = 1, beta = 0;
    const cudaDataType_t t = CudaType(options.kv_dtype);
    CUBLAS_RETURN_IF_ERROR(cublasGemmEx(im.cublas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n),
                                        static_cast<int>(m), static_cast<int>(k), &alpha, w.get(), t,
                                        static_cast<int>(k), a, t, static_cast<int>(k), &beta, c,
                                        c_fp32 ? CUDA_R_32F : t, static_cast<int>(n), CUBLAS_COMPUTE_32F,
                                        CUBLAS_GEMM_DEFAULT));
    return absl::OkStatus();
  }

  absl::Status AllReduce(float* data, int64_t n) const {
    if (comm == nullptr || comm->world_size() == 1) return absl::OkStatus();
    return comm->AllReduceSum(data, n, im.stream);
  }

  // The decoder layers over `rows` rows; attention for the first
  // `prefill_rows` rows (PreparePrefill done) and the decode rows after them
  // (PrepareDecode done).
  absl::Status Layers(int64_t rows, int64_t prefill_rows, bool decode) const {
    const DType t = options.kv_dtype;
    const int64_t hidden = config.hidden_size, d = config.head_dim;
    const int64_t q_width = int64_t{layout.num_heads} * d;
    const int64_t qkv_width = q_width + 2 * int64_t{layout.num_kv_heads} * d;
    const int64_t inter = layout.intermediate;
    const float eps = static_cast<float>(config.rms_norm_eps);
    const AttentionShape shape = Shape();
    float* x = static_cast<float*>(im.x.get());
    float* delta = static_cast<float*>(im.delta.get());
    char* q = static_cast<char*>(im.q.get());
    char* attn = static_cast<char*>(im.attn.get());
    const CudaLlamaModel::Impl::Inputs in = im.InputsAt(im.inputs.get());
    CUDA_RETURN_IF_ERROR(cuda::LaunchEmbed(t, im.embed.get(), in.tokens, rows, config.hidden_size, x, im.stream));
    for (int l = 0; l < config.num_layers; ++l) {
      const CudaLlamaModel::Impl::Layer& w = im.layers[l];
      const KvPoolView view = View(l);
      CUDA_RETURN_IF_ERROR(cuda::LaunchAddRmsNorm(t, x, l == 0 ? nullptr : delta, nullptr,
                                                  static_cast<const float*>(w.input_norm.get()), rows,
                                                  config.hidden_size, eps, im.h.get(), im.stream));
      RETURN_IF_ERROR(Gemm(im.h.get(), rows, hidden, w.qkv, qkv_width, im.qkv.get(), true));
      const float* bias = static_cast<const float*>(w.qkv_bias.get());
      if (config.qk_norm) {  // Qwen3: bias, then each q/k head's RMSNorm, in place; then RoPE
        CUDA_RETURN_IF_ERROR(cuda::LaunchQkNorm(static_cast<float*>(im.qkv.get()), bias,
                                                static_cast<const float*>(w.q_norm.get()),
                                                static_cast<const float*>(w.k_norm.get()), rows, layout.num_heads,
                                                layout.num_kv_heads, config.head_dim, eps, im.stream));
        bias = nullptr;
      }
      CUDA_RETURN_IF_ERROR(cuda::LaunchRopeAppend(
          t, static_cast<const float*>(im.qkv.get()), bias,
          static_cast<const float*>(im.rope_cos.get()), static_cast<const float*>(im.rope_sin.get()),
          in.positions, in.slots, rows, layout.num_heads, layout.num_kv_heads, config.head_dim, view, q,
          im.stream));
      if (prefill_rows > 0) RETURN_IF_ERROR(im.attention->LaunchPrefill(view, shape, q, attn, im.stream));
      if (decode) {
        const size_t off = static_cast<size_t>(prefill_rows * q_width) * DTypeBytes(t);
        RETURN_IF_ERROR(im.attention->LaunchDecode(view, shape, q + off, attn + off, im.stream));
      }
      RETURN_IF_ERROR(Gemm(attn, rows, q_width, w.o, hidden, delta, true));
      RETURN_IF_ERROR(AllReduce(delta, rows * hidden));
      CUDA_RETURN_IF_ERROR(cuda::LaunchAddRmsNorm(t, x, delta, nullptr, static_cast<const float*>(w.post_norm.get()),
                                                  rows, config.hidden_size, eps, im.h.get(), im.stream));
      RETURN_IF_ERROR(Gemm(im.h.get(), rows, hidden, w.gate_up, 2 * inter, im.gate_up.get(), false));
      CUDA_RETURN_IF_ERROR(cuda::LaunchSwiGlu(t, im.gate_up.get(), rows, static_cast<int>(inter), im.act.get(),
                                              im.stream));
      RETURN_IF_ERROR(Gemm(im.act.get(), rows, inter, w.down, hidden, delta, true));
      RETURN_IF_ERROR(AllReduce(delta, rows * hidden));
    }
    return absl::OkStatus();
  }

  // Final norm (with the last layer's residual), LM head and, if `greedy`,
  // the greedy picks for logits rows [first, first + n) of the gather list;
  // n <= logits_block.
  absl::Status Head(int64_t first, int64_t n, bool greedy) const {
    const DType t = options.kv_dtype;
    const DeviceBuffer& out_embed = im.lm_head.get() != nullptr ? im.lm_head : im.embed;
    const CudaLlamaModel::Impl::Picks picks = im.PicksAt(im.picks.get());
    CUDA_RETURN_IF_ERROR(cuda::LaunchAddRmsNorm(t, static_cast<float*>(im.x.get()),
                                                static_cast<const float*>(im.delta.get()), im.InputsAt(im.inputs.get()).gather + first,
                                                static_cast<const float*>(im.final_norm.get()), n,
                                                config.hidden_size, static_cast<float>(config.rms_norm_eps),
                                                im.h.get(), im.stream));
    RETURN_IF_ERROR(Gemm(im.h.get(), n, config.hidden_size, out_embed, config.vocab_size, im.logits.get(), true));
    if (!greedy) return absl::OkStatus();
    CUDA_RETURN_IF_ERROR(cuda::LaunchGreedy(static_cast<const float*>(im.logits.get()), n, config.vocab_size,
                                            picks.tokens + first, picks.logprobs + first, im.stream));
    return absl::OkStatus();
  }
};

}  // namespace

absl::Status CudaLlamaModel::PackLateMasks(const LateMasks& late_masks) {
  ASSIGN_OR_RETURN(absl::Span<const std::vector<uint32_t>> masks, late_masks());
  const size_t n = packed_.params.size();
  if (masks.size() != n) {
    return absl::InvalidArgumentError(absl::StrFormat("%d late token masks for %d samples", masks.size(), n));
  }
  packed_.masks.clear();
  for (size_t k = 0; k < n; ++k) {
    const std::vector<uint32_t>& mask = masks[order_[k]];
    if (absl::Status s = PackMask(mask, config_.vocab_size, &packed_.params[k], &packed_); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrFormat("sample %d: %s", order_[k], s.message()));
    }
    allowed_[order_[k]] = mask;
  }
  return absl::OkStatus();
}

absl::Status CudaLlamaModel::Run(const ForwardBatch& batch, Output output, std::vector<float>* logits,
                                 const LateMasks* late_masks) {
  Impl& im = *impl_;
  if (im.k_pool.get() == nullptr) return absl::FailedPreconditionError("the KV pool is not allocated");
  if (comm_ != nullptr && comm_->broken()) {
    return absl::UnavailableError("the NCCL group is broken: the session must be rebuilt");
  }
  RETURN_IF_ERROR(step_.Plan(batch, config_, options_.chunk_size, options_.num_kv_chunks));
  const int64_t rows = step_.num_rows();
  const int64_t prefill_rows = step_.prefill_rows();
  if (rows > im.max_rows) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the step has %d rows; this worker's workspace holds %d (the coordinator's --max_tokens_per_step)",
        rows, im.max_rows));
  }
  const int64_t num_out = static_cast<int64_t>(batch.logits_rows.size());
  if (num_out > im.max_rows) {
    return absl::InvalidArgumentError(
        absl::StrFormat("the step asks for %d logits rows; this worker holds %d", num_out, im.max_rows));
  }
  CUDA_RETURN_IF_ERROR(cudaSetDevice(cuda_.device));
  StepLauncher launch{config_, options_, layout_, im, comm_};
  // The GPU writes K/V wherever a slot points: check them all here.
  RETURN_IF_ERROR(ValidateSlots(launch.View(0), step_.slots()));

  // A decode-only step whose logits rows are its rows in order replays the
  // graph of its bucket.
  const int decode_rows = batch.decode == nullptr ? 0 : batch.decode->num_seqs();
  bool use_graph = cuda_.cuda_graphs && prefill_rows == 0 && decode_rows > 0 &&
                   decode_rows <= cuda_.max_graph_batch && GraphBucket(decode_rows) <= im.max_rows &&
                   num_out == decode_rows;
  for (int64_t i = 0; use_graph && i < num_out; ++i) use_graph = batch.logits_rows[i] == i;
  const int64_t launch_rows = use_graph ? GraphBucket(decode_rows) : rows;

  // Inputs, padded to the launch rows: token 0 at position 0, KV not written.
  const Impl::Inputs host = im.InputsAt(im.host_inputs.get());
  const Impl::Inputs dev = im.InputsAt(im.inputs.get());
  for (int64_t r = 0; r < launch_rows; ++r) {
    const bool real = r < rows;
    host.tokens[r] = real ? batch.tokens[r] : 0;
    host.positions[r] = real ? step_.positions()[r] : 0;
    host.slots[r] = real ? step_.slots()[r] : -1;
  }
  // The rows the head reads: a graph's are its bucket's rows in order.
  const int64_t n_gather = use_graph ? launch_rows : num_out;
  for (int64_t i = 0; i < n_gather; ++i) host.gather[i] = use_graph ? static_cast<int32_t>(i) : batch.logits_rows[i];
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dev.tokens, host.tokens, launch_rows * 4, cudaMemcpyHostToDevice, im.stream));
  CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(dev.positions, host.positions, launch_rows * 4, cudaMemcpyHostToDevice, im.stream));
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dev.slots, host.slots, launch_rows * 8, cudaMemcpyHostToDevice, im.stream));
  if (n_gather > 0) {
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dev.gather, host.gather, n_gather * 4, cudaMemcpyHostToDevice, im.stream));
  }
  const int64_t num_samples = output == Output::kSample ? static_cast<int64_t>(packed_.params.size()) : 0;
  const bool late = num_samples > 0 && late_masks != nullptr;
  // The sample records and masks: now, or (late masks) once the layers are
  // launched, into buffers reserved now (no allocation behind the launch).
  auto upload_samples = [&]() -> absl::Status {
    RETURN_IF_ERROR(im.sample_params.Upload(packed_.params.data(), num_samples * sizeof(cuda::SampleRowParams),
                                            im.stream));
    return im.sample_masks.Upload(packed_.masks.data(), packed_.masks.size() * sizeof(uint32_t), im.stream);
  };
  if (num_samples > 0) {
    // A penalized sample needs the history array even when it is empty.
    if (packed_.penalized) RETURN_IF_ERROR(im.sample_history.Reserve(sizeof(int32_t)));
    RETURN_IF_ERROR(im.sample_history.Upload(packed_.history.data(), packed_.history.size() * sizeof(int32_t),
                                             im.stream));
    RETURN_IF_ERROR(im.sample_picks.Reserve(num_samples * 8));
    if (late) {
      RETURN_IF_ERROR(im.sample_params.Reserve(num_samples * sizeof(cuda::SampleRowParams)));
      const int64_t words = (int64_t{config_.vocab_size} + 31) / 32;
      RETURN_IF_ERROR(im.sample_masks.Reserve(num_samples * words * sizeof(uint32_t)));
    } else {
      RETURN_IF_ERROR(upload_samples());
    }
  }

  // Attention plans: once per step, for every layer. They validate the
  // batch, so they come before the first write (the copies).
  if (prefill_rows > 0) {
    RETURN_IF_ERROR(im.attention->PreparePrefill(batch.prefill, launch.View(0), launch.Shape(), im.stream));
  }
  if (decode_rows > 0) {
    RETURN_IF_ERROR(im.attention->PrepareDecode(options_.decode_impl, *batch.decode, launch.View(0), launch.Shape(), im.stream));
  }
  RETURN_IF_ERROR(CopyKv(batch.copies));

  if (use_graph) {
    const int bucket = static_cast<int>(launch_rows);
    if (!im.graphs.empty() && im.graphs.begin()->second.attention_generation != im.attention->buffer_generation()) {
      im.DropGraphs();  // a buffer the graphs read was reallocated
    }
    auto it = im.graphs.find(bucket);
    // A bucket's first step runs eagerly: lazy setup (NCCL connections,
    // cuBLAS heuristics) must not happen inside a capture.
    const bool warm_up = it == im.graphs.end() && im.warmed.insert(bucket).second;
    auto run_bucket = [&]() -> absl::Status {
      RETURN_IF_ERROR(launch.Layers(launch_rows, 0, /*decode=*/true));
      for (int64_t first = 0; first < launch_rows; first += im.logits_block) {
        RETURN_IF_ERROR(launch.Head(first, std::min(im.logits_block, launch_rows - first), /*greedy=*/true));
      }
      return absl::OkStatus();
    };
    if (warm_up) {
      RETURN_IF_ERROR(run_bucket());
    } else if (it == im.graphs.end()) {
      CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(im.stream, cudaStreamCaptureModeThreadLocal));
      const absl::Status captured = run_bucket();
      cudaGraph_t graph = nullptr;
      const cudaError_t end = cudaStreamEndCapture(im.stream, &graph);
      if (!captured.ok()) {
        if (graph != nullptr) cudaGraphDestroy(graph);
        (void)CudaStatus(end, "cudaStreamEndCapture");  // reported through `captured`; clears it
        return captured;
      }
      CUDA_RETURN_IF_ERROR(end);
      Impl::Graph g;
      g.attention_generation = im.attention->buffer_generation();
      const cudaError_t inst = cudaGraphInstantiate(&g.exec, graph, 0);
      cudaGraphDestroy(graph);
      CUDA_RETURN_IF_ERROR(inst);
      it = im.graphs.emplace(bucket, g).first;
    }
    if (!warm_up) {
      CUDA_RETURN_IF_ERROR(cudaGraphLaunch(it->second.exec, im.stream));
    }
  } else {
    RETURN_IF_ERROR(launch.Layers(rows, prefill_rows, decode_rows > 0));
  }

  if (late) {
    // The device runs the layers while the host waits for the masks.
    absl::Status masks = PackLateMasks(*late_masks);
    if (!masks.ok()) {
      (void)cudaStreamSynchronize(im.stream);  // nothing launched may outlive the step
      return masks;
    }
    RETURN_IF_ERROR(upload_samples());
  }

  // Outputs. The graph computed every bucket row's logits in blocks and kept
  // only the last block's logits; the eager path goes block by block. A graph
  // of one block left its logits in place; with more, its last block
  // overwrote the first ones, so they are redone.
  const bool redo_head = !use_graph || launch_rows > im.logits_block;
  if (output == Output::kGreedy) {
    if (!use_graph) {
      for (int64_t first = 0; first < num_out; first += im.logits_block) {
        RETURN_IF_ERROR(launch.Head(first, std::min(im.logits_block, num_out - first), /*greedy=*/true));
      }
    }
    const Impl::Picks dev_picks = im.PicksAt(im.picks.get());
    const Impl::Picks host_picks = im.PicksAt(im.host_picks.get());
    CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(host_picks.tokens, dev_picks.tokens, num_out * 4, cudaMemcpyDeviceToHost, im.stream));
    CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(host_picks.logprobs, dev_picks.logprobs, num_out * 4, cudaMemcpyDeviceToHost, im.stream));
  } else if (output == Output::kSample) {
    const auto* params = static_cast<const cuda::SampleRowParams*>(im.sample_params.dev.get());
    const int32_t* history = packed_.penalized ? static_cast<const int32_t*>(im.sample_history.dev.get()) : nullptr;
    const uint32_t* masks = packed_.masks.empty() ? nullptr : static_cast<const uint32_t*>(im.sample_masks.dev.get());
    int32_t* tokens = static_cast<int32_t*>(im.sample_picks.dev.get());
    float* logprobs = reinterpret_cast<float*>(tokens + num_samples);
    // The top_logprobs rows are copied into pageable memory, which blocks
    // the host until the stream reaches them: wait for the collectives first.
    if (!top_logits_.empty() && comm_ != nullptr && comm_->world_size() > 1) {
      RETURN_IF_ERROR(comm_->Wait(im.stream));
    }
    int64_t s0 = 0;  // the block's samples: [s0, s1), sorted by row
    for (int64_t first = 0; first < num_out && s0 < num_samples; first += im.logits_block) {
      const int64_t n = std::min(im.logits_block, num_out - first);
      int64_t s1 = s0;
      while (s1 < num_samples && packed_.params[s1].row < first + n) ++s1;
      if (s1 == s0) continue;
      if (redo_head) RETURN_IF_ERROR(launch.Head(first, n, /*greedy=*/false));
      CUDA_RETURN_IF_ERROR(cuda::LaunchSample(static_cast<const float*>(im.logits.get()), n, config_.vocab_size,
                                              first, params + s0, s1 - s0, history, masks, tokens + s0,
                                              logprobs + s0, im.stream));
      for (int64_t k = s0; k < s1; ++k) {  // the host fallback's rows (ForwardSample)
        if (top_slot_[k] < 0) continue;
        const float* row =
            static_cast<const float*>(im.logits.get()) + (packed_.params[k].row - first) * config_.vocab_size;
        CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(top_logits_.data() + int64_t{top_slot_[k]} * config_.vocab_size, row,
                                             config_.vocab_size * sizeof(float), cudaMemcpyDeviceToHost, im.stream));
      }
      s0 = s1;
    }
    if (num_samples > 0) {
      CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(im.sample_picks.host.get(), tokens, num_samples * 8,
                                           cudaMemcpyDeviceToHost, im.stream));
    }
  } else {
    // Copies into pageable memory block the host until the stream reaches
    // them: wait for the collectives first, with the group's timeout.
    if (comm_ != nullptr && comm_->world_size() > 1) RETURN_IF_ERROR(comm_->Wait(im.stream));
    logits->resize(static_cast<size_t>(num_out) * config_.vocab_size);
    for (int64_t first = 0; first < num_out; first += im.logits_block) {
      const int64_t n = std::min(im.logits_block, num_out - first);
      if (redo_head) RETURN_IF_ERROR(launch.Head(first, n, /*greedy=*/false));
      CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(logits->data() + first * config_.vocab_size, im.logits.get(),
                                           n * config_.vocab_size * 4, cudaMemcpyDeviceToHost, im.stream));
    }
  }
  if (comm_ != nullptr && comm_->world_size() > 1) {
    RETURN_IF_ERROR(comm_->Wait(im.stream));
  } else {
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(im.stream));
  }
  return absl::OkStatus();
}

}  // namespace chunkattn
