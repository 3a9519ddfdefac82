// Shared by the benchmarks under bench/: where and how a result was measured,
// so every JSON file names the machine, the commit and the exact command.
#ifndef CHUNKATTN_BENCH_BENCH_UTIL_H_
#define CHUNKATTN_BENCH_BENCH_UTIL_H_

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"

namespace chunkattn::bench {

inline std::string RunCommand(const std::string& cmd) {
  std::string out;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[256];
    while (fgets(buf, sizeof(buf), p)) out += buf;
    pclose(p);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

inline std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

inline std::string JsonEscape(const std::string& s) {
  return absl::StrReplaceAll(s, {{"\\", "\\\\"}, {"\"", "\\\""}, {"\n", "\\n"}});
}

// {"machine": ..., "cpu": ..., "cores": ..., "commit": ..., "command": ..., "time": ...}
// fields, without braces, for the start of a result object.
inline std::string ProvenanceJson(int argc, char** argv) {
  char host[256] = "unknown";
  gethostname(host, sizeof(host) - 1);
  std::vector<std::string> args(argv, argv + argc);
  // $CHUNKATTN_COMMIT names the commit where the binary runs away from its
  // checkout (a GPU host given a bundle).
  const char* env_commit = std::getenv("CHUNKATTN_COMMIT");
  const std::string commit = env_commit != nullptr
                                 ? env_commit
                                 : RunCommand("git -C " CHUNKATTN_SOURCE_DIR " rev-parse HEAD 2>/dev/null");
  const std::string dirty =
      env_commit != nullptr
          ? ""
          : RunCommand("git -C " CHUNKATTN_SOURCE_DIR " status --porcelain --untracked-files=no 2>/dev/null");
  const std::time_t now = std::time(nullptr);
  char when[32];
  std::strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return absl::StrFormat(
      "\"machine\": \"%s\", \"cpu\": \"%s\", \"cores\": %d, \"commit\": \"%s%s\", \"command\": \"%s\", "
      "\"time\": \"%s\"",
      JsonEscape(host), JsonEscape(CpuModel()), std::thread::hardware_concurrency(),
      commit.empty() ? "unknown" : commit, dirty.empty() ? "" : "-dirty", JsonEscape(absl::StrJoin(args, " ")),
      when);
}

inline double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

inline double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p / 100.0 * (v.size() - 1) + 0.5))];
}

}  // namespace chunkattn::bench

#endif  // CHUNKATTN_BENCH_BENCH_UTIL_H_
