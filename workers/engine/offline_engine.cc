#include "workers/engine/offline_engine.h"

#include <algorithm>
#include <numeric>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "kernels/api/status_macros.h"
#include "workers/model/context_builder.h"

namespace chunkattn {

absl::StatusOr<std::vector<GenerationResult>> OfflineEngine::Generate(
    const std::vector<GenerationRequest>& requests, GenerationStats* stats,
    const LogitsObserver& observer) {
  const ModelConfig& config = model_->config();
  const int c = model_->options().chunk_size;
  const int vocab = config.vocab_size;
  const int n = static_cast<int>(requests.size());
  for (int r = 0; r < n; ++r) {
    const GenerationRequest& q = requests[r];
    if (q.prompt.empty()) {
      return absl::InvalidArgumentError(absl::StrFormat("request %d: prompt is empty", r));
    }
    for (int32_t t : q.prompt) {
      if (t < 0 || t >= vocab) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "request %d: prompt token %d is outside the vocabulary of %d", r, t, vocab));
      }
    }
    if (q.max_new_tokens < 1 ||
        static_cast<int64_t>(q.prompt.size()) + q.max_new_tokens > config.max_context) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "request %d: max_new_tokens %d must be >= 1 and with the %d prompt tokens fit the "
          "context of %d",
          r, q.max_new_tokens, q.prompt.size(), config.max_context));
    }
    RETURN_IF_ERROR(ValidateSamplingParams(q.sampling));
  }
  if (n == 0) return std::vector<GenerationResult>();

  // Context order: sorted by prompt, so sequences sharing a chunk are adjacent.
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return requests[a].prompt < requests[b].prompt; });
  std::vector<std::vector<int32_t>> paths(n);  // in context order
  std::vector<int> shared_depth(n, 0);          // leading chunks computed by an earlier sequence
  int32_t next_chunk = 0;
  int64_t needed = 0;
  for (int i = 0; i < n; ++i) {
    const auto& prompt = requests[order[i]].prompt;
    const int full = static_cast<int>(prompt.size()) / c;
    if (i > 0 && share_prefixes_) {
      const auto& prev = requests[order[i - 1]].prompt;
      const int prev_full = static_cast<int>(prev.size()) / c;
      int k = 0;
      while (k < std::min(full, prev_full) &&
             std::equal(prompt.begin() + k * c, prompt.begin() + (k + 1) * c, prev.begin() + k * c)) {
        paths[i].push_back(paths[i - 1][k]);
        ++k;
      }
      shared_depth[i] = k;
    }
    const int total = static_cast<int>(
        (prompt.size() + requests[order[i]].max_new_tokens - 1 + c - 1) / c);
    needed += total - shared_depth[i];
    while (static_cast<int>(paths[i].size()) < (static_cast<int>(prompt.size()) + c - 1) / c) {
      paths[i].push_back(next_chunk++);
    }
  }
  if (needed > model_->options().num_kv_chunks) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "the batch needs %d KV chunks, the pool has %d", needed, model_->options().num_kv_chunks));
  }

  std::vector<GenerationResult> results(n);
  GenerationStats local;
  std::vector<std::vector<int32_t>> seqs(n);  // prompt + generated, context order
  std::vector<int> rows;
  std::vector<float> logits;

  // One prefill step for every prompt; sequences skip their shared chunks.
  ForwardBatch prefill;
  prefill.prefill.q_begin.push_back(0);
  prefill.prefill.chunk_begin.push_back(0);
  for (int i = 0; i < n; ++i) {
    const auto& prompt = requests[order[i]].prompt;
    seqs[i] = prompt;
    const int skip = shared_depth[i] * c;
    prefill.tokens.insert(prefill.tokens.end(), prompt.begin() + skip, prompt.end());
    prefill.prefill.prefix_len.push_back(skip);
    prefill.prefill.q_begin.push_back(static_cast<int32_t>(prefill.tokens.size()));
    prefill.prefill.chunk_ids.insert(prefill.prefill.chunk_ids.end(), paths[i].begin(), paths[i].end());
    prefill.prefill.chunk_begin.push_back(static_cast<int32_t>(prefill.prefill.chunk_ids.size()));
    prefill.logits_rows.push_back(static_cast<int32_t>(prefill.tokens.size()) - 1);
    results[order[i]].cached_prompt_tokens = skip;
    local.prompt_tokens += static_cast<int64_t>(prompt.size());
    local.cached_prompt_tokens += skip;
  }
  std::vector<int> running(n);  // context indices still generating
  std::iota(running.begin(), running.end(), 0);
  // Runs `batch` (logits row k for running[k]) and samples its rows: on the
  // model's device when it can (only the picks come back) and nobody
  // watches the logits, else through the host Sampler.
  std::vector<SampleResult> sampled;
  std::vector<int32_t> sample_rows;
  auto run_step = [&](const ForwardBatch& batch, int step) -> absl::Status {
    std::vector<SampleInput> inputs(running.size());
    sample_rows.resize(running.size());
    for (size_t k = 0; k < running.size(); ++k) {
      const int i = running[k];
      inputs[k].params = &requests[order[i]].sampling;
      inputs[k].history = seqs[i];
      inputs[k].step = static_cast<uint64_t>(step);
      sample_rows[k] = static_cast<int32_t>(k);
    }
    if (!observer && model_->has_device_sampling()) {
      RETURN_IF_ERROR(model_->ForwardSample(batch, sample_rows, inputs, sampled));
      for (size_t k = 0; k < sampled.size(); ++k) {
        if (sampled[k].token < 0) {
          return absl::InvalidArgumentError(absl::StrFormat(
              "the logits of request %d have a +inf logit or no finite logit", order[running[k]]));
        }
      }
      return absl::OkStatus();
    }
    RETURN_IF_ERROR(model_->Forward(batch, logits));
    if (observer) {
      rows.clear();
      for (int i : running) rows.push_back(order[i]);
      observer(step, rows, logits);
    }
    sampled.resize(running.size());
    return sampler_.Sample(logits, vocab, inputs, absl::MakeSpan(sampled));
  };
  RETURN_IF_ERROR(run_step(prefill, 0));

  uint64_t version = 1;
  for (int step = 0;; ++step) {
    ++local.steps;

    std::vector<int> still;
    for (size_t k = 0; k < running.size(); ++k) {
      const int i = running[k];
      const GenerationRequest& q = requests[order[i]];
      GenerationResult& res = results[order[i]];
      const int32_t token = sampled[k].token;
      res.tokens.push_back(token);
      res.logprobs.push_back(sampled[k].logprob);
      seqs[i].push_back(token);
      ++local.generated_tokens;
      const bool eos = !q.ignore_eos && std::count(config.eos_token_ids.begin(),
                                                   config.eos_token_ids.end(), token) > 0;
      const bool stop = std::count(q.stop_token_ids.begin(), q.stop_token_ids.end(), token) > 0;
      if (eos || stop) {
        res.finish_reason = "stop";
      } else if (static_cast<int>(res.tokens.size()) >= q.max_new_tokens) {
        res.finish_reason = "length";
      } else {
        still.push_back(i);
      }
    }
    if (still.size() != running.size()) ++version;
    running = std::move(still);
    if (running.empty()) break;

    // The sampled token is fed back: it gets a slot, in a new chunk if the
    // last one is full.
    std::vector<std::vector<int32_t>> ctx_paths;
    std::vector<int32_t> lens;
    ForwardBatch decode;
    int64_t physical = 0, logical = 0;
    std::vector<int32_t> seen;
    for (int i : running) {
      const int len = static_cast<int>(seqs[i].size());
      if ((len + c - 1) / c > static_cast<int>(paths[i].size())) {
        paths[i].push_back(next_chunk++);
        ++version;
      }
      ctx_paths.push_back(paths[i]);
      lens.push_back(len);
      decode.tokens.push_back(seqs[i].back());
      decode.logits_rows.push_back(static_cast<int32_t>(decode.logits_rows.size()));
      logical += static_cast<int64_t>(paths[i].size());
      seen.insert(seen.end(), paths[i].begin(), paths[i].end());
    }
    std::sort(seen.begin(), seen.end());
    physical = std::unique(seen.begin(), seen.end()) - seen.begin();
    local.peak_chunks = std::max(local.peak_chunks, physical);
    local.peak_logical_chunks = std::max(local.peak_logical_chunks, logical);
    ASSIGN_OR_RETURN(ChunkContext ctx, BuildChunkContext(ctx_paths, lens, c, version));
    decode.decode = &ctx;
    RETURN_IF_ERROR(run_step(decode, step + 1));
  }
  if (stats != nullptr) *stats = local;
  return results;
}

}  // namespace chunkattn
