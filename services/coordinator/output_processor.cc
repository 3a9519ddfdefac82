#include "services/coordinator/output_processor.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/synchronization/notification.h"
#include "text/detokenizer.h"

namespace chunkattn {

const char* VllmFinishReason(FinishReason reason) {
  switch (reason) {
    case FinishReason::kLength:
      return "length";
    case FinishReason::kCancelled:
      return "abort";
    default:
      return "stop";
  }
}

namespace {

const char* ReasonLabel(FinishReason r) {
  switch (r) {
    case FinishReason::kLength:
      return "length";
    case FinishReason::kStopToken:
      return "stop_token";
    case FinishReason::kStopString:
      return "stop_string";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kNone:
      break;
  }
  return "error";
}

}  // namespace

struct OutputProcessor::Live {
  Request request;
  std::shared_ptr<ResponseSink> sink;
  bool first_token = false;
  FinishReason last_reason = FinishReason::kNone;
  struct Sample {
    std::unique_ptr<IncrementalDetokenizer> detok;
    std::string text;  // decoded so far
    size_t sent = 0;   // bytes of text sent
    bool finished = false;
    bool has_token = false;
    absl::Time last_token;
  };
  std::vector<Sample> samples;
};

OutputProcessor::OutputProcessor(const Tokenizer* tokenizer, OutputMetrics metrics, FinishSampleFn finish_sample)
    : tokenizer_(tokenizer), metrics_(std::move(metrics)), finish_sample_(std::move(finish_sample)) {
  thread_ = std::thread([this] { Loop(); });
}

OutputProcessor::~OutputProcessor() { Stop(); }

void OutputProcessor::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

bool OutputProcessor::Post(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  if (stopped_) return false;  // the thread has ended: nothing would run it
  tasks_.push_back(std::move(task));
  return true;
}

void OutputProcessor::Loop() {
  while (true) {
    std::deque<std::function<void()>> tasks;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](OutputProcessor* p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu_) { return p->stop_ || !p->tasks_.empty(); },
          this));
      if (tasks_.empty()) {  // stopping, and everything posted is done
        stopped_ = true;
        return;
      }
      tasks.swap(tasks_);
    }
    for (auto& task : tasks) task();
  }
}

void OutputProcessor::Open(Request request, std::shared_ptr<ResponseSink> sink) {
  Post([this, request = std::move(request), sink = std::move(sink)]() mutable {
    auto live = std::make_unique<Live>();
    live->samples.resize(request.n);
    if (tokenizer_ != nullptr) {
      for (auto& s : live->samples) s.detok = std::make_unique<IncrementalDetokenizer>(tokenizer_, request.prompt);
    }
    request.prompt = {};  // only the detokenizers needed it
    const int64_t id = request.id;
    live->request = std::move(request);
    live->sink = std::move(sink);
    live_[id] = std::move(live);
  });
}

void OutputProcessor::Events(std::vector<SampleEvent> events, absl::Time now) {
  Post([this, events = std::move(events), now] {
    std::vector<int64_t> touched;
    for (const SampleEvent& e : events) {
      HandleEvent(e, now);
      touched.push_back(e.request);
    }
    std::sort(touched.begin(), touched.end());
    touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
    for (int64_t id : touched) {
      auto it = live_.find(id);
      if (it == live_.end()) continue;
      const auto& samples = it->second->samples;
      if (std::all_of(samples.begin(), samples.end(), [](const Live::Sample& s) { return s.finished; })) {
        EndLive(id, absl::OkStatus(), ReasonLabel(it->second->last_reason));
      }
    }
  });
}

void OutputProcessor::End(int64_t id, absl::Status status, std::string reason) {
  Post([this, id, status = std::move(status), reason = std::move(reason)] { EndLive(id, status, reason); });
}

void OutputProcessor::EndAll(absl::Status status) {
  Post([this, status = std::move(status)] {
    std::vector<int64_t> ids;
    for (const auto& [id, live] : live_) ids.push_back(id);
    for (int64_t id : ids) EndLive(id, status, "error");
  });
}

void OutputProcessor::Refuse(std::shared_ptr<ResponseSink> sink, absl::Status status) {
  // After Stop no thread runs tasks; finishing here is then the only call
  // the sink gets, so it is still called by one thread at a time.
  auto finish = [sink, status] { sink->Finish(status); };
  if (!Post(finish)) finish();
}

void OutputProcessor::FindOpen(std::string owner, std::vector<std::string> request_ids, FoundFn found) {
  auto find = [this, owner = std::move(owner), wanted = std::move(request_ids), found]() {
    const std::set<std::string> want(wanted.begin(), wanted.end());
    std::vector<int64_t> ids;
    std::set<std::string> hit;
    // A scan: Abort calls are rare next to the requests they look among.
    for (const auto& [id, live] : live_) {
      const Request& r = live->request;
      if (r.owner == owner && !r.request_id.empty() && want.count(r.request_id) > 0) {
        ids.push_back(id);
        hit.insert(r.request_id);
      }
    }
    found(std::move(ids), std::vector<std::string>(hit.begin(), hit.end()));
  };
  if (!Post(find)) found({}, {});
}

