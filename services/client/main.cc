// chunkattn: the command-line client of a chunkattn coordinator.
//
//   chunkattn generate --server localhost:50051 "To be, or not to be"
//   chunkattn chat --server localhost:50051 --system "You are terse."
//   chunkattn info --server localhost:50051
//   chunkattn replay --server localhost:50051 --requests 32 --concurrency 8
//       --system_prompt_file data/demo/system_prompt.txt --prompts_file data/demo/prompts.txt
//
// Exit status: 0 on success, 1 when an RPC fails (the line "error: CODE:
// message" on stderr), 2 when the command line is wrong (before any RPC).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unistd.h>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/file.h"
#include "base/flags.h"
#include "services/client/chat.h"
#include "services/client/client.h"
#include "services/client/replay.h"
#include "services/client/stats_watch.h"

ABSL_FLAG(std::string, server, "", "the coordinator, HOST:PORT");
ABSL_FLAG(double, timeout_s, 600, "deadline of every RPC, seconds");
ABSL_FLAG(bool, tls, false, "connect with TLS (the system's roots unless --tls_ca_file)");
ABSL_FLAG(std::string, tls_ca_file, "", "PEM roots the server's certificate must chain to (implies --tls)");
ABSL_FLAG(std::string, tls_server_name, "", "name checked against the certificate (default: the --server host)");
ABSL_FLAG(std::string, auth_token_file, "",
          "file whose first line is the bearer token (default: $CHUNKATTN_AUTH_TOKEN, if set)");
// Sampling and stopping: unset means the server's default (replay has its own).
ABSL_FLAG(std::optional<int>, max_new_tokens, std::nullopt, ">= 1 (server default 16; replay 32)");
ABSL_FLAG(std::optional<double>, temperature, std::nullopt, ">= 0; 0 = greedy (default 1; replay 0.8)");
ABSL_FLAG(std::optional<double>, top_p, std::nullopt, "in (0, 1] (default 1; replay 0.95)");
ABSL_FLAG(std::optional<int>, top_k, std::nullopt, ">= 0; 0 = off");
ABSL_FLAG(std::optional<double>, min_p, std::nullopt, "in [0, 1]; 0 = off");
ABSL_FLAG(std::optional<double>, repetition_penalty, std::nullopt, "> 0; 1 = off");
ABSL_FLAG(std::optional<uint64_t>, seed, std::nullopt, "sampling seed (replay: request i uses seed + i; default 1)");
ABSL_FLAG(bool, ignore_eos, false, "keep generating past the end-of-sequence token");
ABSL_FLAG(int, min_tokens, 0, "generate at least this many tokens before EOS or a stop may end it");
ABSL_FLAG(std::string, stop, "", "a stop string; repeat the flag for several");
ABSL_FLAG(int, n, 1, "parallel samples of the prompt, 1..64");
ABSL_FLAG(std::string, namespace, "", "cache namespace (prefixes are shared only within one)");
ABSL_FLAG(std::string, prompt_ids, "", "the prompt as comma-separated token ids, instead of text");
ABSL_FLAG(bool, logprobs, false, "print each token's log-probability (stderr)");
ABSL_FLAG(int, top_logprobs, 0, "with --logprobs: also each position's N most likely tokens, N <= 20 (stderr)");
ABSL_FLAG(bool, add_bos, true, "tokenize: add the BOS token");
ABSL_FLAG(std::string, system_prompt_file, "", "replay: text put before every prompt; chat: the system message");
ABSL_FLAG(std::string, system, "", "chat: the system message");
ABSL_FLAG(std::string, template_kwargs, "", "chat: template variables as a JSON object, e.g. {\"enable_thinking\": false}");
ABSL_FLAG(std::string, prompts_file, "", "replay: one prompt per line (blank lines skipped)");
ABSL_FLAG(std::optional<int>, requests, std::nullopt, "replay: requests to send (default: one per prompt)");
ABSL_FLAG(int, concurrency, 8, "replay: requests in flight at once");
ABSL_FLAG(std::string, json, "", "replay: also write the summary to this file as JSON");
ABSL_FLAG(bool, watch, false, "stats: a live view, refreshed in place until Ctrl-C");
ABSL_FLAG(std::optional<double>, interval_s, std::nullopt, "stats --watch: seconds between refreshes, 0.05..3600 (default 1)");
ABSL_FLAG(std::optional<int>, count, std::nullopt, "stats --watch: refreshes before exiting (default: until Ctrl-C)");

