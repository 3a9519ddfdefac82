// The output processor on its own: streamed text and stop strings against a
// reference built from the tokenizer's own decoding, the stop-string callback,
// the end of each request exactly once (also when cancels, failures and
// events race), and every sink call on the processor's thread.
#include "services/coordinator/output_processor.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "text/detokenizer.h"

namespace chunkattn {
namespace {

// The demo model's tokenizer (ctest's demo_model fixture makes it).
const Tokenizer& DemoTokenizer() {
  static const Tokenizer* const tokenizer = [] {
    absl::StatusOr<std::unique_ptr<Tokenizer>> t = LoadTokenizer(CHUNKATTN_DEMO_MODEL_DIR);
    if (!t.ok()) {
      std::fprintf(stderr, "no demo tokenizer (run ctest -R demo_model_make first): %s\n", t.status().ToString().c_str());
      std::abort();
    }
    return t->release();
  }();
  return *tokenizer;
}

// Records what a request's stream received, and checks the sink contract:
// one thread, nothing after Finish, Finish once.
class RecordingSink : public ResponseSink {
 public:
  void Send(GenerationOutput r) override {
    Check();
    if (finished_) ++after_finish_;
    const uint32_t i = static_cast<uint32_t>(r.index);
    text_[i] += r.text;
    tokens_[i] += static_cast<int>(r.token_ids.size());
    if (r.finish_reason != FinishReason::kNone) reason_[i] = r.finish_reason;
  }
  void Finish(absl::Status status) override {
    Check();
    if (finished_) ++after_finish_;
    finished_ = true;
    status_ = std::move(status);
    ++finishes_;
  }

  std::map<uint32_t, std::string> text_;
  std::map<uint32_t, int> tokens_;
  std::map<uint32_t, FinishReason> reason_;
  bool finished_ = false;
  int finishes_ = 0;
  int after_finish_ = 0;
  absl::Status status_;
  std::atomic<int> wrong_thread_{0};

 private:
  void Check() {
    const std::thread::id me = std::this_thread::get_id();
    absl::MutexLock lock(&mu_);
    if (!seen_) {
      seen_ = true;
      thread_ = me;
    } else if (thread_ != me) {
      ++wrong_thread_;
    }
  }
  absl::Mutex mu_;
  bool seen_ = false;
  std::thread::id thread_;
};

struct Fixture {
  metrics::Registry registry;
  absl::Mutex mu;
  std::vector<std::pair<int64_t, int32_t>> finished_samples;  // from the callback
  std::unique_ptr<OutputProcessor> processor;

