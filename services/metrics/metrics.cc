#include "services/metrics/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iterator>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"

namespace chunkattn::metrics {
namespace {

// C++17 has no atomic<double>::fetch_add.
void AtomicAdd(std::atomic<double>& a, double v) {
  double old = a.load(std::memory_order_relaxed);
  while (!a.compare_exchange_weak(old, old + v, std::memory_order_relaxed)) {
  }
}

bool IsValidMetricName(absl::string_view name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

bool IsValidLabelName(absl::string_view name) {
  if (name.empty() || absl::StartsWith(name, "__")) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

// Length-prefixed, so no choice of label values can make two keys equal.
std::string EncodeStrings(const std::vector<std::string>& parts) {
  std::string key;
  for (const std::string& p : parts) absl::StrAppend(&key, p.size(), ":", p);
  return key;
}

// A number as Go's strconv.ParseFloat (Prometheus' parser) reads it back
// exactly: integers without exponent, else the shortest round-trip form.
std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::trunc(v) && std::fabs(v) < 1e15) return absl::StrFormat("%.0f", v);
  std::string s = absl::StrFormat("%.15g", v);
  if (std::strtod(s.c_str(), nullptr) != v) s = absl::StrFormat("%.17g", v);
  return s;
}

void AppendEscaped(std::string* out, absl::string_view s, bool quote) {
  for (char c : s) {
    if (c == '\\') {
      out->append("\\\\");
    } else if (c == '\n') {
      out->append("\\n");
    } else if (quote && c == '"') {
      out->append("\\\"");
    } else {
      out->push_back(c);
    }
  }
}

// `{a="x",b="y"}` with an optional trailing le label; nothing when empty.
void AppendLabels(std::string* out, const std::vector<std::string>& names,
                  const std::vector<std::string>& values, const std::string* le) {
  if (names.empty() && le == nullptr) return;
  out->push_back('{');
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out->push_back(',');
    absl::StrAppend(out, names[i], "=\"");
    AppendEscaped(out, values[i], /*quote=*/true);
    out->push_back('"');
  }
  if (le != nullptr) {
    if (!names.empty()) out->push_back(',');
    absl::StrAppend(out, "le=\"", *le, "\"");
  }
  out->push_back('}');
}

std::vector<double> NormalizeBounds(std::vector<double> bounds) {
  bounds.erase(
      std::remove_if(bounds.begin(), bounds.end(), [](double b) { return !std::isfinite(b); }),
      bounds.end());
  std::sort(bounds.begin(), bounds.end());
  bounds.erase(std::unique(bounds.begin(), bounds.end()), bounds.end());
  return bounds;
}

}  // namespace

void Counter::Increment(double v) {
  if (!(v >= 0)) return;  // also drops NaN
  AtomicAdd(value_, v);
}

void Gauge::Add(double v) { AtomicAdd(value_, v); }

Histogram::Histogram(std::vector<double> upper_bounds)
    : upper_bounds_(NormalizeBounds(std::move(upper_bounds))),
      counts_(new std::atomic<uint64_t>[upper_bounds_.size() + 1]) {
  for (size_t i = 0; i <= upper_bounds_.size(); ++i) counts_[i].store(0, std::memory_order_relaxed);
}

void Histogram::Observe(double v) {
  if (std::isnan(v)) return;
  const size_t bucket =
      std::lower_bound(upper_bounds_.begin(), upper_bounds_.end(), v) - upper_bounds_.begin();
  counts_[bucket].fetch_add(1, std::memory_order_relaxed);
  AtomicAdd(sum_, v);
}

std::vector<uint64_t> Histogram::bucket_counts() const {
  std::vector<uint64_t> counts(upper_bounds_.size() + 1);
  for (size_t i = 0; i < counts.size(); ++i) counts[i] = counts_[i].load(std::memory_order_relaxed);
  return counts;
}