namespace chunkattn::client {
namespace {

constexpr char kUsage[] = R"(chunkattn: client of a chunkattn coordinator (gRPC).

usage: chunkattn <subcommand> --server HOST:PORT [flags] [args]

subcommands:
  generate "TEXT"   stream a completion of TEXT (or of --prompt_ids 1,2,3) to stdout;
                    stderr gets "finish=... prompt_tokens=... cached_prompt_tokens=...
                    completion_tokens=...". Flags: --max_new_tokens --temperature --top_p
                    --top_k --min_p --repetition_penalty --seed --n --namespace --stop
                    (repeatable) --ignore_eos --min_tokens --logprobs --top_logprobs
  chat              a conversation rendered with the model's chat template: each line of stdin
                    is a user message, the reply streams to stdout, and stderr shows each
                    turn's usage and how much of its prompt the cache already held (the
                    history of the conversation). /reset starts over, /exit ends. Flags:
                    --system "TEXT" or --system_prompt_file F, --template_kwargs JSON,
                    --max_new_tokens (default 256) and the sampling flags, --namespace
  info              the model and KV cache geometry (GetModelInfo)
  tokenize "TEXT"   the model's token ids and pieces for TEXT (--add_bos=false: no BOS)
  stats             the prefix cache now and at its peak (GetCacheStats); with --watch, a live
                    view refreshed in place every --interval_s (default 1) until Ctrl-C or
                    --count refreshes: chunks used / cached / free, shared, the prompt hit
                    rate over the last interval, tokens/s, requests running and waiting
  abort ID...       ends your requests with these request ids (Abort): prints those found
  health            grpc.health.v1 status: prints SERVING (exit 0) or NOT_SERVING (exit 1)
  replay            the quick start's workload: --system_prompt_file F --prompts_file F
                    [--requests N] [--concurrency 8] [--max_new_tokens 32] [--temperature 0.8]
                    [--top_p 0.95] [--seed 1]; prints the prefix hit rate, throughput and the
                    KV memory at the peak with and without sharing

common flags:
  --server HOST:PORT    the coordinator (required)
  --timeout_s S         deadline of every RPC (default 600)
  --tls                 TLS with the system's roots; --tls_ca_file F: with these roots instead;
                        --tls_server_name N: the name the certificate must carry
  --auth_token_file F   send the bearer token in F (else $CHUNKATTN_AUTH_TOKEN, when set)

Flags take dashes or underscores (--max-new-tokens = --max_new_tokens).
Exit status: 0 ok, 1 an RPC failed, 2 bad command line.
)";

// Flag errors exit 2, RPC errors 1.
constexpr int kRpcError = 1;
constexpr int kUsageError = 2;

int UsageError(const std::string& message) {
  std::fprintf(stderr, "chunkattn: %s\n(chunkattn --help for usage)\n", message.c_str());
  return kUsageError;
}

int UsageError(const absl::Status& status) { return UsageError(std::string(status.message())); }

