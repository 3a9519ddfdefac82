#include "services/metrics/metrics.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace chunkattn::metrics {
namespace {

TEST(RegistryTest, SerializesExactText) {
  Registry r;
  Counter& requests = r.GetCounter("app_requests_total", "Requests.\nSecond \\ line");
  requests.Increment();
  requests.Increment(2);
  r.GetCounter("app_tokens_total", "Tokens.", {{"kind", "prompt"}, {"model", "a\"b\\c\nd"}})
      .Increment(5);
  r.GetGauge("app_chunks", "", {{"state", "used"}}).Set(3.5);
  r.GetGauge("app_chunks", "Ignored: the first help wins.", {{"state", "free"}}).Set(-2);
  Histogram& latency = r.GetHistogram("app_latency_seconds", "Latency.", {0.5, 0.25, 1, 0.5});
  latency.Observe(0.25);  // on a bound: counted in that bucket (le = less or equal)
  latency.Observe(0.375);
  latency.Observe(4);
  r.GetHistogram("app_prompt_tokens", "Prompt length.", LinearBuckets(128, 128, 2),
                 {{"tenant", "x"}})
      .Observe(128);

  EXPECT_EQ(r.Serialize(),
            "# HELP app_requests_total Requests.\\nSecond \\\\ line\n"
            "# TYPE app_requests_total counter\n"
            "app_requests_total 3\n"
            "# HELP app_tokens_total Tokens.\n"
            "# TYPE app_tokens_total counter\n"
            "app_tokens_total{kind=\"prompt\",model=\"a\\\"b\\\\c\\nd\"} 5\n"
            "# TYPE app_chunks gauge\n"
            "app_chunks{state=\"used\"} 3.5\n"
            "app_chunks{state=\"free\"} -2\n"
            "# HELP app_latency_seconds Latency.\n"
            "# TYPE app_latency_seconds histogram\n"
            "app_latency_seconds_bucket{le=\"0.25\"} 1\n"
            "app_latency_seconds_bucket{le=\"0.5\"} 2\n"
            "app_latency_seconds_bucket{le=\"1\"} 2\n"
            "app_latency_seconds_bucket{le=\"+Inf\"} 3\n"
            "app_latency_seconds_sum 4.625\n"
            "app_latency_seconds_count 3\n"
            "# HELP app_prompt_tokens Prompt length.\n"
            "# TYPE app_prompt_tokens histogram\n"
            "app_prompt_tokens_bucket{tenant=\"x\",le=\"128\"} 1\n"
            "app_prompt_tokens_bucket{tenant=\"x\",le=\"256\"} 1\n"
            "app_prompt_tokens_bucket{tenant=\"x\",le=\"+Inf\"} 1\n"
            "app_prompt_tokens_sum{tenant=\"x\"} 128\n"
            "app_prompt_tokens_count{tenant=\"x\"} 1\n");
  EXPECT_TRUE(r.RegistrationErrors().empty());
}

TEST(RegistryTest, FormatsNumbersForPrometheus) {
  Registry r;
  const std::vector<std::pair<double, std::string>> cases = {
      {0, "0"},
      {123456789, "123456789"},
      {0.1, "0.1"},
      {1e20, "1e+20"},
      {1e-7, "1e-07"},
      {1.0 / 3, "0.33333333333333331"},  // 17 digits: the shortest exact form
      {std::numeric_limits<double>::infinity(), "+Inf"},
      {-std::numeric_limits<double>::infinity(), "-Inf"},
      {std::nan(""), "NaN"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    r.GetGauge("g", "", {{"i", std::to_string(i)}}).Set(cases[i].first);
  }
  const std::string text = r.Serialize();
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_TRUE(absl::StrContains(text, absl::StrCat("g{i=\"", i, "\"} ", cases[i].second, "\n")))
        << cases[i].second << " in\n"
        << text;
  }
}

TEST(RegistryTest, SameNameAndLabelsIsSameSeries) {
  Registry r;
  Counter& a = r.GetCounter("x_total", "X.", {{"k", "a"}});
  Counter& b = r.GetCounter("x_total", "X.", {{"k", "b"}});
  EXPECT_EQ(&a, &r.GetCounter("x_total", "Other help.", {{"k", "a"}}));
  EXPECT_NE(&a, &b);
  Gauge& g = r.GetGauge("y", "Y.");
  EXPECT_EQ(&g, &r.GetGauge("y", "Y."));
  Histogram& h = r.GetHistogram("z_seconds", "Z.", {1, 2});
  // The family's first bounds win for later calls and for new series.
  EXPECT_EQ(&h, &r.GetHistogram("z_seconds", "Z.", {5}));
  EXPECT_EQ(r.GetHistogram("z_seconds", "Z.", {5}).upper_bounds(), (std::vector<double>{1, 2}));
  EXPECT_TRUE(r.RegistrationErrors().empty());
}

TEST(RegistryTest, CounterIgnoresNegativeAndNaN) {
  Counter c;
  c.Increment(2.5);
  c.Increment(-1);
  c.Increment(std::nan(""));
  EXPECT_EQ(c.value(), 2.5);
  Gauge g;
  g.Set(3);
  g.Add(-5);
  EXPECT_EQ(g.value(), -2);
}

TEST(HistogramTest, NormalizesBoundsAndCountsBuckets) {
  const double inf = std::numeric_limits<double>::infinity();
  Histogram h({4, 1, std::nan(""), 2, inf, 1, -inf});
  EXPECT_EQ(h.upper_bounds(), (std::vector<double>{1, 2, 4}));
  for (double v : {-3.0, 1.0, 1.5, 4.0, 4.5, inf}) h.Observe(v);
  h.Observe(std::nan(""));  // dropped
  EXPECT_EQ(h.bucket_counts(), (std::vector<uint64_t>{2, 1, 1, 2}));
  EXPECT_EQ(h.count(), 6u);
  EXPECT_EQ(h.sum(), inf);

  Histogram only_inf({});
  only_inf.Observe(7);
  EXPECT_EQ(only_inf.bucket_counts(), (std::vector<uint64_t>{1}));
}

TEST(HistogramTest, BucketHelpers) {
  EXPECT_EQ(ExponentialBuckets(0.001, 2, 4), (std::vector<double>{0.001, 0.002, 0.004, 0.008}));
  EXPECT_EQ(ExponentialBuckets(1, 10, 3), (std::vector<double>{1, 10, 100}));
  EXPECT_TRUE(ExponentialBuckets(0, 2, 4).empty());
  EXPECT_TRUE(ExponentialBuckets(1, 1, 4).empty());
  EXPECT_TRUE(ExponentialBuckets(1, 2, 0).empty());
  EXPECT_EQ(LinearBuckets(-1, 0.5, 3), (std::vector<double>{-1, -0.5, 0}));
  EXPECT_TRUE(LinearBuckets(0, 0, 3).empty());
}

// Each bad registration gets a working series that is never exported, and one
// error message (once, however often the call is repeated).
TEST(RegistryTest, BadRegistrationsAreDetachedAndReported) {
  Registry r;
  r.GetCounter("ok_total", "OK.", {{"a", "1"}}).Increment();
  r.GetHistogram("lat_seconds", "Latency.", {1});
  const std::string good = r.Serialize();

  r.GetCounter("1bad_total", "Invalid name.").Increment();
  r.GetGauge("bad-name", "Invalid name.").Set(1);
  r.GetCounter("requests", "No _total suffix.").Increment();
  r.GetGauge("g1", "Reserved label.", {{"__name", "x"}}).Set(1);
  r.GetGauge("g2", "Invalid label.", {{"0a", "x"}}).Set(1);
  r.GetGauge("g3", "Repeated label.", {{"a", "x"}, {"a", "y"}}).Set(1);
  r.GetHistogram("h_seconds", "le is reserved.", {1}, {{"le", "x"}}).Observe(1);
  r.GetGauge("ok_total", "Other kind.", {{"a", "1"}}).Set(1);
  r.GetCounter("ok_total", "Other label names.", {{"b", "1"}}).Increment();
  r.GetCounter("ok_total", "Other label names.", {{"a", "1"}, {"b", "2"}}).Increment();
  r.GetGauge("lat_seconds_count", "Collides with the histogram's samples.").Set(1);
  Counter& detached = r.GetCounter("requests", "No _total suffix.");
  detached.Increment(41);

  EXPECT_EQ(detached.value(), 42);  // same detached series as the first call
  EXPECT_EQ(r.RegistrationErrors().size(), 11u);
  for (const std::string& e : r.RegistrationErrors()) {
    EXPECT_TRUE(absl::StrContains(e, "not exported")) << e;
  }
  EXPECT_EQ(r.Serialize(), good);
  // The rejected name stays free for a valid registration.
  r.GetGauge("g1", "Now valid.").Set(2);
  EXPECT_EQ(r.Serialize(), good + "# HELP g1 Now valid.\n# TYPE g1 gauge\ng1 2\n");
}

TEST(RegistryTest, ConcurrentUpdatesAreExact) {
  Registry r;
  Counter& counter = r.GetCounter("ops_total", "Ops.");
  Histogram& hist = r.GetHistogram("op_seconds", "Op time.", {0.5, 1.5});
  constexpr int kThreads = 8;
  constexpr int kIncrements = 10000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kIncrements; ++i) {
        counter.Increment();
        hist.Observe(i % 2);  // 0 and 1: exact sums
        // Registration and scrapes race with the updates.
        if (i % 1000 == 0) {
          r.GetGauge("threads", "Threads.", {{"t", std::to_string(t)}}).Set(i);
          (void)r.Serialize();
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(counter.value(), kThreads * kIncrements);
  EXPECT_EQ(hist.count(), uint64_t{kThreads} * kIncrements);
  EXPECT_EQ(hist.sum(), kThreads * kIncrements / 2);
  EXPECT_EQ(hist.bucket_counts(),
            (std::vector<uint64_t>{kThreads * kIncrements / 2, kThreads * kIncrements / 2, 0}));
  const std::string text = r.Serialize();
  EXPECT_TRUE(absl::StrContains(text, "\nops_total 80000\n")) << text;
  EXPECT_TRUE(absl::StrContains(text, "\nop_seconds_count 80000\n")) << text;
  EXPECT_TRUE(absl::StrContains(text, "\nop_seconds_bucket{le=\"+Inf\"} 80000\n")) << text;
}

// Runs `promtool check metrics` on `text`; returns its exit code and output.
std::pair<int, std::string> PromtoolCheck(const std::string& text) {
  const std::string path = absl::StrCat(testing::TempDir(), "/metrics_", getpid(), ".txt");
  std::ofstream(path) << text;
  FILE* pipe = popen(absl::StrCat("promtool check metrics < '", path, "' 2>&1").c_str(), "r");
  std::string output;
  char buf[512];
  size_t n;
  while (pipe != nullptr && (n = fread(buf, 1, sizeof(buf), pipe)) > 0) output.append(buf, n);
  const int status = pipe != nullptr ? pclose(pipe) : -1;
  std::remove(path.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

TEST(PromtoolTest, RealisticRegistryPassesLint) {
  if (std::system("command -v promtool > /dev/null 2>&1") != 0) {
    GTEST_SKIP() << "promtool is not installed (Debian package prometheus)";
  }
  // promtool must flag a known lint problem, or a pass proves nothing.
  const auto [bad_code, bad_output] =
      PromtoolCheck("# HELP bad_requests Requests.\n# TYPE bad_requests counter\nbad_requests 1\n");
  EXPECT_NE(bad_code, 0);
  EXPECT_TRUE(absl::StrContains(bad_output, "_total")) << bad_output;

  Registry r;
  r.GetCounter("chunkattn_prompt_tokens_total", "Prompt tokens received.").Increment(1234);
  r.GetCounter("chunkattn_prompt_cached_tokens_total", "Prompt tokens found in the KV cache.")
      .Increment(1000);
  for (const char* status : {"ok", "resource_exhausted", "invalid_argument"}) {
    r.GetCounter("chunkattn_requests_total", "Finished requests by gRPC status.",
                 {{"status", status}})
        .Increment();
  }
  for (const char* state : {"used", "cached", "free"}) {
    r.GetGauge("chunkattn_kv_chunks", "KV chunks by state.", {{"state", state}}).Set(100);
  }
  r.GetGauge("chunkattn_running_sequences", "Sequences in the running batch.").Set(7);
  Histogram& ttft = r.GetHistogram("chunkattn_time_to_first_token_seconds",
                                   "Time from request arrival to its first token.",
                                   ExponentialBuckets(0.001, 2, 16));
  for (double v : {0.0005, 0.012, 0.3, 70.0}) ttft.Observe(v);
  r.GetHistogram("chunkattn_prompt_length_tokens", "Prompt length \"in tokens\".\nBy model.",
                 ExponentialBuckets(16, 2, 12), {{"model", "llama\\3"}})
      .Observe(500);
  ASSERT_TRUE(r.RegistrationErrors().empty());

  const auto [code, output] = PromtoolCheck(r.Serialize());
  EXPECT_EQ(code, 0) << output << "\n" << r.Serialize();
  EXPECT_EQ(output, "") << r.Serialize();
}

}  // namespace
}  // namespace chunkattn::metrics