void OutputProcessor::Flush() {
  absl::Notification done;
  if (Post([&done] { done.Notify(); })) done.WaitForNotification();
}

void OutputProcessor::HandleEvent(const SampleEvent& e, absl::Time now) {
  auto it = live_.find(e.request);
  if (it == live_.end()) return;
  Live& live = *it->second;
  Live::Sample& sample = live.samples[e.index];
  if (sample.finished) return;  // produced before the scheduler heard of its stop string
  if (!live.first_token) {
    live.first_token = true;
    metrics_.ttft->Observe(absl::ToDoubleSeconds(now - live.request.arrival));
    metrics_.prompt_tokens->Increment(e.prompt_tokens);
    metrics_.prompt_cached->Increment(e.cached_prompt_tokens);
    if (metrics_.vllm_prefix_queries != nullptr) metrics_.vllm_prefix_queries->Increment(e.prompt_tokens);
    if (metrics_.vllm_prefix_hits != nullptr) metrics_.vllm_prefix_hits->Increment(e.cached_prompt_tokens);
  }
  if (sample.has_token) metrics_.itl->Observe(absl::ToDoubleSeconds(now - sample.last_token));
  sample.has_token = true;
  sample.last_token = now;
  metrics_.generation_tokens->Increment();

  if (sample.detok != nullptr) {
    absl::StatusOr<std::string> delta = sample.detok->Append(e.token);
    if (delta.ok()) sample.text += *delta;
  }
  static const std::vector<std::string> kNoStops;
  const std::vector<std::string>& stops =
      e.completion_tokens >= live.request.min_tokens ? live.request.stops : kNoStops;
  FinishReason finish = e.finish;
  // Stop strings: the earliest match ends the text before it. Text that
  // could still become a match is held back until it cannot.
  size_t end = sample.text.size();
  size_t earliest = std::string::npos;
  const std::string* matched = nullptr;
  for (const std::string& stop : stops) {
    const size_t from = sample.sent >= stop.size() ? sample.sent - stop.size() + 1 : 0;
    const size_t pos = sample.text.find(stop, from);
    if (pos != std::string::npos && pos < earliest) {
      earliest = pos;
      matched = &stop;
    }
  }
  if (earliest != std::string::npos) {
    finish = FinishReason::kStopString;
    end = std::max(earliest, sample.sent);
  } else if (finish != FinishReason::kNone) {
    if (sample.detok != nullptr) {
      absl::StatusOr<std::string> rest = sample.detok->Flush();
      if (rest.ok()) sample.text += *rest;
    }
    end = sample.text.size();
  } else {
    size_t hold = 0;
    for (const std::string& stop : stops) {
      for (size_t k = std::min(stop.size() - 1, sample.text.size() - sample.sent); k > hold; --k) {
        if (sample.text.compare(sample.text.size() - k, k, stop, 0, k) == 0) {
          hold = k;
          break;
        }
      }
    }
    end = sample.text.size() - hold;
  }
  GenerationOutput output;
  output.request_id = live.request.request_id;
  output.index = e.index;
  output.token_ids.push_back(e.token);
  if (end > sample.sent) {
    output.text = sample.text.substr(sample.sent, end - sample.sent);
    sample.sent = end;
  }
  if (live.request.return_logprobs) {
    output.logprobs.push_back(e.logprob);
    // The scheduler gives a sample's every event its entries, or none: one
    // TopLogprobs per token_ids entry, as the outputs are sent or dropped whole.
    if (!e.top_token_ids.empty()) output.top_logprobs.push_back({e.top_token_ids, e.top_logprobs});
  }
  if (finish != FinishReason::kNone || live.sink->WantsRunningUsage()) {
    output.usage = GenerationOutput::Usage{e.prompt_tokens, e.cached_prompt_tokens, e.completion_tokens};
  }
  if (finish != FinishReason::kNone) {
    sample.finished = true;
    live.last_reason = finish;
    output.finish_reason = finish;
    if (finish == FinishReason::kStopString && matched != nullptr) output.stop_string = *matched;
    if (finish == FinishReason::kStopString && e.finish == FinishReason::kNone) finish_sample_(e.request, e.index);
  }
  live.sink->Send(std::move(output));
}

void OutputProcessor::EndLive(int64_t id, const absl::Status& status, const std::string& reason) {
  auto it = live_.find(id);
  if (it == live_.end()) return;
  metrics_.finished.at(reason)->Increment();
  metrics_.duration->Observe(absl::ToDoubleSeconds(absl::Now() - it->second->request.arrival));
  it->second->sink->Finish(status);
  live_.erase(it);
}

}  // namespace chunkattn
