// Prometheus metrics for the cache coordinator: counters, gauges and
// histograms in a Registry that renders the text exposition format 0.0.4
// (what a Prometheus server scrapes from /metrics; see metrics_server.h).
//
// A metric *family* has a name, help text, a kind and a fixed, ordered list of
// label names; its *series* are told apart by their label values. Callers look
// a series up once and keep the reference: updating it is lock-free (one
// atomic compare-exchange), so it is cheap on the coordinator's loop thread.
//
//   metrics::Registry registry;
//   Counter& prompt = registry.GetCounter("chunkattn_prompt_tokens_total",
//                                         "Prompt tokens received.");
//   prompt.Increment(num_tokens);
//
// Registration errors are programming errors, so Get*() never fails: it always
// returns a usable series, but a call that breaks one of these rules gets a
// *detached* series, which works and is kept for the registry's lifetime but
// is never exported, and the call is recorded in RegistrationErrors():
//  - the metric name does not match [a-zA-Z_:][a-zA-Z0-9_:]*, or a counter's
//    name does not end in "_total" (Prometheus' convention; in format 0.0.4
//    the sample and the # TYPE line both use the full name);
//  - a label name does not match [a-zA-Z_][a-zA-Z0-9_]*, starts with "__",
//    repeats, or is "le" on a histogram (reserved for its buckets);
//  - the name is already a family of another kind, or of other label names
//    (same names in the same order are required), or one of the family's
//    sample names collides with another family's (a gauge "x_sum" next to a
//    histogram "x").
// The first registration of a family wins: a later call with other help text
// (or, for a histogram, other bucket bounds) gets the family's series as
// registered, and is not an error.
//
// Thread-safe: every method of Registry, Counter, Gauge and Histogram may be
// called from any thread. References returned by Get*() stay valid for the
// Registry's lifetime.
#ifndef CHUNKATTN_SERVICES_METRICS_METRICS_H_
#define CHUNKATTN_SERVICES_METRICS_METRICS_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"

namespace chunkattn::metrics {

// (name, value) pairs, in the family's label-name order.
using Labels = std::vector<std::pair<std::string, std::string>>;

// A monotonically increasing total (tokens, requests, evictions).
class Counter {
 public:
  Counter() = default;
  Counter(const Counter&) = delete;
  Counter& operator=(const Counter&) = delete;

  // Adds `v`. A negative or NaN `v` is ignored: a counter never goes down.
  void Increment(double v = 1);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// A value that goes up and down (chunks in use, queue length).
class Gauge {
 public:
  Gauge() = default;
  Gauge(const Gauge&) = delete;
  Gauge& operator=(const Gauge&) = delete;

  void Set(double v) { value_.store(v, std::memory_order_relaxed); }
  void Add(double v);  // v may be negative
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// Observations counted in buckets by upper bound (latencies in seconds,
// lengths in tokens). A value v falls in the first bucket with v <= bound; the
// +Inf bucket is implicit.
class Histogram {
 public:
  // `upper_bounds` is normalized: sorted, duplicates and non-finite values
  // dropped (so it may end up empty: one +Inf bucket).
  explicit Histogram(std::vector<double> upper_bounds);
  Histogram(const Histogram&) = delete;
  Histogram& operator=(const Histogram&) = delete;

  // O(log buckets). A NaN is ignored (it would make the sum NaN for good).
  void Observe(double v);

  const std::vector<double>& upper_bounds() const { return upper_bounds_; }
  // Per bucket, not cumulative: upper_bounds().size() + 1 entries, the last
  // one the +Inf bucket.
  std::vector<uint64_t> bucket_counts() const;
  uint64_t count() const;  // sum of bucket_counts()
  double sum() const { return sum_.load(std::memory_order_relaxed); }

 private:
  const std::vector<double> upper_bounds_;
  const std::unique_ptr<std::atomic<uint64_t>[]> counts_;  // upper_bounds_.size() + 1
  std::atomic<double> sum_{0};
};

// `count` bounds start, start*factor, start*factor^2, ... Empty (only the +Inf
// bucket) unless start > 0, factor > 1 and count >= 1.
std::vector<double> ExponentialBuckets(double start, double factor, int count);
// `count` bounds start, start+width, ... Empty unless width > 0, count >= 1.
std::vector<double> LinearBuckets(double start, double width, int count);

class Registry {
 public:
  Registry();
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // The series of family `name` with `labels`, created on first use. See the
  // file comment for what happens on a registration error. `help` should not
  // be empty: promtool flags a family without help text.
  Counter& GetCounter(const std::string& name, const std::string& help, const Labels& labels = {});
  Gauge& GetGauge(const std::string& name, const std::string& help, const Labels& labels = {});
  // `upper_bounds` as for Histogram; only the family's first call sets them.
  Histogram& GetHistogram(const std::string& name, const std::string& help,
                          std::vector<double> upper_bounds, const Labels& labels = {});

  // Text exposition format 0.0.4: families in registration order, each with
  // # HELP (unless the help is empty) and # TYPE, then its series in
  // registration order. Values are read without stopping writers, so series
  // may be from slightly different instants; within one histogram, _count is
  // always its +Inf bucket. O(series + buckets).
  std::string Serialize() const;

  // One message per distinct rejected registration, oldest first.
  std::vector<std::string> RegistrationErrors() const;

 private:
  enum class Kind { kCounter, kGauge, kHistogram };
  struct Series;
  struct Family;

  // The series for (kind, name, labels), created if need be; nullptr after
  // recording a registration error.
  Series* GetSeries(Kind kind, const std::string& name, const std::string& help,
                    const std::vector<double>* upper_bounds, const Labels& labels)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A detached series for a rejected registration; the same one for the same
  // rejected call, so a call repeated in a loop does not grow memory.
  Series* Detached(Kind kind, const std::string& name, const std::vector<double>* upper_bounds,
                   const Labels& labels, std::string error) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static std::unique_ptr<Series> NewSeries(Kind kind, const std::vector<double>* upper_bounds,
                                           const Labels& labels);

  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<Family>> families_ ABSL_GUARDED_BY(mu_);  // registration order
  absl::flat_hash_map<std::string, Family*> by_name_ ABSL_GUARDED_BY(mu_);
  // Family names and the sample names they export (x_bucket, x_sum, x_count).
  absl::flat_hash_set<std::string> claimed_names_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::unique_ptr<Series>> detached_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> errors_ ABSL_GUARDED_BY(mu_);
};

}  // namespace chunkattn::metrics

#endif  // CHUNKATTN_SERVICES_METRICS_METRICS_H_