// Validates the sampling and stopping flags that are set into the request
// messages; unset flags stay unset (the server's default, or `defaults`).
absl::Status FillParams(const v1::SamplingParams& defaults, v1::SamplingParams* sampling,
                        v1::StoppingCriteria* stopping, std::optional<int> default_max_new_tokens) {
  *sampling = defaults;
  if (auto t = absl::GetFlag(FLAGS_temperature)) {
    if (!(*t >= 0)) return absl::InvalidArgumentError("--temperature must be >= 0");
    sampling->set_temperature(static_cast<float>(*t));
  }
  if (auto p = absl::GetFlag(FLAGS_top_p)) {
    if (!(*p > 0 && *p <= 1)) return absl::InvalidArgumentError("--top_p must be in (0, 1]");
    sampling->set_top_p(static_cast<float>(*p));
  }
  if (auto k = absl::GetFlag(FLAGS_top_k)) {
    if (*k < 0) return absl::InvalidArgumentError("--top_k must be >= 0");
    sampling->set_top_k(*k);
  }
  if (auto m = absl::GetFlag(FLAGS_min_p)) {
    if (!(*m >= 0 && *m <= 1)) return absl::InvalidArgumentError("--min_p must be in [0, 1]");
    sampling->set_min_p(static_cast<float>(*m));
  }
  if (auto r = absl::GetFlag(FLAGS_repetition_penalty)) {
    if (!(*r > 0)) return absl::InvalidArgumentError("--repetition_penalty must be > 0");
    sampling->set_repetition_penalty(static_cast<float>(*r));
  }
  if (auto s = absl::GetFlag(FLAGS_seed)) sampling->set_seed(*s);
  std::optional<int> max_new = absl::GetFlag(FLAGS_max_new_tokens);
  if (!max_new) max_new = default_max_new_tokens;
  if (max_new) {
    if (*max_new < 1) return absl::InvalidArgumentError("--max_new_tokens must be >= 1");
    stopping->set_max_new_tokens(static_cast<uint32_t>(*max_new));
  }
  stopping->set_ignore_eos(absl::GetFlag(FLAGS_ignore_eos));
  const int min_tokens = absl::GetFlag(FLAGS_min_tokens);
  if (min_tokens < 0) return absl::InvalidArgumentError("--min_tokens must be >= 0");
  stopping->set_min_tokens(static_cast<uint32_t>(min_tokens));
  return absl::OkStatus();
}

// Filled by ValidateCommon from --server and the TLS / token flags.
ChannelOptions g_channel;

absl::Status ValidateCommon() {
  if (absl::Status s = ValidateServer(absl::GetFlag(FLAGS_server)); !s.ok()) return s;
  const double t = absl::GetFlag(FLAGS_timeout_s);
  if (!(t > 0)) return absl::InvalidArgumentError("--timeout_s must be > 0");
  g_channel.server = absl::GetFlag(FLAGS_server);
  const std::string ca_file = absl::GetFlag(FLAGS_tls_ca_file);
  g_channel.tls = absl::GetFlag(FLAGS_tls) || !ca_file.empty();
  if (!ca_file.empty()) {
    absl::StatusOr<std::string> ca = ReadFileToString(ca_file);
    if (!ca.ok()) return absl::InvalidArgumentError("--tls_ca_file: " + std::string(ca.status().message()));
    g_channel.tls_ca_pem = *ca;
  }
  g_channel.tls_server_name = absl::GetFlag(FLAGS_tls_server_name);
  if (!g_channel.tls_server_name.empty() && !g_channel.tls) {
    return absl::InvalidArgumentError("--tls_server_name needs --tls or --tls_ca_file");
  }
  const std::string token_file = absl::GetFlag(FLAGS_auth_token_file);
  if (!token_file.empty()) {
    absl::StatusOr<std::vector<std::string>> lines = ReadLines(token_file);
    if (!lines.ok()) return absl::InvalidArgumentError("--auth_token_file: " + std::string(lines.status().message()));
    if (lines->empty()) return absl::InvalidArgumentError("--auth_token_file " + token_file + " is empty");
    g_channel.auth_token = std::string(absl::StripAsciiWhitespace((*lines)[0]));
  } else if (const char* env = std::getenv("CHUNKATTN_AUTH_TOKEN"); env != nullptr) {
    g_channel.auth_token = std::string(absl::StripAsciiWhitespace(env));
  }
  return absl::OkStatus();
}

