// chunkattn-generate: runs prompts through a model folder on the CPU or a
// GPU (--device cuda:N, builds with CUDA) with the coordinator's scheduler in
// process (services/offline/offline_engine.h), sharing the KV of common prompt prefixes
// as the served path does, and prints the completions and the cache figures. With
// --tp_size N (CPU), start N processes (ranks 0..N-1) with the same flags and
// a shared --gloo_store directory; rank 0 prints.
//
//   chunkattn-generate --model DIR --prompt "To be, or not to be"
//   chunkattn-generate --model DIR --prompts_file FILE --system_prompt "..."
//   chunkattn-generate --model DIR --prompt_ids 1,450,4996 (no tokenizer needed)
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "base/device.h"
#include "base/status_macros.h"
#include "proto/model/model_config.h"
#include "services/offline/offline_engine.h"
#include "text/detokenizer.h"
#include "text/tokenizer.h"
#include "workers/collectives/gloo_communicator.h"
#include "workers/model/gpu_model.h"
#include "workers/model/llama.h"
#include "workers/model/weights.h"

ABSL_FLAG(std::string, model, "", "Hugging Face model folder (config.json + safetensors)");
ABSL_FLAG(std::string, load_format, "safetensors", "safetensors | dummy (seeded random weights)");
ABSL_FLAG(std::string, prompt, "", "one prompt's text (--prompts_file for several)");
ABSL_FLAG(std::string, prompts_file, "", "one prompt per line");
ABSL_FLAG(std::string, system_prompt, "", "text put before every prompt (shared prefix)");
ABSL_FLAG(std::vector<std::string>, prompt_ids, {},
          "the prompt as comma-separated token ids (for models without a tokenizer)");
ABSL_FLAG(int, random_prompts, 0,
          "add N random token-id prompts (for benchmarks on dummy weights, no tokenizer needed)");
ABSL_FLAG(int, prompt_len, 512, "tokens per random prompt");
ABSL_FLAG(int, shared_len, 0, "leading tokens every random prompt has in common");
ABSL_FLAG(int, max_new_tokens, 32, "tokens to generate per prompt");
ABSL_FLAG(double, temperature, 0.0, "0 = greedy");
ABSL_FLAG(int, top_k, 0, "0 = off");
ABSL_FLAG(double, top_p, 1.0, "nucleus mass in (0, 1]");
ABSL_FLAG(double, min_p, 0.0, "in [0, 1]");
ABSL_FLAG(double, repetition_penalty, 1.0, "> 0; 1 = off");
ABSL_FLAG(uint64_t, seed, 0, "sampling seed (request i uses seed + i)");
ABSL_FLAG(bool, ignore_eos, false, "keep going past the end-of-sequence token");
ABSL_FLAG(int, chunk_size, 64, "tokens per KV chunk");
ABSL_FLAG(int, kv_chunks, 0, "KV pool capacity in chunks; 0 = enough for the batch unshared");
ABSL_FLAG(bool, prefix_sharing, true, "share the KV chunks of common prompt prefixes");
ABSL_FLAG(int64_t, host_kv_cache_mib, 0,
          "host KV tier, MiB of RAM: blocks the pool evicts are kept there and loaded back instead of "
          "recomputed (pinned memory on a GPU); 0 = off");
ABSL_FLAG(std::string, disk_kv_cache_dir, "",
          "disk KV tier: an existing directory for its one file (mode 0600, removed at exit); empty = off");
ABSL_FLAG(int64_t, disk_kv_cache_mib, 0, "disk KV tier budget, MiB (> 0 with --disk_kv_cache_dir)");
ABSL_FLAG(std::string, kv_tier_write_policy, "write_back",
          "write_back keeps a block in the tiers when the pool evicts it; write_through as soon as it is computed");
ABSL_FLAG(int, max_batch_size, 256, "most sequences in one step");
ABSL_FLAG(int, max_tokens_per_step, 2048, "most input rows in one step (longer prompts are prefilled in pieces)");
ABSL_FLAG(std::string, decode_impl, "tpp", "tpp | seq (decode attention)");
ABSL_FLAG(int, threads, 0, "attention threads (0 = one per core)");
ABSL_FLAG(std::string, cpu_isa, "best",
          "CPU kernels: best | avx512 | avx2 | portable (the same tokens: avx512 gives avx2's results bit for bit)");
ABSL_FLAG(std::string, device, "cpu", "cpu | cuda | cuda:N (builds with CUDA)");
ABSL_FLAG(std::string, dtype, "auto",
          "GPU weights, activations and KV: auto (the model's bfloat16, else float16) | float16 | bfloat16");
ABSL_FLAG(std::string, weight_dtype, "auto",
          "CPU weight matrices: auto (as the checkpoint stores them; dummy weights: the config's torch_dtype) | "
          "float32 | float16 | bfloat16 | int8 (weight-only, one fp16 scale per 32 columns)");
