// A build with CUDA: the GPU model is CudaLlamaModel, the group NCCL
// (gpu_model.h).
#include <cuda_runtime_api.h>

#include <cstring>
#include <utility>

#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "kernels/cuda/device.h"
#include "workers/collectives/nccl_communicator.h"
#include "workers/model/cuda_llama.h"
#include "workers/model/gpu_model.h"

namespace chunkattn {
namespace {

class NcclGroup final : public GpuGroup {
 public:
  explicit NcclGroup(std::unique_ptr<NcclCommunicator> nccl) : nccl_(std::move(nccl)) {}
  NcclCommunicator* nccl() const { return nccl_.get(); }

 private:
  std::unique_ptr<NcclCommunicator> nccl_;
};

}  // namespace

absl::Status CheckDevice(const DeviceSpec& device) {
  if (!device.cuda) return absl::OkStatus();
  const int visible = cuda::DeviceCount();
  if (device.index >= visible) {
    return absl::FailedPreconditionError(
        absl::StrFormat("--device %s: %d CUDA devices visible", device.ToString(), visible));
  }
  return absl::OkStatus();
}

std::string DescribeDevice(const DeviceSpec& device) {
  if (!device.cuda) return device.ToString();
  return device.ToString() + " (" + cuda::DeviceDescription(device.index) + ")";
}

absl::StatusOr<std::string> MakeGpuGroupId() { return NcclCommunicator::MakeUniqueId(); }

absl::StatusOr<std::unique_ptr<GpuGroup>> JoinGpuGroup(int rank, int world_size, const std::string& id,
                                                       int device, absl::Duration timeout) {
  ASSIGN_OR_RETURN(std::unique_ptr<NcclCommunicator> nccl,
                   NcclCommunicator::Create(rank, world_size, id, device, timeout));
  return std::unique_ptr<GpuGroup>(std::make_unique<NcclGroup>(std::move(nccl)));
}

absl::StatusOr<HostBytes> AllocatePinnedHostBytes(int64_t bytes) {
  void* p = nullptr;
  if (bytes <= 0 || cudaHostAlloc(&p, static_cast<size_t>(bytes), cudaHostAllocPortable) != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky: clear it for the next call
    return absl::ResourceExhaustedError(absl::StrFormat("cannot pin %d bytes of host memory", bytes));
  }
  std::memset(p, 0, static_cast<size_t>(bytes));  // blank seals: slots never written
  return HostBytes(static_cast<uint8_t*>(p), [](uint8_t* q) { (void)cudaFreeHost(q); });
}

absl::StatusOr<std::unique_ptr<GpuModel>> CreateGpuModel(const ModelConfig& config, ModelWeights weights,
                                                         const ModelOptions& options, const GpuModelOptions& gpu,
                                                         GpuGroup* group) {
  // Every GpuGroup of this build is an NcclGroup.
  NcclCommunicator* nccl = group == nullptr ? nullptr : static_cast<NcclGroup*>(group)->nccl();
  ASSIGN_OR_RETURN(std::unique_ptr<CudaLlamaModel> model,
                   CudaLlamaModel::Create(config, std::move(weights), options, gpu, nccl));
  return std::unique_ptr<GpuModel>(std::move(model));
}

}  // namespace chunkattn