std::unique_ptr<v1::Generation::Stub> NewStub() { return v1::Generation::NewStub(MakeChannel(g_channel)); }

int Generate(const std::vector<std::string>& args, const std::vector<std::string>& stops) {
  if (absl::Status s = ValidateCommon(); !s.ok()) return UsageError(s);
  v1::GenerateRequest request;
  const std::string ids = absl::GetFlag(FLAGS_prompt_ids);
  if (args.size() > 1) return UsageError("generate takes one prompt: quote it");
  if (ids.empty() == args.empty()) {
    return UsageError("generate needs a prompt: \"TEXT\" or --prompt_ids 1,2,3 (not both)");
  }
  if (!ids.empty()) {
    absl::StatusOr<std::vector<int32_t>> parsed = ParseTokenIds(ids);
    if (!parsed.ok()) return UsageError(parsed.status());
    request.mutable_token_ids()->mutable_ids()->Add(parsed->begin(), parsed->end());
  } else {
    if (args[0].empty()) return UsageError("the prompt is empty");
    request.set_text(args[0]);
  }
  const int n = absl::GetFlag(FLAGS_n);
  if (n < 1 || n > 64) return UsageError("--n must be in 1..64");
  request.set_n(static_cast<uint32_t>(n));
  if (absl::Status s = FillParams(v1::SamplingParams(), request.mutable_sampling(),
                                  request.mutable_stopping(), std::nullopt);
      !s.ok()) {
    return UsageError(s);
  }
  for (const std::string& stop : stops) {
    if (stop.empty()) return UsageError("--stop: a stop string must not be empty");
    request.mutable_stopping()->add_stop(stop);
  }
  request.set_cache_namespace(absl::GetFlag(FLAGS_namespace));
  request.set_return_logprobs(absl::GetFlag(FLAGS_logprobs));
  // Negative values wrap to a large one, which the server refuses by name.
  request.set_top_logprobs(static_cast<uint32_t>(absl::GetFlag(FLAGS_top_logprobs)));

  struct Sample {
    std::string text;
    std::vector<std::pair<int32_t, float>> logprobs;
    std::vector<std::string> top;  // per token: " id:logprob ..."
    v1::FinishReason finish = v1::FINISH_REASON_UNSPECIFIED;
    v1::Usage usage;
  };
  std::map<uint32_t, Sample> samples;
  std::unique_ptr<v1::Generation::Stub> stub = NewStub();
  grpc::ClientContext ctx;
  SetDeadline(&ctx, absl::GetFlag(FLAGS_timeout_s));
  auto reader = stub->Generate(&ctx, request);
  v1::GenerateResponse response;
  bool ends_with_newline = true;
  while (reader->Read(&response)) {
    Sample& s = samples[response.index()];
    if (n == 1 && !response.text().empty()) {
      std::fwrite(response.text().data(), 1, response.text().size(), stdout);
      std::fflush(stdout);
      ends_with_newline = response.text().back() == '\n';
    }
    s.text += response.text();
    for (int i = 0; i < response.token_ids_size(); ++i) {
      s.logprobs.emplace_back(response.token_ids(i),
                              i < response.logprobs_size() ? response.logprobs(i) : 0.0f);
    }
    for (const v1::TopLogprobs& top : response.top_logprobs()) {
      std::string line;
      for (int j = 0; j < top.token_ids_size() && j < top.logprobs_size(); ++j) {
        line += " " + std::to_string(top.token_ids(j)) + ":" + std::to_string(top.logprobs(j));
      }
      s.top.push_back(std::move(line));
    }
    if (response.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
      s.finish = response.finish_reason();
      s.usage = response.usage();
    }
  }
  const grpc::Status status = reader->Finish();
  if (n == 1 && !ends_with_newline) std::fputc('\n', stdout);
  if (n > 1) {
    for (const auto& [index, s] : samples) {
      std::printf("[sample %u]\n%s%s", index, s.text.c_str(),
                  s.text.empty() || s.text.back() != '\n' ? "\n" : "");
    }
  }
  std::fflush(stdout);
  if (!status.ok()) {
    PrintRpcError(status);
    return kRpcError;
  }
  for (const auto& [index, s] : samples) {
    const std::string label = n > 1 ? "sample=" + std::to_string(index) + " " : "";
    if (absl::GetFlag(FLAGS_logprobs)) {
      std::string line;
      for (const auto& [id, lp] : s.logprobs) line += " " + std::to_string(id) + ":" + std::to_string(lp);
      std::fprintf(stderr, "%slogprobs:%s\n", label.c_str(), line.c_str());
      for (size_t t = 0; t < s.top.size(); ++t) {
        std::fprintf(stderr, "%stop_logprobs[%zu]:%s\n", label.c_str(), t, s.top[t].c_str());
      }
    }
    std::fprintf(stderr, "%sfinish=%s prompt_tokens=%u cached_prompt_tokens=%u completion_tokens=%u\n",
                 label.c_str(), FinishReasonName(s.finish).c_str(), s.usage.prompt_tokens(),
                 s.usage.cached_prompt_tokens(), s.usage.completion_tokens());
  }
  return 0;
}