ABSL_FLAG(bool, cuda_graphs, true, "replay decode steps from CUDA graphs (GPU)");
ABSL_FLAG(int, tp_size, 1, "tensor-parallel world size");
ABSL_FLAG(int, tp_rank, 0, "this process's rank");
ABSL_FLAG(std::string, gloo_store, "", "shared directory for the Gloo rendezvous (tp_size > 1)");
ABSL_FLAG(std::string, logits_out, "",
          "write every step's logits (fp32, rows in request order) to this file");

namespace chunkattn {
namespace {

absl::StatusOr<std::vector<int32_t>> ParseIds(const std::vector<std::string>& parts) {
  std::vector<int32_t> ids;
  for (const std::string& p : parts) {
    int32_t id;
    if (!absl::SimpleAtoi(p, &id)) {
      return absl::InvalidArgumentError("--prompt_ids: \"" + p + "\" is not a token id");
    }
    ids.push_back(id);
  }
  return ids;
}

// The model on GPU `device`, in --dtype, with its pool sized as `options`
// says and a workspace for steps of up to `max_rows` tokens and `max_batch`
// decoding sequences.
absl::StatusOr<std::unique_ptr<Model>> CreateCudaModel(const ModelConfig& config, ModelWeights weights,
                                                       ModelOptions options, const DeviceSpec& device,
                                                       int64_t max_rows, int max_batch) {
  const std::string dtype = absl::GetFlag(FLAGS_dtype);
  if (dtype == "auto") {
    options.kv_dtype = DefaultGpuDType(config);
  } else if (dtype == "float16" || dtype == "bfloat16") {
    options.kv_dtype = *ParseDType(dtype);
  } else {
    return absl::InvalidArgumentError("--dtype must be auto, float16 or bfloat16, got " + dtype);
  }
  GpuModelOptions gpu;
  gpu.device = device.index;
  gpu.cuda_graphs = absl::GetFlag(FLAGS_cuda_graphs);
  gpu.max_rows = max_rows;
  gpu.max_batch = max_batch;
  ASSIGN_OR_RETURN(std::unique_ptr<GpuModel> model,
                   CreateGpuModel(config, std::move(weights), options, gpu, /*group=*/nullptr));
  return std::unique_ptr<Model>(std::move(model));
}

absl::Status Run() {
  const std::string dir = absl::GetFlag(FLAGS_model);
  if (dir.empty()) return absl::InvalidArgumentError("--model is required");
  const int tp = absl::GetFlag(FLAGS_tp_size), rank = absl::GetFlag(FLAGS_tp_rank);
  ASSIGN_OR_RETURN(const DeviceSpec device, ParseDevice(absl::GetFlag(FLAGS_device)));
  RETURN_IF_ERROR(CheckDevice(device));
  if (device.cuda && tp > 1) {
    return absl::UnimplementedError("--tp_size > 1 runs on the CPU here; GPU tensor parallelism is the workers'");
  }
  ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(dir));
  const std::string format = absl::GetFlag(FLAGS_load_format);
  ASSIGN_OR_RETURN(const WeightDType weight_dtype, ParseWeightDType(absl::GetFlag(FLAGS_weight_dtype)));
  ModelWeights weights;
  if (format == "dummy") {
    ASSIGN_OR_RETURN(weights, DummyWeights(config, {rank, tp}, absl::GetFlag(FLAGS_seed), weight_dtype));
  } else if (format == "safetensors") {
    ASSIGN_OR_RETURN(weights, LoadWeights(dir, config, {rank, tp}, weight_dtype));
  } else {
    return absl::InvalidArgumentError("--load_format must be safetensors or dummy");
  }
  std::unique_ptr<Communicator> comm;
  if (tp > 1) {
    GlooOptions g;
    g.rank = rank;
    g.world_size = tp;
    g.store_path = absl::GetFlag(FLAGS_gloo_store);
    ASSIGN_OR_RETURN(comm, ConnectGloo(g));
  }
  ModelOptions options;
  options.chunk_size = absl::GetFlag(FLAGS_chunk_size);
  // Prompts: ids, or text through the folder's tokenizer.
  std::unique_ptr<Tokenizer> tokenizer;
  auto loaded = LoadTokenizer(dir);
  if (loaded.ok()) tokenizer = std::move(*loaded);
  std::vector<std::string> texts;
  if (!absl::GetFlag(FLAGS_prompt).empty()) texts.push_back(absl::GetFlag(FLAGS_prompt));
  if (!absl::GetFlag(FLAGS_prompts_file).empty()) {
    std::ifstream in(absl::GetFlag(FLAGS_prompts_file));
    if (!in) return absl::NotFoundError("--prompts_file: cannot open " + absl::GetFlag(FLAGS_prompts_file));
    for (std::string line; std::getline(in, line);) {
      if (!line.empty()) texts.push_back(line);
    }
  }
  std::vector<GenerationRequest> requests;
  std::vector<std::string> labels;  // what to print as each request's prompt
  if (!absl::GetFlag(FLAGS_prompt_ids).empty()) {
    GenerationRequest r;
    ASSIGN_OR_RETURN(r.prompt, ParseIds(absl::GetFlag(FLAGS_prompt_ids)));
    requests.push_back(r);
    labels.push_back("(token ids)");
  }
  if (!texts.empty() && tokenizer == nullptr) {
    return absl::FailedPreconditionError(
        "text prompts need a tokenizer.model in the model folder: " + loaded.status().ToString() +
        " (use --prompt_ids)");
  }
  for (const std::string& text : texts) {
    GenerationRequest r;
    ASSIGN_OR_RETURN(r.prompt, tokenizer->Encode(absl::GetFlag(FLAGS_system_prompt) + text, true));
    requests.push_back(r);
    labels.push_back(text);
  }
  if (absl::GetFlag(FLAGS_random_prompts) > 0) {
    const int len = absl::GetFlag(FLAGS_prompt_len), shared = absl::GetFlag(FLAGS_shared_len);
    if (len < 1 || shared < 0 || shared > len) {
      return absl::InvalidArgumentError("--prompt_len must be >= 1 and --shared_len in [0, prompt_len]");
    }
    uint64_t state = absl::GetFlag(FLAGS_seed) * 0x9e3779b97f4a7c15ull + 1;
    auto next = [&] {  // xorshift: any tokens will do, they only need to differ
      state ^= state << 13;
      state ^= state >> 7;
      state ^= state << 17;
      return static_cast<int32_t>(state % static_cast<uint64_t>(config.vocab_size));
    };
    std::vector<int32_t> prefix(shared);
    for (int32_t& t : prefix) t = next();
    for (int i = 0; i < absl::GetFlag(FLAGS_random_prompts); ++i) {
      GenerationRequest r;
      r.prompt = prefix;
      while (static_cast<int>(r.prompt.size()) < len) r.prompt.push_back(next());
      requests.push_back(r);
      labels.push_back(absl::StrFormat("(random, %d tokens, %d shared)", len, shared));
    }
  }
  if (requests.empty()) return absl::InvalidArgumentError("give --prompt, --prompts_file or --prompt_ids");
  for (size_t i = 0; i < requests.size(); ++i) {
    GenerationRequest& r = requests[i];
    r.max_new_tokens = absl::GetFlag(FLAGS_max_new_tokens);
    r.ignore_eos = absl::GetFlag(FLAGS_ignore_eos);
    r.sampling.temperature = static_cast<float>(absl::GetFlag(FLAGS_temperature));
    r.sampling.top_k = absl::GetFlag(FLAGS_top_k);
    r.sampling.top_p = static_cast<float>(absl::GetFlag(FLAGS_top_p));
    r.sampling.min_p = static_cast<float>(absl::GetFlag(FLAGS_min_p));
    r.sampling.repetition_penalty = static_cast<float>(absl::GetFlag(FLAGS_repetition_penalty));
    r.sampling.seed = absl::GetFlag(FLAGS_seed) + i;
  }