  explicit Fixture(const Tokenizer* tokenizer) {
    OutputMetrics m;
    m.prompt_tokens = &registry.GetCounter("p", "p");
    m.prompt_cached = &registry.GetCounter("c", "c");
    m.generation_tokens = &registry.GetCounter("g", "g");
    m.ttft = &registry.GetHistogram("t", "t", {1});
    m.itl = &registry.GetHistogram("i", "i", {1});
    m.duration = &registry.GetHistogram("d", "d", {1});
    for (const char* r : kFinishLabels) m.finished[r] = &registry.GetCounter("f", "f", {{"reason", r}});
    processor = std::make_unique<OutputProcessor>(tokenizer, std::move(m), [this](int64_t id, int32_t index) {
      absl::MutexLock lock(&mu);
      finished_samples.emplace_back(id, index);
    });
  }
  double finished(const char* reason) { return registry.GetCounter("f", "f", {{"reason", reason}}).value(); }
};

const std::string& Corpus() {
  static const std::string* text = [] {
    return new std::string(
        "To be, or not to be, that is the question: Whether 'tis nobler in the mind to suffer "
        "The slings and arrows of outrageous fortune, Or to take arms against a sea of troubles "
        "And by opposing end them. To die, to sleep; No more; and by a sleep to say we end "
        "The heart-ache and the thousand natural shocks That flesh is heir to: 'tis a consummation "
        "Devoutly to be wish'd. Caf\xC3\xA9 \xE2\x82\xAC 42 \xF0\x9F\x98\x80 done.");
  }();
  return *text;
}

// `text.substr(pos, len)` widened to whole UTF-8 characters.
std::string Piece(const std::string& text, size_t pos, size_t len) {
  auto continuation = [&](size_t i) { return i < text.size() && (static_cast<uint8_t>(text[i]) & 0xC0) == 0x80; };
  size_t end = std::min(text.size(), pos + len);
  while (pos > 0 && continuation(pos)) --pos;
  while (continuation(end)) ++end;
  return text.substr(pos, end - pos);
}

TEST(OutputProcessorTest, StreamedTextAndStopStringsMatchTheReference) {
  const Tokenizer& tok = DemoTokenizer();
  std::mt19937 rng(20261124);
  Fixture f(&tok);
  struct Case {
    std::shared_ptr<RecordingSink> sink = std::make_shared<RecordingSink>();
    std::vector<int32_t> prompt;
    std::vector<std::vector<int32_t>> generated;  // per sample
    std::vector<std::string> stops;
  };
  std::vector<Case> cases(60);
  for (size_t id = 0; id < cases.size(); ++id) {
    Case& c = cases[id];
    const std::string& text = Corpus();
    const size_t a = rng() % (text.size() / 2);
    c.prompt = tok.Encode(Piece(text, 0, a + 1), true).value();
    const int n = 1 + static_cast<int>(rng() % 3);
    for (int s = 0; s < n; ++s) {
      const size_t b = rng() % (text.size() - 40);
      c.generated.push_back(tok.Encode(Piece(text, b, 20 + rng() % 120), false).value());
    }
    // Stops: pieces of what some sample will say (so they match), or not.
    for (int k = rng() % 3; k > 0; --k) {
      const std::string said = tok.Decode(c.generated[rng() % n]).value();
      if (said.size() < 4) continue;
      const size_t at = rng() % (said.size() - 3);
      c.stops.push_back(rng() % 4 == 0 ? "zzz-never" : Piece(said, at, 1 + rng() % 3));
    }
    OutputProcessor::Request r;
    r.id = static_cast<int64_t>(id);
    r.request_id = "r";
    r.stops = c.stops;
    r.n = n;
    r.prompt = c.prompt;
    r.arrival = absl::Now();
    f.processor->Open(std::move(r), c.sink);
  }
  // Steps: every unfinished sample gets its next token; a sample's last one
  // carries kLength, as the scheduler's would.
  for (size_t step = 0;; ++step) {
    std::vector<SampleEvent> events;
    for (size_t id = 0; id < cases.size(); ++id) {
      for (size_t s = 0; s < cases[id].generated.size(); ++s) {
        const auto& g = cases[id].generated[s];
        if (step >= g.size()) continue;
        SampleEvent e;
        e.request = static_cast<int64_t>(id);
        e.index = static_cast<int32_t>(s);
        e.token = g[step];
        e.completion_tokens = static_cast<int32_t>(step + 1);
        if (step + 1 == g.size()) e.finish = FinishReason::kLength;
        events.push_back(e);
      }
    }
    if (events.empty()) break;
    f.processor->Events(std::move(events), absl::Now());
  }
  f.processor->Flush();
  int stopped = 0;
  for (size_t id = 0; id < cases.size(); ++id) {
    const Case& c = cases[id];
    ASSERT_EQ(c.sink->finishes_, 1) << id;
    EXPECT_TRUE(c.sink->status_.ok());
    EXPECT_EQ(c.sink->after_finish_, 0);
    EXPECT_EQ(c.sink->wrong_thread_.load(), 0);
    for (size_t s = 0; s < c.generated.size(); ++s) {
      // The reference: the detokenizer's whole text, cut before the earliest
      // stop string.
      IncrementalDetokenizer d(&tok, c.prompt);
      std::string full;
      for (int32_t t : c.generated[s]) full += d.Append(t).value();
      full += d.Flush().value();
      size_t cut = std::string::npos;
      for (const std::string& stop : c.stops) cut = std::min(cut, full.find(stop));
      const bool stops = cut != std::string::npos;
      EXPECT_EQ(c.sink->text_.at(s), stops ? full.substr(0, cut) : full) << id << "/" << s;
      EXPECT_EQ(c.sink->reason_.at(s), stops ? FinishReason::kStopString : FinishReason::kLength);
      if (stops) ++stopped;
    }
  }
  EXPECT_GT(stopped, 10);  // the workload does exercise stop strings
  // The callback named each sample a stop string ended before its last token.
  absl::MutexLock lock(&f.mu);
  for (const auto& [id, index] : f.finished_samples) {
    EXPECT_EQ(cases[id].sink->reason_.at(index), FinishReason::kStopString);
  }
  EXPECT_GT(f.finished_samples.size(), 0u);
}

// Keeps every output.
class KeepingSink : public ResponseSink {
 public:
  void Send(GenerationOutput r) override { responses.push_back(std::move(r)); }
  void Finish(absl::Status status) override { this->status = std::move(status); }
  std::vector<GenerationOutput> responses;
  absl::Status status;
};

// token_ids, logprobs and top_logprobs stay one per token: with a stop string
// that ends the text mid-stream, with tokens the scheduler produced after it
// (dropped), and per request only what it asked for.
TEST(OutputProcessorTest, LogprobsAndTopLogprobsStayAlignedWithTokens) {
  const Tokenizer& tok = DemoTokenizer();
  Fixture f(&tok);
  const std::vector<int32_t> said = tok.Encode(Corpus().substr(0, 200), false).value();
  ASSERT_GT(said.size(), 20u);
  // The event the scheduler would send for token t: its logprob, and three
  // entries with t first (it was the most likely).
  auto event = [](int64_t id, int32_t t) {
    SampleEvent e;
    e.request = id;
    e.token = t;
    e.logprob = -static_cast<float>(t % 97) / 10;
    e.top_token_ids = {t, t + 1, t + 2};
    e.top_logprobs = {e.logprob, e.logprob - 1, e.logprob - 2};
    return e;
  };
  struct Case {
    bool logprobs;
    std::vector<std::string> stops;
  };
  const Case cases[] = {{true, {}}, {true, {"or not"}}, {false, {}}, {false, {"or not"}}};
  std::vector<std::shared_ptr<KeepingSink>> sinks;
  for (int id = 0; id < 4; ++id) {
    sinks.push_back(std::make_shared<KeepingSink>());
    OutputProcessor::Request r;
    r.id = id;
    r.stops = cases[id].stops;
    r.return_logprobs = cases[id].logprobs;
    r.arrival = absl::Now();
    f.processor->Open(std::move(r), sinks.back());
  }
  for (size_t step = 0; step < said.size(); ++step) {  // past the stop string too
    std::vector<SampleEvent> events;
    for (int id = 0; id < 4; ++id) {
      events.push_back(event(id, said[step]));
      if (step + 1 == said.size()) events.back().finish = FinishReason::kLength;
    }
    f.processor->Events(std::move(events), absl::Now());
  }
  f.processor->Flush();
  for (int id = 0; id < 4; ++id) {
    size_t tokens = 0;
    for (const GenerationOutput& r : sinks[id]->responses) {
      ASSERT_EQ(r.token_ids.size(), 1u);
      ASSERT_EQ(r.logprobs.size(), cases[id].logprobs ? 1u : 0u) << id;
      ASSERT_EQ(r.top_logprobs.size(), cases[id].logprobs ? 1u : 0u) << id;
      EXPECT_EQ(r.token_ids[0], said[tokens]) << id;
      if (cases[id].logprobs) {
        const GenerationOutput::TopLogprobs& top = r.top_logprobs[0];
        ASSERT_EQ(top.token_ids.size(), 3u);
        ASSERT_EQ(top.logprobs.size(), 3u);
        EXPECT_EQ(top.token_ids[0], r.token_ids[0]);
        EXPECT_EQ(top.logprobs[0], r.logprobs[0]);
        EXPECT_EQ(top.token_ids[2], r.token_ids[0] + 2);
        EXPECT_EQ(top.logprobs[2], r.logprobs[0] - 2);
      }
      ++tokens;
    }
    const bool stops = !cases[id].stops.empty();
    EXPECT_EQ(sinks[id]->responses.back().finish_reason, stops ? FinishReason::kStopString : FinishReason::kLength);
    if (stops) {
      EXPECT_LT(tokens, said.size()) << id << ": the tokens after the stop string are dropped";
    } else {
      EXPECT_EQ(tokens, said.size()) << id;
    }
  }
}

TEST(OutputProcessorTest, EveryRequestEndsOnceWhateverRaces) {
  Fixture f(nullptr);
  constexpr int kRequests = 400;
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  for (int id = 0; id < kRequests; ++id) {
    sinks.push_back(std::make_shared<RecordingSink>());
    OutputProcessor::Request r;
    r.id = id;
    r.n = 2;
    r.arrival = absl::Now();
    f.processor->Open(std::move(r), sinks.back());
  }
  f.processor->Refuse(std::make_shared<RecordingSink>(), absl::UnavailableError("refused"));
  // One thread streams tokens to every request, one cancels the even ones.
  std::thread tokens([&] {
    for (int step = 0; step < 50; ++step) {
      std::vector<SampleEvent> events;
      for (int id = 0; id < kRequests; ++id) {
        for (int s = 0; s < 2; ++s) {
          SampleEvent e;
          e.request = id;
          e.index = s;
          e.token = 7;
          if (step == 49) e.finish = FinishReason::kStopToken;
          events.push_back(e);
        }
      }
      f.processor->Events(std::move(events), absl::Now());
    }
  });
  std::thread cancels([&] {
    for (int id = 0; id < kRequests; id += 2) f.processor->End(id, absl::CancelledError("client"), "cancelled");
  });
  tokens.join();
  cancels.join();
  f.processor->EndAll(absl::UnavailableError("workers lost"));  // nothing left open
  f.processor->Flush();
  int cancelled = 0;
  for (int id = 0; id < kRequests; ++id) {
    const RecordingSink& s = *sinks[id];
    ASSERT_EQ(s.finishes_, 1) << id;
    EXPECT_EQ(s.after_finish_, 0) << id;
    EXPECT_EQ(s.wrong_thread_.load(), 0);
    if (id % 2 == 1) {
      EXPECT_TRUE(s.status_.ok()) << id << " " << s.status_;
      EXPECT_EQ(s.tokens_.at(0), 50);
    } else if (!s.status_.ok()) {
      EXPECT_EQ(s.status_.code(), absl::StatusCode::kCancelled);
      ++cancelled;
    }
  }
  EXPECT_EQ(f.finished("cancelled"), cancelled);
  EXPECT_EQ(f.finished("stop_token"), kRequests - cancelled);
  EXPECT_EQ(f.finished("error"), 0);
}

TEST(OutputProcessorTest, EndAllFailsWhatIsOpenAndStopDrainsFirst) {
  Fixture f(nullptr);
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  for (int id = 0; id < 5; ++id) {
    sinks.push_back(std::make_shared<RecordingSink>());
    OutputProcessor::Request r;
    r.id = id;
    r.arrival = absl::Now();
    f.processor->Open(std::move(r), sinks.back());
  }
  f.processor->EndAll(absl::UnavailableError("worker failed"));
  f.processor->Stop();  // no Flush: Stop runs what was posted
  for (const auto& s : sinks) {
    EXPECT_EQ(s->finishes_, 1);
    EXPECT_EQ(s->status_.code(), absl::StatusCode::kUnavailable);
  }
  EXPECT_EQ(f.finished("error"), 5);
  f.processor->Flush();  // after Stop: returns at once
  f.processor->End(0, absl::OkStatus(), "length");  // dropped, no crash
}

}  // namespace
}  // namespace chunkattn
