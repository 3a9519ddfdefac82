// A build without CUDA: every GPU request is refused (gpu_model.h).
#include "workers/model/gpu_model.h"

namespace chunkattn {
namespace {

absl::Status NoCuda(const std::string& what) {
  return absl::FailedPreconditionError(what + ": this build has no CUDA");
}

}  // namespace

absl::Status CheckDevice(const DeviceSpec& device) {
  return device.cuda ? NoCuda("--device " + device.ToString()) : absl::OkStatus();
}

std::string DescribeDevice(const DeviceSpec& device) { return device.ToString(); }

absl::StatusOr<std::string> MakeGpuGroupId() { return NoCuda("a GPU group"); }

absl::StatusOr<std::unique_ptr<GpuGroup>> JoinGpuGroup(int, int, const std::string&, int, absl::Duration) {
  return NoCuda("a GPU group");
}

absl::StatusOr<HostBytes> AllocatePinnedHostBytes(int64_t) { return NoCuda("pinned host memory"); }

absl::StatusOr<std::unique_ptr<GpuModel>> CreateGpuModel(const ModelConfig&, ModelWeights, const ModelOptions&,
                                                         const GpuModelOptions& gpu, GpuGroup*) {
  return NoCuda("a model on cuda:" + std::to_string(gpu.device));
}

}  // namespace chunkattn