int Chat(const std::vector<std::string>& args) {
  if (absl::Status s = ValidateCommon(); !s.ok()) return UsageError(s);
  if (!args.empty()) return UsageError("chat takes no arguments: the messages come from stdin");
  ChatOptions o;
  o.channel = g_channel;
  o.timeout_s = absl::GetFlag(FLAGS_timeout_s);
  o.system = absl::GetFlag(FLAGS_system);
  const std::string system_file = absl::GetFlag(FLAGS_system_prompt_file);
  if (!system_file.empty()) {
    if (!o.system.empty()) return UsageError("--system and --system_prompt_file: give one");
    absl::StatusOr<std::string> text = ReadFileToString(system_file);
    if (!text.ok()) return UsageError("--system_prompt_file: " + std::string(text.status().message()));
    o.system = std::string(absl::StripTrailingAsciiWhitespace(*text));
  }
  o.template_kwargs_json = absl::GetFlag(FLAGS_template_kwargs);
  o.cache_namespace = absl::GetFlag(FLAGS_namespace);
  if (absl::GetFlag(FLAGS_n) != 1) return UsageError("chat keeps one reply per turn (--n 1)");
  if (!absl::GetFlag(FLAGS_prompt_ids).empty()) return UsageError("chat takes messages, not --prompt_ids");
  if (absl::Status s = FillParams(v1::SamplingParams(), &o.sampling, &o.stopping, 256); !s.ok()) return UsageError(s);
  return RunChat(o, stdin);
}

int Info(const std::vector<std::string>& args) {
  if (absl::Status s = ValidateCommon(); !s.ok()) return UsageError(s);
  if (!args.empty()) return UsageError("info takes no arguments");
  grpc::ClientContext ctx;
  SetDeadline(&ctx, absl::GetFlag(FLAGS_timeout_s));
  v1::ModelInfo info;
  const grpc::Status status = NewStub()->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info);
  if (!status.ok()) {
    PrintRpcError(status);
    return kRpcError;
  }
  std::vector<std::string> eos;
  for (int32_t id : info.eos_token_ids()) eos.push_back(std::to_string(id));
  std::printf("model: %s\n", info.model().c_str());
  std::printf("architecture: %s\n", info.architecture().c_str());
  std::printf("dtype: %s\n", info.dtype().c_str());
  std::printf("kv_dtype: %s\n", info.kv_dtype().c_str());
  std::printf("tensor_parallel_size: %u\n", info.tensor_parallel_size());
  std::printf("vocab_size: %u\n", info.vocab_size());
  std::printf("eos_token_ids: %s\n", absl::StrJoin(eos, ",").c_str());
  std::printf("max_context: %u tokens\n", info.max_context());
  std::printf("chunk_size: %u tokens\n", info.chunk_size());
  std::printf("kv_capacity: %llu chunks, %llu tokens\n",
              static_cast<unsigned long long>(info.kv_capacity_chunks()),
              static_cast<unsigned long long>(info.kv_capacity_tokens()));
  std::printf("kv_chunk_bytes: %llu (%.3f MiB)\n", static_cast<unsigned long long>(info.kv_chunk_bytes()),
              info.kv_chunk_bytes() / (1024.0 * 1024.0));
  std::printf("prefix_sharing: %s\n", info.prefix_sharing() ? "true" : "false");
  std::printf("chat_template: %s\n", info.chat_template() ? "true" : "false");
  return 0;
}