  options.num_kv_chunks = absl::GetFlag(FLAGS_kv_chunks);
  if (options.num_kv_chunks == 0) {
    for (const GenerationRequest& r : requests) {
      options.num_kv_chunks +=
          (static_cast<int64_t>(r.prompt.size()) + r.max_new_tokens + options.chunk_size - 1) /
          options.chunk_size;
    }
  }
  const std::string impl = absl::GetFlag(FLAGS_decode_impl);
  if (impl != "tpp" && impl != "seq") return absl::InvalidArgumentError("--decode_impl: tpp or seq");
  options.decode_impl = impl == "tpp" ? DecodeImpl::kTpp : DecodeImpl::kSequence;
  ASSIGN_OR_RETURN(options.cpu_isa, cpu::ParseIsa(absl::GetFlag(FLAGS_cpu_isa)));
  OfflineEngineOptions engine_options;
  engine_options.max_batch_size = absl::GetFlag(FLAGS_max_batch_size);
  engine_options.max_tokens_per_step = absl::GetFlag(FLAGS_max_tokens_per_step);
  engine_options.prefix_sharing = absl::GetFlag(FLAGS_prefix_sharing);
  if (engine_options.max_batch_size < 1 || engine_options.max_tokens_per_step < 1) {
    return absl::InvalidArgumentError("--max_batch_size and --max_tokens_per_step must be >= 1");
  }
  ASSIGN_OR_RETURN(engine_options.tiers,
                   KvTierOptionsFromFlags(absl::GetFlag(FLAGS_host_kv_cache_mib), absl::GetFlag(FLAGS_disk_kv_cache_dir),
                                          absl::GetFlag(FLAGS_disk_kv_cache_mib)));
  ASSIGN_OR_RETURN(engine_options.tier_write_through,
                   ParseKvTierWritePolicy(absl::GetFlag(FLAGS_kv_tier_write_policy)));
  if (device.cuda) engine_options.host_allocator = AllocatePinnedHostBytes;
  ThreadPool pool(absl::GetFlag(FLAGS_threads));
  std::unique_ptr<Model> model;
  if (device.cuda) {
    // A step holds at most the token budget, or one decode row per sequence.
    const int64_t max_rows = std::max(engine_options.max_tokens_per_step, engine_options.max_batch_size);
    ASSIGN_OR_RETURN(model, CreateCudaModel(config, std::move(weights), options, device, max_rows,
                                            engine_options.max_batch_size));
  } else {
    ASSIGN_OR_RETURN(model, LlamaModel::Create(config, std::move(weights), options, comm.get(), &pool));
  }

