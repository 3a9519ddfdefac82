// Order statistics of measured samples (latencies, rates), for benchmarks and
// the client's summaries: one definition, so every table reads the same.
#ifndef CHUNKATTN_BASE_PERCENTILE_H_
#define CHUNKATTN_BASE_PERCENTILE_H_

#include <algorithm>
#include <vector>

namespace chunkattn {

// The middle value (the mean of the two middle ones for an even count); 0
// for none.
inline double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The p-th percentile, p in [0, 100], as the nearest rank over the sorted
// values; 0 for none.
inline double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p / 100.0 * (v.size() - 1) + 0.5))];
}

}  // namespace chunkattn

#endif  // CHUNKATTN_BASE_PERCENTILE_H_