uint64_t Histogram::count() const {
  uint64_t total = 0;
  for (uint64_t c : bucket_counts()) total += c;
  return total;
}

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  std::vector<double> bounds;
  if (!(start > 0) || !(factor > 1) || count < 1) return bounds;
  bounds.reserve(count);
  double b = start;
  for (int i = 0; i < count; ++i, b *= factor) bounds.push_back(b);
  return bounds;
}

std::vector<double> LinearBuckets(double start, double width, int count) {
  std::vector<double> bounds;
  if (!(width > 0) || count < 1) return bounds;
  bounds.reserve(count);
  for (int i = 0; i < count; ++i) bounds.push_back(start + i * width);
  return bounds;
}

struct Registry::Series {
  std::vector<std::string> label_values;
  // Exactly one is set, by the family's kind.
  std::unique_ptr<Counter> counter;
  std::unique_ptr<Gauge> gauge;
  std::unique_ptr<Histogram> histogram;
};

struct Registry::Family {
  std::string name;
  std::string help;
  Kind kind;
  std::vector<std::string> label_names;
  std::vector<double> upper_bounds;             // histograms: the first registration's, normalized
  std::vector<std::unique_ptr<Series>> series;  // registration order
  absl::flat_hash_map<std::string, Series*> by_values;  // EncodeStrings(label_values)
};

Registry::Registry() = default;
Registry::~Registry() = default;

std::unique_ptr<Registry::Series> Registry::NewSeries(Kind kind,
                                                      const std::vector<double>* upper_bounds,
                                                      const Labels& labels) {
  auto series = std::make_unique<Series>();
  for (const auto& [name, value] : labels) series->label_values.push_back(value);
  switch (kind) {
    case Kind::kCounter:
      series->counter = std::make_unique<Counter>();
      break;
    case Kind::kGauge:
      series->gauge = std::make_unique<Gauge>();
      break;
    case Kind::kHistogram:
      series->histogram = std::make_unique<Histogram>(*upper_bounds);
      break;
  }
  return series;
}

Registry::Series* Registry::Detached(Kind kind, const std::string& name,
                                     const std::vector<double>* upper_bounds, const Labels& labels,
                                     std::string error) {
  std::vector<std::string> parts = {std::to_string(static_cast<int>(kind)), name};
  for (const auto& [n, v] : labels) {
    parts.push_back(n);
    parts.push_back(v);
  }
  std::unique_ptr<Series>& slot = detached_[EncodeStrings(parts)];
  if (slot == nullptr) {
    slot = NewSeries(kind, upper_bounds, labels);
    errors_.push_back(std::move(error));
  }
  return slot.get();
}

Registry::Series* Registry::GetSeries(Kind kind, const std::string& name, const std::string& help,
                                      const std::vector<double>* upper_bounds,
                                      const Labels& labels) {
  std::vector<std::string> label_names;
  std::vector<std::string> label_values;
  for (const auto& [n, v] : labels) {
    label_names.push_back(n);
    label_values.push_back(v);
  }
  auto reject = [&](absl::string_view why) {
    return Detached(kind, name, upper_bounds, labels,
                    absl::StrCat("metric \"", name, "\" {", absl::StrJoin(label_names, ","),
                                 "}: ", why, "; not exported"));
  };

  auto it = by_name_.find(name);
  Family* family = it == by_name_.end() ? nullptr : it->second;
  if (family == nullptr) {
    if (!IsValidMetricName(name)) return reject("invalid metric name");
    if (kind == Kind::kCounter && !absl::EndsWith(name, "_total")) {
      return reject("a counter's name must end in _total");
    }
    absl::flat_hash_set<std::string> seen;
    for (const std::string& n : label_names) {
      if (!IsValidLabelName(n)) return reject(absl::StrCat("invalid label name \"", n, "\""));
      if (kind == Kind::kHistogram && n == "le") return reject("label \"le\" is reserved");
      if (!seen.insert(n).second) return reject(absl::StrCat("repeated label \"", n, "\""));
    }
    std::vector<std::string> claims = {name};
    if (kind == Kind::kHistogram) {
      for (const char* suffix : {"_bucket", "_sum", "_count"}) claims.push_back(name + suffix);
    }
    for (const std::string& c : claims) {
      if (claimed_names_.contains(c)) {
        return reject(absl::StrCat("\"", c, "\" collides with another family's samples"));
      }
    }
    claimed_names_.insert(claims.begin(), claims.end());
    auto created = std::make_unique<Family>();
    created->name = name;
    created->help = help;
    created->kind = kind;
    created->label_names = label_names;
    if (upper_bounds != nullptr) created->upper_bounds = NormalizeBounds(*upper_bounds);
    family = created.get();
    families_.push_back(std::move(created));
    by_name_[name] = family;
  } else if (family->kind != kind) {
    return reject("already registered as another kind");
  } else if (family->label_names != label_names) {
    return reject(absl::StrCat("already registered with labels {",
                               absl::StrJoin(family->label_names, ","), "}"));
  }

  const std::string key = EncodeStrings(label_values);
  auto sit = family->by_values.find(key);
  if (sit != family->by_values.end()) return sit->second;
  family->series.push_back(NewSeries(kind, &family->upper_bounds, labels));
  Series* series = family->series.back().get();
  family->by_values[key] = series;
  return series;
}

