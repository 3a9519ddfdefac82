// A test stand-in for a GPU model: the CPU model posing as one that samples
// on its device, so the callers' device paths (PlanExecutor, OfflineEngine)
// run without a GPU. Greedy picks are made here from the host logits (argmax,
// ties to the lowest id; log-softmax), full sampling by the GPU sampler's own
// row algorithm run on the host (workers/sampler/row_sampling.h), token masks
// (SampleInput::allowed) and their validation included, as the GPU's is.
#ifndef CHUNKATTN_WORKERS_TESTS_DEVICE_SAMPLING_MODEL_H_
#define CHUNKATTN_WORKERS_TESTS_DEVICE_SAMPLING_MODEL_H_

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/status_macros.h"
#include "workers/model/llama.h"
#include "workers/sampler/row_sampling.h"

namespace chunkattn::testing {

class DeviceSamplingModel final : public Model {
 public:
  explicit DeviceSamplingModel(std::unique_ptr<LlamaModel> inner) : inner_(std::move(inner)) {}

  const ModelConfig& config() const override { return inner_->config(); }
  const ModelOptions& options() const override { return inner_->options(); }
  std::string device() const override { return "test"; }
  absl::Status Forward(const ForwardBatch& batch, std::vector<float>& logits) override {
    ++host_calls;
    return inner_->Forward(batch, logits);
  }
  bool has_device_greedy() const override { return true; }
  absl::Status ForwardGreedy(const ForwardBatch& batch, std::vector<int32_t>& tokens,
                             std::vector<float>& logprobs) override {
    ++greedy_calls;
    std::vector<float> logits;
    RETURN_IF_ERROR(inner_->Forward(batch, logits));
    const int vocab = config().vocab_size;
    tokens.clear();
    logprobs.clear();
    for (size_t r = 0; r < batch.logits_rows.size(); ++r) {
      const float* row = logits.data() + r * vocab;
      const int32_t best = static_cast<int32_t>(std::max_element(row, row + vocab) - row);
      double sum = 0;
      for (int i = 0; i < vocab; ++i) sum += std::exp(double{row[i]} - row[best]);
      tokens.push_back(best);
      logprobs.push_back(static_cast<float>(-std::log(sum)));
    }
    return absl::OkStatus();
  }
  bool has_device_sampling() const override { return true; }
  absl::Status ForwardSample(const ForwardBatch& batch, absl::Span<const int32_t> rows,
                             absl::Span<const SampleInput> inputs, std::vector<SampleResult>& out,
                             const LateMasks* late_masks = nullptr) override {
    ++sample_calls;
    for (size_t s = 0; late_masks != nullptr && s < inputs.size(); ++s) {
      if (!inputs[s].allowed.empty()) return absl::InternalError("a mask both before and after the forward pass");
    }
    PackedSamples packed;
    RETURN_IF_ERROR(PackSamples(rows, inputs, config().vocab_size,
                                static_cast<int64_t>(batch.logits_rows.size()), &packed));
    std::vector<float> logits;
    RETURN_IF_ERROR(inner_->Forward(batch, logits));
    if (late_masks != nullptr) {  // as CudaLlamaModel: asked for after the forward pass
      ++late_mask_calls;
      ASSIGN_OR_RETURN(absl::Span<const std::vector<uint32_t>> masks, (*late_masks)());
      if (masks.size() != inputs.size()) return absl::InvalidArgumentError("late masks: one per sample");
      packed.masks.clear();
      for (size_t s = 0; s < masks.size(); ++s) {
        RETURN_IF_ERROR(PackMask(masks[s], config().vocab_size, &packed.params[s], &packed));
      }
    }
    out.resize(inputs.size());
    SampleRowsOnHost(logits, config().vocab_size, packed, absl::MakeSpan(out));
    return absl::OkStatus();
  }
  absl::Status CopyKv(absl::Span<const KvCopy> copies) override { return inner_->CopyKv(copies); }
  absl::Status ReadChunk(int32_t chunk, absl::Span<uint8_t> out) override { return inner_->ReadChunk(chunk, out); }
  int64_t kv_chunk_bytes() const override { return inner_->kv_chunk_bytes(); }
  absl::Status WriteChunk(int32_t chunk, absl::Span<const uint8_t> in) override {
    return inner_->WriteChunk(chunk, in);
  }

  int host_calls = 0;
  int greedy_calls = 0;
  int sample_calls = 0;
  int late_mask_calls = 0;  // ForwardSample calls whose masks came after the forward pass

 private:
  std::unique_ptr<LlamaModel> inner_;
};

}  // namespace chunkattn::testing

#endif  // CHUNKATTN_WORKERS_TESTS_DEVICE_SAMPLING_MODEL_H_