int Tokenize(const std::vector<std::string>& args) {
  if (absl::Status s = ValidateCommon(); !s.ok()) return UsageError(s);
  if (args.size() != 1) return UsageError("tokenize takes one text argument: quote it");
  v1::TokenizeRequest request;
  request.set_text(args[0]);
  request.set_add_bos(absl::GetFlag(FLAGS_add_bos));
  grpc::ClientContext ctx;
  SetDeadline(&ctx, absl::GetFlag(FLAGS_timeout_s));
  v1::TokenizeResponse response;
  const grpc::Status status = NewStub()->Tokenize(&ctx, request, &response);
  if (!status.ok()) {
    PrintRpcError(status);
    return kRpcError;
  }
  std::vector<std::string> ids;
  for (int32_t id : response.token_ids()) ids.push_back(std::to_string(id));
  std::printf("tokens: %d\n", response.token_ids_size());
  std::printf("ids: %s\n", absl::StrJoin(ids, ",").c_str());
  std::printf("pieces:");
  for (const std::string& piece : response.pieces()) std::printf(" \"%s\"", piece.c_str());
  std::printf("\n");
  return 0;
}

int Stats(const std::vector<std::string>& args) {
  if (absl::Status s = ValidateCommon(); !s.ok()) return UsageError(s);
  if (!args.empty()) return UsageError("stats takes no arguments");
  const std::optional<double> interval = absl::GetFlag(FLAGS_interval_s);
  const std::optional<int> count = absl::GetFlag(FLAGS_count);
  if (absl::GetFlag(FLAGS_watch)) {
    WatchOptions o;
    o.channel = g_channel;
    o.interval_s = interval.value_or(1.0);
    o.count = count.value_or(0);
    if (!(o.interval_s >= 0.05 && o.interval_s <= 3600)) return UsageError("--interval_s must be in [0.05, 3600]");
    if (o.count < 0) return UsageError("--count must be >= 0");
    const char* term = std::getenv("TERM");
    o.redraw = isatty(STDOUT_FILENO) && term != nullptr && std::strcmp(term, "dumb") != 0;
    return WatchStats(o);
  }
  if (interval || count) return UsageError("--interval_s and --count are for stats --watch");
  grpc::ClientContext ctx;
  SetDeadline(&ctx, absl::GetFlag(FLAGS_timeout_s));
  v1::CacheStats st;
  const grpc::Status status = NewStub()->GetCacheStats(&ctx, v1::GetCacheStatsRequest(), &st);
  if (!status.ok()) {
    PrintRpcError(status);
    return kRpcError;
  }
  auto line = [](const char* name, uint64_t v) {
    std::printf("%s: %llu\n", name, static_cast<unsigned long long>(v));
  };
  line("capacity_chunks", st.capacity_chunks());
  line("used_chunks", st.used_chunks());
  line("cached_chunks", st.cached_chunks());
  line("free_chunks", st.free_chunks());
  line("shared_chunks", st.shared_chunks());
  line("logical_tokens", st.logical_tokens());
  line("physical_tokens", st.physical_tokens());
  line("peak_used_chunks", st.peak_used_chunks());
  line("peak_unshared_chunks", st.peak_unshared_chunks());
  line("prompt_tokens_total", st.prompt_tokens_total());
  line("cached_prompt_tokens_total", st.cached_prompt_tokens_total());
  line("generation_tokens_total", st.generation_tokens_total());
  line("evicted_chunks_total", st.evicted_chunks_total());
  line("running_requests", st.running_requests());
  line("waiting_requests", st.waiting_requests());
  line("preemptions_total", st.preemptions_total());
  for (const v1::KvTierStats& t : st.tiers()) {  // tier.host.blocks: 12 ...
    const std::string p = absl::StrCat("tier.", t.tier(), ".");
    std::printf("%smedium: %s\n", p.c_str(), t.medium().c_str());
    line((p + "blocks").c_str(), t.blocks());
    line((p + "capacity_blocks").c_str(), t.capacity_blocks());
    line((p + "bytes").c_str(), t.bytes());
    line((p + "hits_total").c_str(), t.hits_total());
    line((p + "loads_total").c_str(), t.loads_total());
    std::printf("%sload_seconds_total: %.6f\n", p.c_str(), t.load_seconds_total());
    line((p + "stores_total").c_str(), t.stores_total());
    line((p + "fallbacks_total").c_str(), t.fallbacks_total());
    line((p + "drops_total").c_str(), t.drops_total());
  }
  return 0;
}