Counter& Registry::GetCounter(const std::string& name, const std::string& help,
                              const Labels& labels) {
  absl::MutexLock lock(&mu_);
  return *GetSeries(Kind::kCounter, name, help, nullptr, labels)->counter;
}

Gauge& Registry::GetGauge(const std::string& name, const std::string& help, const Labels& labels) {
  absl::MutexLock lock(&mu_);
  return *GetSeries(Kind::kGauge, name, help, nullptr, labels)->gauge;
}

Histogram& Registry::GetHistogram(const std::string& name, const std::string& help,
                                  std::vector<double> upper_bounds, const Labels& labels) {
  absl::MutexLock lock(&mu_);
  return *GetSeries(Kind::kHistogram, name, help, &upper_bounds, labels)->histogram;
}

std::string Registry::Serialize() const {
  absl::ReaderMutexLock lock(&mu_);
  std::string out;
  for (const auto& family : families_) {
    if (!family->help.empty()) {
      absl::StrAppend(&out, "# HELP ", family->name, " ");
      AppendEscaped(&out, family->help, /*quote=*/false);
      out.push_back('\n');
    }
    const char* type = family->kind == Kind::kCounter ? "counter"
                       : family->kind == Kind::kGauge ? "gauge"
                                                      : "histogram";
    absl::StrAppend(&out, "# TYPE ", family->name, " ", type, "\n");
    for (const auto& series : family->series) {
      const std::vector<std::string>& values = series->label_values;
      if (family->kind != Kind::kHistogram) {
        const double v = series->counter ? series->counter->value() : series->gauge->value();
        out.append(family->name);
        AppendLabels(&out, family->label_names, values, nullptr);
        absl::StrAppend(&out, " ", FormatValue(v), "\n");
        continue;
      }
      const Histogram& h = *series->histogram;
      const std::vector<uint64_t> counts = h.bucket_counts();
      uint64_t cumulative = 0;
      for (size_t i = 0; i < counts.size(); ++i) {
        cumulative += counts[i];
        const std::string le =
            i < h.upper_bounds().size() ? FormatValue(h.upper_bounds()[i]) : "+Inf";
        absl::StrAppend(&out, family->name, "_bucket");
        AppendLabels(&out, family->label_names, values, &le);
        absl::StrAppend(&out, " ", cumulative, "\n");
      }
      absl::StrAppend(&out, family->name, "_sum");
      AppendLabels(&out, family->label_names, values, nullptr);
      absl::StrAppend(&out, " ", FormatValue(h.sum()), "\n");
      absl::StrAppend(&out, family->name, "_count");
      AppendLabels(&out, family->label_names, values, nullptr);
      absl::StrAppend(&out, " ", cumulative, "\n");
    }
  }
  return out;
}

std::vector<std::string> Registry::RegistrationErrors() const {
  absl::ReaderMutexLock lock(&mu_);
  return errors_;
}

}  // namespace chunkattn::metrics
