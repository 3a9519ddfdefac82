#include "kernels/api/decode_plan.h"

#include <limits>

#include "absl/strings/str_format.h"

namespace chunkattn {

const char* DecodeImplName(DecodeImpl impl) { return impl == DecodeImpl::kTpp ? "tpp" : "seq"; }

absl::StatusOr<DecodePlan> PlanDecode(const ChunkContext& ctx, int64_t num_pool_chunks) {
  const int n = ctx.num_seqs();
  const int ns = ctx.num_shared();
  const size_t table = ctx.private_chunk.size();
  if (ctx.seq_len.size() != static_cast<size_t>(n) || ctx.private_begin.size() != static_cast<size_t>(n) ||
      ctx.private_end.size() != static_cast<size_t>(n) || ctx.shared_begin.size() != static_cast<size_t>(ns) ||
      ctx.shared_end.size() != static_cast<size_t>(ns) || ctx.shared_tokens.size() != static_cast<size_t>(ns) ||
      ctx.private_tokens.size() != table) {
    return absl::InvalidArgumentError("chunk context: array sizes disagree");
  }
  auto bad_chunk = [&](int32_t c) { return c < 0 || c >= num_pool_chunks; };
  DecodePlan plan;
  plan.version = ctx.version;
  plan.num_seqs = n;
  plan.num_shared = ns;
  plan.table_size = static_cast<int>(table);
  std::vector<int32_t> covering(n + 1, 0);
  for (int k = 0; k < ns; ++k) {
    const int32_t b = ctx.shared_begin[k], e = ctx.shared_end[k];
    if (b < 0 || e <= b || e > n || bad_chunk(ctx.shared_chunk[k])) {
      return absl::InvalidArgumentError(
          absl::StrFormat("chunk context: shared entry %d (chunk %d, [%d, %d)) is out of range", k,
                          ctx.shared_chunk[k], b, e));
    }
    if (plan.runs.empty() || plan.runs.back().begin != b || plan.runs.back().end != e) {
      DecodePlan::Run run;
      run.first = k;
      run.begin = b;
      run.end = e;
      run.slot = static_cast<int32_t>(plan.num_slots);
      plan.num_slots += e - b;
      if (plan.num_slots > std::numeric_limits<int32_t>::max()) {
        return absl::InvalidArgumentError("chunk context: too many partial states");
      }
      plan.runs.push_back(run);
      for (int s = b; s < e; ++s) ++covering[s + 1];
    }
    plan.runs.back().last = k + 1;
  }
  for (int s = 0; s < n; ++s) {
    const int32_t b = ctx.private_begin[s], e = ctx.private_end[s];
    if (b < 0 || e < b || static_cast<size_t>(e) > table) {
      return absl::InvalidArgumentError(
          absl::StrFormat("chunk context: private range [%d, %d) of sequence %d is out of range", b, e, s));
    }
    for (int32_t i = b; i < e; ++i) {
      if (bad_chunk(ctx.private_chunk[i])) {
        return absl::InvalidArgumentError(
            absl::StrFormat("chunk context: private chunk %d outside the pool", ctx.private_chunk[i]));
      }
    }
    if (covering[s + 1] == 0 && e == b) {
      return absl::InvalidArgumentError(absl::StrFormat("chunk context: sequence %d has no chunks", s));
    }
  }
  for (int s = 0; s < n; ++s) covering[s + 1] += covering[s];
  plan.seq_run_begin = covering;
  plan.seq_runs.resize(covering[n]);
  for (int r = 0; r < static_cast<int>(plan.runs.size()); ++r) {
    for (int s = plan.runs[r].begin; s < plan.runs[r].end; ++s) plan.seq_runs[covering[s]++] = r;
  }
  return plan;
}

}  // namespace chunkattn