int Abort(const std::vector<std::string>& args) {
  if (absl::Status s = ValidateCommon(); !s.ok()) return UsageError(s);
  if (args.empty()) return UsageError("abort needs one or more request ids");
  v1::AbortRequest request;
  for (const std::string& id : args) request.add_request_ids(id);
  grpc::ClientContext ctx;
  SetDeadline(&ctx, absl::GetFlag(FLAGS_timeout_s));
  v1::AbortResponse response;
  const grpc::Status status = NewStub()->Abort(&ctx, request, &response);
  if (!status.ok()) {
    PrintRpcError(status);
    return kRpcError;
  }
  for (const std::string& id : response.aborted_request_ids()) std::printf("aborted %s\n", id.c_str());
  return 0;
}

int Health(const std::vector<std::string>& args) {
  if (absl::Status s = ValidateCommon(); !s.ok()) return UsageError(s);
  if (!args.empty()) return UsageError("health takes no arguments");
  grpc::Status rpc_status;
  absl::StatusOr<std::string> health =
      CheckHealth(MakeChannel(g_channel), absl::GetFlag(FLAGS_timeout_s), &rpc_status);
  if (!rpc_status.ok()) {
    PrintRpcError(rpc_status);
    return kRpcError;
  }
  if (!health.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(health.status().message()).c_str());
    return kRpcError;
  }
  std::printf("%s\n", health->c_str());
  return *health == "SERVING" ? 0 : kRpcError;
}

