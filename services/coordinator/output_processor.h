// The coordinator's output side: turns the scheduler's sampled-token events
// into outputs on its own thread, so the engine loop only schedules and
// steps. Per sample it detokenizes (text/detokenizer.h), applies stop strings
// (the text ends before the earliest match; text that could still become a
// match is held back) and fans the output out to the request's sink; per
// request it records latency metrics and ends the call.
//
// A stop string is found here, after the scheduler already produced the
// token, so the scheduler learns of it through `finish_sample` and may run a
// sample a step or two longer; those tokens are dropped here, as vLLM's
// output processor does.
//
// Thread-safe: every public method may be called from any thread; the work
// runs on the processor's own thread in call order. Sinks are called on that
// thread only.
#ifndef CHUNKATTN_SERVICES_COORDINATOR_OUTPUT_PROCESSOR_H_
#define CHUNKATTN_SERVICES_COORDINATOR_OUTPUT_PROCESSOR_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "services/metrics/metrics.h"
#include "services/core/scheduler.h"
#include "text/tokenizer.h"

namespace chunkattn {

// What one sample of a request produced at one step, in no API's terms:
// each front translates it to its own wire format.
struct GenerationOutput {
  // The most likely tokens at one position, most likely first (ties: lower
  // id first), with their logprobs.
  struct TopLogprobs {
    std::vector<int32_t> token_ids;
    std::vector<float> logprobs;
  };
  struct Usage {
    int64_t prompt_tokens = 0;
    int64_t cached_prompt_tokens = 0;  // whose KV came from the prefix cache (not computed)
    int64_t completion_tokens = 0;     // of this sample, so far
  };

  std::string request_id;  // the client's
  int32_t index = 0;       // sample, 0 .. n-1
  std::vector<int32_t> token_ids;  // new tokens
  std::string text;                // new text (never splits a UTF-8 character)
  std::vector<float> logprobs;     // of token_ids, nats, if the request asked
  // One per token_ids entry when the request asked for top logprobs.
  std::vector<TopLogprobs> top_logprobs;
  FinishReason finish_reason = FinishReason::kNone;  // set on the sample's last output
  std::string stop_string;  // with kStopString: the stop string that matched (the earliest in the text)
  // On the sample's last output, and on every one for a sink that
  // WantsRunningUsage.
  std::optional<Usage> usage;
};

// Where a request's outputs go. Called on the output processor's thread
// only; must not block. Finish is the last call.
class ResponseSink {
 public:
  virtual ~ResponseSink() = default;
  virtual void Send(GenerationOutput output) = 0;
  virtual void Finish(absl::Status status) = 0;
  // Whether every output should carry the sample's usage so far (the vLLM
  // engine API's chunks report it); otherwise only each sample's last.
  virtual bool WantsRunningUsage() const { return false; }
};

// vLLM's finish_reason for a sample's last output, as both its OpenAI API
// and its gRPC engine API say it: "length", "stop" (EOS, stop tokens and
// strings) or "abort".
const char* VllmFinishReason(FinishReason reason);

// The per-request series the processor records (owned by a registry).
struct OutputMetrics {
  metrics::Counter* prompt_tokens = nullptr;
  metrics::Counter* prompt_cached = nullptr;
  // Optional: vLLM's names for the same two counts (vllm:prefix_cache_*).
  metrics::Counter* vllm_prefix_queries = nullptr;
  metrics::Counter* vllm_prefix_hits = nullptr;
  metrics::Counter* generation_tokens = nullptr;
  metrics::Histogram* ttft = nullptr;
  metrics::Histogram* itl = nullptr;
  metrics::Histogram* duration = nullptr;
  std::map<std::string, metrics::Counter*> finished;  // by reason label; kFinishLabels
};

// The reason labels of chunkattn_requests_finished_total.
inline const char* const kFinishLabels[] = {"length", "stop_token", "stop_string", "cancelled", "error"};

class OutputProcessor {
 public:
  // Called on the processor's thread when a stop string ends a sample.
  using FinishSampleFn = std::function<void(int64_t id, int32_t index)>;

  // `tokenizer` (null: token ids only, no stop strings) is borrowed, as are
  // the metric series.
  OutputProcessor(const Tokenizer* tokenizer, OutputMetrics metrics, FinishSampleFn finish_sample);
  ~OutputProcessor();  // Stop()

  // Processes everything posted, then ends the thread; later calls are
  // dropped. Idempotent. Requests still open are left to the caller (EndAll
  // first).
  void Stop();

  struct Request {
    int64_t id = 0;
    std::string request_id;  // the client's, echoed
    std::string owner;       // the caller's tenant: FindOpen matches it
    std::vector<std::string> stops;
    int32_t min_tokens = 0;  // stop strings are matched from this many completion tokens on (as vLLM)
    // Each response then carries its token's logprob and, if the events have
    // them (sampling.top_logprobs), its top entries.
    bool return_logprobs = false;
    int32_t n = 1;
    std::vector<TokenId> prompt;  // the detokenizers' context
    absl::Time arrival;
  };
  // A request the scheduler accepted: events for it may follow.
  void Open(Request request, std::shared_ptr<ResponseSink> sink);
  // One step's events, produced at `now`.
  void Events(std::vector<SampleEvent> events, absl::Time now);
  // Ends a request (cancelled, failed) unless it has ended; counted under
  // `reason`.
  void End(int64_t id, absl::Status status, std::string reason);
  // Ends every open request with `status` (counted as "error").
  void EndAll(absl::Status status);
  // Finishes a request that never opened (refused), on the processor's
  // thread like every other sink call.
  void Refuse(std::shared_ptr<ResponseSink> sink, absl::Status status);
  // Returns once everything posted before the call has been processed.
  void Flush();
  // Calls `found` on the processor's thread (at once, with nothing, when it
  // has ended) with the ids of the open requests of `owner` whose client
  // request_id is in `request_ids`, and those request ids, each once.
  using FoundFn = std::function<void(std::vector<int64_t> ids, std::vector<std::string> request_ids)>;
  void FindOpen(std::string owner, std::vector<std::string> request_ids, FoundFn found);

 private:
  struct Live;
  // False (and `task` dropped) once the thread has ended.
  bool Post(std::function<void()> task);
  void Loop();
  void HandleEvent(const SampleEvent& e, absl::Time now);
  void EndLive(int64_t id, const absl::Status& status, const std::string& reason);

  const Tokenizer* tokenizer_;
  OutputMetrics metrics_;
  FinishSampleFn finish_sample_;

  absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;

  // The processor's thread only.
  std::map<int64_t, std::unique_ptr<Live>> live_;
};

}  // namespace chunkattn

#endif  // CHUNKATTN_SERVICES_COORDINATOR_OUTPUT_PROCESSOR_H_