  std::ofstream logits_out;
  if (!absl::GetFlag(FLAGS_logits_out).empty()) {
    logits_out.open(absl::GetFlag(FLAGS_logits_out), std::ios::binary | std::ios::trunc);
    if (!logits_out) return absl::PermissionDeniedError("--logits_out: cannot create the file");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<OfflineEngine> engine, OfflineEngine::Create(model.get(), engine_options));
  GenerationStats stats;
  const absl::Time start = absl::Now();
  // Only an observer that writes sees the logits: without one, a GPU model
  // samples on the device and sends back the picks alone.
  if (logits_out.is_open()) {
    engine->set_logits_observer([&](const std::vector<int>&, absl::Span<const float> logits) {
      logits_out.write(reinterpret_cast<const char*>(logits.data()), logits.size() * sizeof(float));
    });
  }
  ASSIGN_OR_RETURN(auto results, engine->Generate(requests, &stats));
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  if (rank != 0) return absl::OkStatus();
  for (size_t i = 0; i < results.size() && i < 16; ++i) {
    const GenerationResult& r = results[i];
    std::string text;
    if (tokenizer != nullptr) {
      IncrementalDetokenizer detok(tokenizer.get(), requests[i].prompt);
      for (int32_t t : r.tokens) {
        ASSIGN_OR_RETURN(std::string piece, detok.Append(t));
        text += piece;
      }
      ASSIGN_OR_RETURN(std::string rest, detok.Flush());
      text += rest;
    }
    std::printf("[%zu]\n", i);
    std::printf("    prompt: %s\n", labels[i].c_str());
    std::printf("    output: %s\n", text.c_str());
    std::printf("    tokens:");
    for (int32_t t : r.tokens) std::printf(" %d", t);
    std::printf("\n    finish: %s, cached prompt tokens %d of %zu\n", r.finish_reason.c_str(),
                r.cached_prompt_tokens, requests[i].prompt.size());
  }
  std::printf(
      "requests %zu, prompt tokens %lld (cached %lld, %.1f%%), generated %lld in %d steps, "
      "%.2f s (%.1f tokens/s) on %s\n",
      requests.size(), static_cast<long long>(stats.prompt_tokens),
      static_cast<long long>(stats.cached_prompt_tokens),
      100.0 * stats.cached_prompt_tokens / std::max<int64_t>(1, stats.prompt_tokens),
      static_cast<long long>(stats.generated_tokens), stats.steps, seconds,
      stats.generated_tokens / std::max(seconds, 1e-9), model->device().c_str());
  if (stats.steps > 1) {
    std::printf("steps after the first: %.3f ms each (first step %.3f ms)\n",
                1e3 * (stats.steps_seconds - stats.first_step_seconds) / (stats.steps - 1),
                1e3 * stats.first_step_seconds);
  }
  if (stats.tier_writes + stats.tier_loads > 0) {
    std::printf("KV tiers: %lld blocks written, %lld loaded back instead of recomputed\n",
                static_cast<long long>(stats.tier_writes), static_cast<long long>(stats.tier_loads));
  }
  if (stats.peak_logical_chunks > 0) {
    std::printf("KV chunks at peak: %lld physical for %lld logical (%.1f%% saved by sharing)\n",
                static_cast<long long>(stats.peak_chunks),
                static_cast<long long>(stats.peak_logical_chunks),
                100.0 * (1.0 - double(stats.peak_chunks) / stats.peak_logical_chunks));
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace chunkattn

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("chunkattn-generate --model DIR --prompt TEXT ...");
  absl::ParseCommandLine(argc, argv);
  const absl::Status st = chunkattn::Run();
  if (!st.ok()) {
    std::fprintf(stderr, "chunkattn-generate: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}
