// CUDA attention against the float64 oracle over the random forests of the
// CPU tests. Outputs are poisoned (all-ones bytes: NaN in fp16 and bf16)
// before every run, and the pool's unused slots hold NaN, so a row never
// written or a slot read by mistake fails the comparison. Skipped, with a
// message, where no GPU is visible.
//
// Tolerances (max |kernel - oracle|, outputs are O(1)): the oracle reads the
// same stored K/V and q, so what remains is the kernels' arithmetic: P
// rounded to the storage type for the tensor-core P.V (10 / 7 mantissa bits)
// and the output's own rounding. fp16 1e-2, bf16 4e-2.
#include "kernels/cuda/cuda_attention.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include <cuda_runtime_api.h>

#include "absl/strings/str_format.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/reference.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/tests/cuda_test_util.h"
#include "kernels/tests/attention_test_util.h"
#include "kernels/tests/random_forest.h"

namespace chunkattn::cuda {
namespace {

using testing::ForestOptions;
using testing::MaxDiff;
using testing::RandomForest;
using testing::RandomVector;
using testing::TestPool;

#define SKIP_WITHOUT_GPU() \
  if (DeviceCount() == 0) GTEST_SKIP() << "no CUDA device on this machine: the CUDA kernels were not run"

double Tol(DType t) { return t == DType::kFloat16 ? 1e-2 : 4e-2; }

DeviceBuffer ToDevice(const void* data, size_t bytes) {
  absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Allocate(bytes);
  EXPECT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(cudaMemcpy(b->get(), data, bytes, cudaMemcpyHostToDevice), cudaSuccess);
  return std::move(*b);
}

// The test pool copied to the GPU.
struct DevicePool {
  explicit DevicePool(const TestPool& pool)
      : k(ToDevice(pool.k.data(), pool.k.size())), v(ToDevice(pool.v.data(), pool.v.size())) {
    view = pool.view;
    view.k = k.get();
    view.v = v.get();
  }
  DeviceBuffer k, v;
  KvPoolView view;
};

using testing::Round;
using testing::Rounded;

// A poisoned device output of `elems` 2-byte values.
DeviceBuffer PoisonedOutput(size_t elems) {
  absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Allocate(elems * 2);
  EXPECT_TRUE(b.ok());
  EXPECT_EQ(cudaMemset(b->get(), 0xff, elems * 2), cudaSuccess);
  return std::move(*b);
}

std::vector<float> FromDevice(DType t, const DeviceBuffer& b, size_t elems) {
  std::vector<uint16_t> bits(elems);
  EXPECT_EQ(cudaMemcpy(bits.data(), b.get(), elems * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  std::vector<float> out(elems);
  for (size_t i = 0; i < elems; ++i) out[i] = LoadAs(t, bits.data(), static_cast<int64_t>(i));
  return out;
}

std::unique_ptr<CudaAttention> MakeAttention(int concurrent = 0, int min_piece_tokens = 256) {
  CudaAttention::Options opt;
  opt.plan.concurrent_items = concurrent;
  opt.plan.min_piece_tokens = min_piece_tokens;
  absl::StatusOr<std::unique_ptr<CudaAttention>> a = CudaAttention::Create(opt);
  EXPECT_TRUE(a.ok()) << a.status();
  return a.ok() ? std::move(*a) : nullptr;
}

TEST(CudaAttentionTest, CreateNeedsAVisibleDevice) {
  CudaAttention::Options opt;
  opt.device = DeviceCount();  // one past the last
  EXPECT_EQ(CudaAttention::Create(opt).status().code(), absl::StatusCode::kFailedPrecondition);
  opt.device = -1;
  EXPECT_EQ(CudaAttention::Create(opt).status().code(), absl::StatusCode::kFailedPrecondition);
}

using Params = testing::KernelParams;  // (dtype, head_dim, group, chunk)
class CudaDecodeParity : public ::testing::TestWithParam<Params> {};

TEST_P(CudaDecodeParity, TppAndSeqMatchTheOracle) {
  SKIP_WITHOUT_GPU();
  const auto [dtype, d, g, c] = GetParam();
  const int kvh = 2;
  const AttentionShape shape{kvh * g, kvh, d, 0};
  // The default split heuristic, and one that cuts every list it can.
  std::unique_ptr<CudaAttention> plain = MakeAttention();
  std::unique_ptr<CudaAttention> split = MakeAttention(/*concurrent=*/512, /*min_piece_tokens=*/c);
  ASSERT_TRUE(plain && split);
  ForestOptions fopt;
  fopt.max_seqs = 40;
  fopt.max_run = 5;
  fopt.max_private = 5;
  std::mt19937 rng(d * 1000 + g * 10 + c + static_cast<int>(dtype));
  for (int trial = 0; trial < 4; ++trial) {
    SCOPED_TRACE(absl::StrFormat("trial %d", trial));
    TestPool pool(dtype, testing::MaxForestChunks(fopt), kvh, c, d);
    const ChunkContext ctx = RandomForest(rng, pool, fopt);
    DevicePool dev(pool);
    const Rounded q = Round(dtype, RandomVector(rng, int64_t{ctx.num_seqs()} * shape.num_heads * d, 1.5f));
    DeviceBuffer dq = ToDevice(q.bits.data(), q.bits.size() * 2);
    const std::vector<double> want = cpu::ReferenceDecode(ctx, pool.view, shape, q.values.data());
    for (CudaAttention* attn : {plain.get(), split.get()}) {
      for (DecodeImpl impl : {DecodeImpl::kTpp, DecodeImpl::kSequence}) {
        SCOPED_TRACE(absl::StrFormat("%s, %s", DecodeImplName(impl), attn == split.get() ? "split" : "plain"));
        DeviceBuffer o = PoisonedOutput(q.bits.size());
        ASSERT_TRUE(attn->Decode(impl, ctx, dev.view, shape, dq.get(), o.get(), nullptr).ok());
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        EXPECT_LT(MaxDiff(FromDevice(dtype, o, q.bits.size()), want), Tol(dtype));
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaDecodeParity,
                         ::testing::Combine(::testing::Values(DType::kFloat16, DType::kBFloat16),
                                            ::testing::Values(64, 128), ::testing::Values(1, 4, 8),
                                            ::testing::Values(16, 64, 128)),
                         testing::KernelParamName);

// Captures the decode launches of the plan PrepareDecode made into *exec.
void CaptureDecode(CudaAttention* attn, const KvPoolView& kv, const AttentionShape& shape, const void* q, void* o,
                   cudaStream_t stream, cudaGraphExec_t* exec) {
  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const absl::Status launched = attn->LaunchDecode(kv, shape, q, o, stream);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_TRUE(launched.ok()) << launched;
  ASSERT_EQ(cudaGraphInstantiate(exec, graph, 0), cudaSuccess);
  cudaGraphDestroy(graph);
}

// A decode captured once in a CUDA graph keeps working while steps append
// tokens (same context version: only the filled-slot counts change).
TEST(CudaDecodeGraph, ReplaysAcrossStepsOfOneVersion) {
  SKIP_WITHOUT_GPU();
  const DType dtype = DType::kFloat16;
  const int d = 128, c = 64, kvh = 2;
  const AttentionShape shape{8, kvh, d, 0};
  std::unique_ptr<CudaAttention> attn = MakeAttention();
  ASSERT_TRUE(attn);
  std::mt19937 rng(11);
  ForestOptions fopt;
  fopt.max_seqs = 12;
  TestPool pool(dtype, testing::MaxForestChunks(fopt), kvh, c, d);
  ChunkContext ctx = RandomForest(rng, pool, fopt);
  DevicePool dev(pool);
  const Rounded q = Round(dtype, RandomVector(rng, int64_t{ctx.num_seqs()} * shape.num_heads * d, 1.0f));
  DeviceBuffer dq = ToDevice(q.bits.data(), q.bits.size() * 2);
  DeviceBuffer o = PoisonedOutput(q.bits.size());
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_TRUE(attn->PrepareDecode(DecodeImpl::kTpp, ctx, dev.view, shape, stream).ok());
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  const uint64_t generation = attn->buffer_generation();
  cudaGraphExec_t exec = nullptr;
  CaptureDecode(attn.get(), dev.view, shape, dq.get(), o.get(), stream, &exec);
  ASSERT_NE(exec, nullptr);

  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE(absl::StrFormat("step %d", step));
    if (step > 0) {  // one token more in every private tail with room
      for (int s = 0; s < ctx.num_seqs(); ++s) {
        const int32_t e = ctx.private_end[s] - 1;
        if (e < ctx.private_begin[s] || ctx.private_tokens[e] == c) continue;
        const int t = ctx.private_tokens[e]++;
        ++ctx.seq_len[s];
        for (int h = 0; h < kvh; ++h) {
          for (int x = 0; x < d; ++x) {
            const int64_t i = ((int64_t{ctx.private_chunk[e]} * kvh + h) * c + t) * d + x;
            pool.original_k[i] = std::normal_distribution<float>()(rng);
            pool.original_v[i] = std::normal_distribution<float>()(rng);
            pool.Store(i);
          }
        }
      }
      ASSERT_EQ(cudaMemcpy(dev.k.get(), pool.k.data(), pool.k.size(), cudaMemcpyHostToDevice), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(dev.v.get(), pool.v.data(), pool.v.size(), cudaMemcpyHostToDevice), cudaSuccess);
      ASSERT_TRUE(attn->PrepareDecode(DecodeImpl::kTpp, ctx, dev.view, shape, stream).ok());
      ASSERT_EQ(attn->buffer_generation(), generation);
    }
    ASSERT_EQ(cudaMemsetAsync(o.get(), 0xff, q.bits.size() * 2, stream), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    const std::vector<double> want = cpu::ReferenceDecode(ctx, pool.view, shape, q.values.data());
    EXPECT_LT(MaxDiff(FromDevice(dtype, o, q.bits.size()), want), Tol(dtype));
  }
  cudaGraphExecDestroy(exec);
  cudaStreamDestroy(stream);
}

// After ReserveDecode, every context within its limits plans into the same
// buffers: one graph, captured once, serves new plans of new versions and
// sizes (the serving model's graphs rely on this).
TEST(CudaDecodeGraph, ReservedBuffersServeEveryContextWithinTheLimits) {
  SKIP_WITHOUT_GPU();
  const DType dtype = DType::kBFloat16;
  const int d = 64, c = 16, kvh = 2;
  const AttentionShape shape{8, kvh, d, 0};
  std::unique_ptr<CudaAttention> attn = MakeAttention(0, c);  // split-KV at its finest
  ASSERT_TRUE(attn);
  ForestOptions fopt;
  fopt.max_seqs = 40;
  fopt.max_run = 5;
  fopt.max_private = 6;
  const int64_t pool_chunks = testing::MaxForestChunks(fopt);
  // Chunks are distinct, so no path is longer than the pool.
  ASSERT_TRUE(attn->ReserveDecode(DecodeImpl::kTpp, fopt.max_seqs, static_cast<int>(pool_chunks), dtype, shape).ok());
  const uint64_t generation = attn->buffer_generation();
  std::mt19937 rng(23);
  TestPool first(dtype, pool_chunks, kvh, c, d);
  DevicePool dev(first);
  const size_t max_q = size_t{40} * shape.num_heads * d;
  DeviceBuffer dq = PoisonedOutput(max_q), o = PoisonedOutput(max_q);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  for (int trial = 0; trial < 16; ++trial) {
    SCOPED_TRACE(absl::StrFormat("trial %d", trial));
    TestPool pool(dtype, pool_chunks, kvh, c, d);
    ChunkContext ctx = RandomForest(rng, pool, fopt);
    ctx.version = 5000 + trial;  // every trial a new plan
    const Rounded q = Round(dtype, RandomVector(rng, int64_t{ctx.num_seqs()} * shape.num_heads * d, 1.0f));
    ASSERT_EQ(cudaMemcpy(dev.k.get(), pool.k.data(), pool.k.size(), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dev.v.get(), pool.v.data(), pool.v.size(), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dq.get(), q.bits.data(), q.bits.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_TRUE(attn->PrepareDecode(DecodeImpl::kTpp, ctx, dev.view, shape, stream).ok());
    ASSERT_EQ(attn->buffer_generation(), generation);
    if (exec == nullptr) CaptureDecode(attn.get(), dev.view, shape, dq.get(), o.get(), stream, &exec);
    ASSERT_NE(exec, nullptr);
    ASSERT_EQ(cudaMemsetAsync(o.get(), 0xff, max_q * 2, stream), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    const std::vector<double> want = cpu::ReferenceDecode(ctx, pool.view, shape, q.values.data());
    EXPECT_LT(MaxDiff(FromDevice(dtype, o, q.bits.size()), want), Tol(dtype));
  }
  cudaGraphExecDestroy(exec);
  cudaStreamDestroy(stream);
}

class CudaPrefillParity : public ::testing::TestWithParam<Params> {};

TEST_P(CudaPrefillParity, MatchesTheOracle) {
  SKIP_WITHOUT_GPU();
  const auto [dtype, d, g, c] = GetParam();
  const int kvh = 2;
  const AttentionShape shape{kvh * g, kvh, d, 0};
  std::unique_ptr<CudaAttention> attn = MakeAttention();
  ASSERT_TRUE(attn);
  std::mt19937 rng(d + g * 7 + c * 13);
  for (int trial = 0; trial < 3; ++trial) {
    TestPool pool(dtype, 4 * 6, kvh, c, d);
    testing::PrefillCase pc = testing::RandomPrefill(rng, pool, shape.num_heads, 4);
    const Rounded q = Round(dtype, pc.q);
    DevicePool dev(pool);
    DeviceBuffer dq = ToDevice(q.bits.data(), q.bits.size() * 2);
    DeviceBuffer o = PoisonedOutput(q.bits.size());
    const absl::Status st = attn->Prefill(pc.batch, dev.view, shape, dq.get(), o.get(), nullptr);
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_LT(MaxDiff(FromDevice(dtype, o, q.bits.size()),
                      cpu::ReferencePrefill(pc.batch, pool.view, shape, q.values.data())),
              Tol(dtype));
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaPrefillParity,
                         ::testing::Combine(::testing::Values(DType::kFloat16, DType::kBFloat16),
                                            ::testing::Values(64, 128), ::testing::Values(1, 4),
                                            ::testing::Values(16, 64)),
                         testing::KernelParamName);

// Append and copy give the pool bytes the CPU functions give.
TEST(CudaKvWrites, AppendAndCopyMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  std::unique_ptr<CudaAttention> attn = MakeAttention();
  ASSERT_TRUE(attn);
  std::mt19937 rng(3);
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    const int kvh = 3, c = 32, d = 64, chunks = 10;
    TestPool pool(dtype, chunks, kvh, c, d);
    for (int ch = 0; ch < chunks; ++ch) pool.Fill(rng, ch, c);
    DevicePool dev(pool);
    std::vector<int64_t> slots = {5, 31, 32, 100, 319};
    const Rounded k = Round(dtype, RandomVector(rng, int64_t{5} * kvh * d, 1.0f));
    const Rounded v = Round(dtype, RandomVector(rng, int64_t{5} * kvh * d, 1.0f));
    DeviceBuffer dk = ToDevice(k.bits.data(), k.bits.size() * 2);
    DeviceBuffer dv = ToDevice(v.bits.data(), v.bits.size() * 2);
    ASSERT_TRUE(attn->AppendKv(dev.view, dk.get(), dv.get(), slots, nullptr).ok());
    const std::vector<KvCopy> copies = {{1, 2, 17}, {2, 3, 32}, {4, 4, 5}, {0, 9, 0}};
    ASSERT_TRUE(attn->CopyKv(dev.view, copies, nullptr).ok());
    ASSERT_TRUE(cpu::AppendKv(pool.view, k.values.data(), v.values.data(), slots).ok());
    ASSERT_TRUE(cpu::CopyKv(pool.view, copies).ok());
    std::vector<uint8_t> got(pool.k.size());
    ASSERT_EQ(cudaMemcpy(got.data(), dev.k.get(), got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(got, pool.k);
    ASSERT_EQ(cudaMemcpy(got.data(), dev.v.get(), got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(got, pool.v);

    const std::vector<int64_t> bad = {int64_t{chunks} * c};
    EXPECT_EQ(attn->AppendKv(dev.view, dk.get(), dv.get(), bad, nullptr).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(attn->CopyKv(dev.view, {{0, chunks, 1}}, nullptr).code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(CudaAttentionTest, RejectsBadInputs) {
  SKIP_WITHOUT_GPU();
  std::unique_ptr<CudaAttention> attn = MakeAttention();
  ASSERT_TRUE(attn);
  std::mt19937 rng(1);
  ForestOptions fopt;
  TestPool pool(DType::kFloat16, testing::MaxForestChunks(fopt), 2, 64, 64);
  const ChunkContext ctx = RandomForest(rng, pool, fopt);
  DevicePool dev(pool);
  const AttentionShape shape{4, 2, 64, 0};
  DeviceBuffer q = PoisonedOutput(int64_t{ctx.num_seqs()} * 4 * 64);
  DeviceBuffer o = PoisonedOutput(int64_t{ctx.num_seqs()} * 4 * 64);
  auto code = [](const absl::Status& s) { return s.code(); };

  EXPECT_EQ(code(attn->LaunchDecode(dev.view, shape, q.get(), o.get(), nullptr)),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(code(attn->LaunchPrefill(dev.view, shape, q.get(), o.get(), nullptr)),
            absl::StatusCode::kFailedPrecondition);
  KvPoolView fp32 = dev.view;
  fp32.dtype = DType::kFloat32;
  EXPECT_EQ(code(attn->Decode(DecodeImpl::kTpp, ctx, fp32, shape, q.get(), o.get(), nullptr)),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(attn->Decode(DecodeImpl::kTpp, ctx, dev.view, {4, 2, 128, 0}, q.get(), o.get(), nullptr)),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(attn->Decode(DecodeImpl::kTpp, ctx, dev.view, shape, nullptr, o.get(), nullptr)),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(attn->Decode(DecodeImpl::kTpp, ctx, dev.view, shape, static_cast<char*>(q.get()) + 2, o.get(),
                              nullptr)),
            absl::StatusCode::kInvalidArgument);
  ChunkContext wrong = ctx;
  wrong.chunk_size = 32;
  EXPECT_EQ(code(attn->Decode(DecodeImpl::kTpp, wrong, dev.view, shape, q.get(), o.get(), nullptr)),
            absl::StatusCode::kInvalidArgument);
  // A plan for one version refuses a context of another that claims the same
  // version but a different structure.
  ASSERT_TRUE(attn->PrepareDecode(DecodeImpl::kTpp, ctx, dev.view, shape, nullptr).ok());
  ChunkContext other = ctx;
  other.private_chunk.push_back(-1);
  other.private_tokens.push_back(0);
  EXPECT_EQ(code(attn->PrepareDecode(DecodeImpl::kTpp, other, dev.view, shape, nullptr)),
            absl::StatusCode::kFailedPrecondition);
  // An empty prefill batch is valid and does nothing.
  PrefillBatch empty;
  empty.q_begin = {0};
  empty.chunk_begin = {0};
  EXPECT_TRUE(attn->Prefill(empty, dev.view, shape, q.get(), o.get(), nullptr).ok());
  // A prefill plan serves launches of its geometry only.
  EXPECT_EQ(code(attn->LaunchPrefill(dev.view, {4, 4, 64, 0}, q.get(), o.get(), nullptr)),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

}  // namespace
}  // namespace chunkattn::cuda