int Replay(const std::vector<std::string>& args) {
  if (absl::Status s = ValidateCommon(); !s.ok()) return UsageError(s);
  if (!args.empty()) return UsageError("replay takes no arguments (prompts come from --prompts_file)");
  ReplayOptions o;
  o.channel = g_channel;
  o.timeout_s = absl::GetFlag(FLAGS_timeout_s);
  const std::string system_file = absl::GetFlag(FLAGS_system_prompt_file);
  const std::string prompts_file = absl::GetFlag(FLAGS_prompts_file);
  if (system_file.empty()) return UsageError("replay needs --system_prompt_file");
  if (prompts_file.empty()) return UsageError("replay needs --prompts_file");
  absl::StatusOr<std::string> system = ReadFileToString(system_file);
  if (!system.ok()) return UsageError("--system_prompt_file: " + std::string(system.status().message()));
  // The file's last newline is not part of the prompt.
  while (!system->empty() && (system->back() == '\n' || system->back() == '\r')) system->pop_back();
  o.system_prompt = *system;
  absl::StatusOr<std::vector<std::string>> prompts = ReadLines(prompts_file);
  if (!prompts.ok()) return UsageError("--prompts_file: " + std::string(prompts.status().message()));
  if (prompts->empty()) return UsageError("--prompts_file " + prompts_file + " has no prompts");
  o.prompts = *prompts;
  o.requests = absl::GetFlag(FLAGS_requests).value_or(static_cast<int>(o.prompts.size()));
  if (o.requests < 1) return UsageError("--requests must be >= 1");
  o.concurrency = absl::GetFlag(FLAGS_concurrency);
  if (o.concurrency < 1) return UsageError("--concurrency must be >= 1");
  if (absl::GetFlag(FLAGS_n) != 1) return UsageError("replay sends one sample per request (--n 1)");
  if (!absl::GetFlag(FLAGS_prompt_ids).empty()) return UsageError("replay takes text prompts, not --prompt_ids");
  v1::SamplingParams defaults;
  defaults.set_temperature(0.8f);
  defaults.set_top_p(0.95f);
  if (absl::Status s = FillParams(defaults, &o.sampling, &o.stopping, 32); !s.ok()) return UsageError(s);
  o.seed = absl::GetFlag(FLAGS_seed).value_or(1);
  o.cache_namespace = absl::GetFlag(FLAGS_namespace);
  o.json_path = absl::GetFlag(FLAGS_json);
  return RunReplay(o);
}

// absl keeps the last of repeated flags; --stop may be given many times, so
// it is taken out of argv here. Returns the stop strings.
std::optional<std::vector<std::string>> ExtractStops(std::vector<char*>* argv) {
  std::vector<std::string> stops;
  std::vector<char*> rest;
  for (size_t i = 0; i < argv->size(); ++i) {
    char* a = (*argv)[i];
    if (std::strcmp(a, "--") == 0) {
      rest.insert(rest.end(), argv->begin() + i, argv->end());
      break;
    }
    const char* name = a[0] == '-' ? a + (a[1] == '-' ? 2 : 1) : nullptr;
    if (name != nullptr && std::strncmp(name, "stop", 4) == 0 && (name[4] == '\0' || name[4] == '=')) {
      if (name[4] == '=') {
        stops.emplace_back(name + 5);
      } else if (i + 1 < argv->size()) {
        stops.emplace_back((*argv)[++i]);
      } else {
        return std::nullopt;
      }
      continue;
    }
    rest.push_back(a);
  }
  *argv = rest;
  return stops;
}

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage(kUsage);
  NormalizeFlagDashes(argc, argv);
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--") == 0) break;
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0 ||
        std::strcmp(argv[i], "-help") == 0 || (i == 1 && std::strcmp(argv[i], "help") == 0)) {
      std::fputs(kUsage, stdout);
      return 0;
    }
  }
  std::vector<char*> args_in(argv, argv + argc);
  std::optional<std::vector<std::string>> stops = ExtractStops(&args_in);
  if (!stops) return UsageError("--stop needs a value");
  std::vector<char*> positional =
      absl::ParseCommandLine(static_cast<int>(args_in.size()), args_in.data());
  if (positional.size() < 2) {
    std::fputs(kUsage, stderr);
    return kUsageError;
  }
  const std::string command = positional[1];
  const std::vector<std::string> args(positional.begin() + 2, positional.end());
  if (command != "generate" && !stops->empty()) return UsageError("--stop is for generate");
  if (command == "generate") return Generate(args, *stops);
  if (command == "chat") return Chat(args);
  if (command == "info") return Info(args);
  if (command == "tokenize") return Tokenize(args);
  if (command == "stats") return Stats(args);
  if (command == "replay") return Replay(args);
  if (command == "health") return Health(args);
  if (command == "abort") return Abort(args);
  return UsageError("unknown subcommand \"" + command +
                    "\" (generate, chat, info, tokenize, stats, health, replay, abort)");
}

}  // namespace
}  // namespace chunkattn::client

int main(int argc, char** argv) { return chunkattn::client::Main(argc, argv); }
