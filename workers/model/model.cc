#include "workers/model/model.h"

#include "absl/strings/str_format.h"
#include "base/status_macros.h"

namespace chunkattn {

absl::Status Model::ForwardGreedy(const ForwardBatch&, std::vector<int32_t>&, std::vector<float>&) {
  return absl::UnimplementedError("this model picks greedy tokens on the host (Sampler)");
}

absl::Status Model::ForwardSample(const ForwardBatch&, absl::Span<const int32_t>, absl::Span<const SampleInput>,
                                  std::vector<SampleResult>&, const LateMasks*) {
  return absl::UnimplementedError("this model samples on the host (Sampler)");
}

DType DefaultGpuDType(const ModelConfig& config) {
  return config.dtype == DType::kBFloat16 ? DType::kBFloat16 : DType::kFloat16;
}

KvGeometry KvShapeOf(const ModelConfig& config, const ShardLayout& layout, const ModelOptions& options) {
  KvGeometry shape;
  shape.num_layers = config.num_layers;
  shape.num_kv_heads = layout.num_kv_heads;
  shape.head_dim = config.head_dim;
  shape.chunk_size = options.chunk_size;
  shape.dtype = options.kv_dtype;
  return shape;
}

absl::Status CheckShardMatchesGroup(const ShardLayout& l, int rank, int world_size) {
  if (world_size != l.world_size || rank != l.rank) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "weights are shard %d of %d but the communicator is rank %d of %d", l.rank, l.world_size, rank,
        world_size));
  }
  return absl::OkStatus();
}

absl::Status StepRows::Plan(const ForwardBatch& batch, const ModelConfig& config, int c,
                            int64_t num_chunks) {
  positions_.clear();
  slots_.clear();
  const PrefillBatch& pre = batch.prefill;
  const int64_t prefill_rows = pre.num_seqs() > 0 ? pre.num_tokens() : 0;
  if (pre.num_seqs() > 0) RETURN_IF_ERROR(ValidatePrefillBatch(pre, c, num_chunks));
  const ChunkContext* ctx = batch.decode;
  const int decode_rows = ctx == nullptr ? 0 : ctx->num_seqs();
  const int64_t rows = static_cast<int64_t>(batch.tokens.size());
  if (rows == 0 || rows != prefill_rows + decode_rows) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "batch has %d tokens but %d prefill and %d decode rows", rows, prefill_rows, decode_rows));
  }
  for (int64_t r = 0; r < rows; ++r) {
    if (batch.tokens[r] < 0 || batch.tokens[r] >= config.vocab_size) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "token %d at row %d is outside the vocabulary of %d", batch.tokens[r], r,
          config.vocab_size));
    }
  }
  for (int32_t r : batch.logits_rows) {
    if (r < 0 || r >= rows) {
      return absl::InvalidArgumentError(absl::StrFormat("logits row %d is not a row of the batch", r));
    }
  }
  std::vector<int32_t> positions(rows);
  std::vector<int64_t> slots(rows);
  for (int s = 0; s < pre.num_seqs(); ++s) {
    for (int64_t r = pre.q_begin[s]; r < pre.q_begin[s + 1]; ++r) {
      const int64_t pos = pre.prefix_len[s] + (r - pre.q_begin[s]);
      positions[r] = static_cast<int32_t>(pos);
      slots[r] = int64_t{pre.chunk_ids[pre.chunk_begin[s] + pos / c]} * c + pos % c;
    }
  }
  if (ctx != nullptr) {
    if (ctx->chunk_size != c) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "decode context has chunk size %d, the pool %d", ctx->chunk_size, c));
    }
    if (!have_plan_ || plan_.version != ctx->version) {
      have_plan_ = false;
      RETURN_IF_ERROR(ValidateChunkContext(*ctx, num_chunks));
      ASSIGN_OR_RETURN(plan_, PlanDecode(*ctx, num_chunks));
      have_plan_ = true;
    }
    // The new token is the last one of its sequence: its slot is in the last
    // chunk of the path (private if it has any, else its deepest shared one).
    // The plan's runs covering s, in table order, give its shared chunks.
    for (int s = 0; s < decode_rows; ++s) {
      int num_shared = 0;
      int32_t last_shared = -1;
      for (int32_t i = plan_.seq_run_begin[s]; i < plan_.seq_run_begin[s + 1]; ++i) {
        const DecodePlan::Run& run = plan_.runs[plan_.seq_runs[i]];
        num_shared += run.last - run.first;
        last_shared = ctx->shared_chunk[run.last - 1];
      }
      const int64_t pos = int64_t{ctx->seq_len[s]} - 1;
      const int num_private = ctx->private_end[s] - ctx->private_begin[s];
      if (pos < 0 || pos / c != num_shared + num_private - 1) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "decode sequence %d: seq_len %d does not end in its last chunk (%d shared, %d private)",
            s, ctx->seq_len[s], num_shared, num_private));
      }
      const int32_t chunk =
          num_private > 0 ? ctx->private_chunk[ctx->private_end[s] - 1] : last_shared;
      positions[prefill_rows + s] = static_cast<int32_t>(pos);
      slots[prefill_rows + s] = int64_t{chunk} * c + pos % c;
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    if (positions[r] >= config.max_context) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "position %d at row %d is past the model's context of %d tokens", positions[r], r,
          config.max_context));
    }
  }
  prefill_rows_ = prefill_rows;
  positions_ = std::move(positions);
  slots_ = std::move(slots);
  return absl::OkStatus();
}

}  // namespace chunkattn
