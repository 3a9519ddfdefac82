// `chunkattn replay`: the quick start's workload against a running
// coordinator. Request i's prompt is the system prompt + "\n\n" +
// prompts[i % prompts.size()], sampled with seed + i; `concurrency` threads
// each keep one streaming call open at a time. Prints a progress line while
// it runs and a summary table (prefix hit rate, time to first token,
// throughput, KV memory at the peak with and without sharing) at the end;
// with json_path, the same as one JSON object (scripts/serve_demo.sh puts
// two runs side by side).
#ifndef CHUNKATTN_SERVICES_CLIENT_REPLAY_H_
#define CHUNKATTN_SERVICES_CLIENT_REPLAY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "chunkattn/v1/generation.pb.h"
#include "services/client/client.h"

namespace chunkattn::client {

struct ReplayOptions {
  ChannelOptions channel;
  double timeout_s = 600;        // per RPC
  std::string system_prompt;
  std::vector<std::string> prompts;  // non-empty
  int requests = 1;                  // >= 1
  int concurrency = 8;               // >= 1
  std::string cache_namespace;
  // Sent with every request; its seed is replaced by seed + i.
  v1::SamplingParams sampling;
  uint64_t seed = 1;
  v1::StoppingCriteria stopping;
  std::string json_path;  // empty: no JSON
};

// Runs the workload; returns the process exit code (0 when every request
// finished OK, 1 otherwise).
// REQUIRES: the options were validated (see main.cc).
int RunReplay(const ReplayOptions& options);

}  // namespace chunkattn::client

#endif  // CHUNKATTN_SERVICES_CLIENT_REPLAY_H_
