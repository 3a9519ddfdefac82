// The GPU behind one factory: the only code that knows whether this build has
// CUDA. CMake compiles gpu_model_cuda.cc into chunkattn_model_gpu when CUDA is
// built and gpu_model_none.cc otherwise, so no caller chooses by #if: a build
// without CUDA answers FAILED_PRECONDITION where a GPU is asked for.
//
// Thread-compatible, as Model: one thread drives a GpuModel.
#ifndef CHUNKATTN_WORKERS_MODEL_GPU_MODEL_H_
#define CHUNKATTN_WORKERS_MODEL_GPU_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/device.h"
#include "base/host_memory.h"
#include "proto/model/model_config.h"
#include "workers/model/model.h"
#include "workers/model/weights.h"

namespace chunkattn {

// OK for the CPU or a GPU this process sees; FAILED_PRECONDITION naming the
// device otherwise (checked before anything is loaded).
absl::Status CheckDevice(const DeviceSpec& device);
// "cpu", or "cuda:0 (NVIDIA H100 80GB HBM3, ...)".
std::string DescribeDevice(const DeviceSpec& device);

struct GpuModelOptions {
  int device = 0;
  // Most rows (tokens) one step may have: sizes the activation workspace.
  int64_t max_rows = 2048;
  // Most sequences one step decodes (the scheduler's max batch size).
  int max_batch = 256;
  // Largest decode batch replayed from a CUDA graph; larger ones run eagerly.
  int max_graph_batch = 256;
  bool cuda_graphs = true;
};

// A tensor-parallel group's collective on the GPUs (NCCL). Rank 0 makes the
// group's id (MakeGpuGroupId) and hands it to the others out of band.
class GpuGroup {
 public:
  virtual ~GpuGroup() = default;
};
absl::StatusOr<std::string> MakeGpuGroupId();
absl::StatusOr<std::unique_ptr<GpuGroup>> JoinGpuGroup(int rank, int world_size, const std::string& id,
                                                       int device, absl::Duration timeout);

// A model on one GPU whose KV pool is sized after the weights are in place.
class GpuModel : public Model {
 public:
  // KV chunks that fit in what the device has free now, keeping the process
  // within `gpu_memory_fraction` of the device's memory.
  virtual absl::StatusOr<int64_t> KvCapacity(double gpu_memory_fraction) const = 0;
  // Allocates the pool once (FAILED_PRECONDITION the second time).
  virtual absl::Status AllocateKvPool(int64_t num_chunks) = 0;
};

// `bytes` of zeroed page-locked host memory (cudaHostAlloc, portable to
// every device's context), for buffers the device copies to and from: the
// KV tiers' host slots. Pinned up front: all of it is resident from here.
// RESOURCE_EXHAUSTED when the driver refuses; FAILED_PRECONDITION without CUDA.
absl::StatusOr<HostBytes> AllocatePinnedHostBytes(int64_t bytes);

// The Llama-family model on GPU `gpu.device` (workers/model/cuda_llama.h).
// `group` (null for one rank) is borrowed and must outlive the model.
absl::StatusOr<std::unique_ptr<GpuModel>> CreateGpuModel(const ModelConfig& config, ModelWeights weights,
                                                         const ModelOptions& options, const GpuModelOptions& gpu,
                                                         GpuGroup* group);

}  // namespace chunkattn

#endif  // CHUNKATTN_WORKERS_MODEL_GPU_MODEL_H_
