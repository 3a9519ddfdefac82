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
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

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

// The contents of a JSON string literal for `s` (quotes, backslashes and
// every control character escaped).
inline std::string JsonEscape(const std::string& s) {
  std::string out;
  for (const char ch : s) {
    const unsigned char u = static_cast<unsigned char>(ch);
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (ch == '\n') {
      out += "\\n";
    } else if (u < 0x20) {
      out += absl::StrFormat("\\u%04x", u);
    } else {
      out += ch;
    }
  }
  return out;
}

// A JSON array file that holds every row appended so far: rewritten whole
// (a temporary file, then rename) after each row, so a run that is cut off
// or fails later keeps what it finished. Writes nothing when `path` is empty.
class JsonArrayFile {
 public:
  explicit JsonArrayFile(std::string path) : path_(std::move(path)) {}

  // `object` is one JSON object. False, with a message, if the file cannot be written.
  bool Append(std::string object) {
    rows_.push_back(std::move(object));
    if (path_.empty()) return true;
    const std::string tmp = path_ + ".tmp";
    {
      std::ofstream out(tmp, std::ios::trunc);
      out << "[\n  " << absl::StrJoin(rows_, ",\n  ") << "\n]\n";
      if (!out.flush()) {
        std::fprintf(stderr, "cannot write %s\n", tmp.c_str());
        return false;
      }
    }
    if (std::rename(tmp.c_str(), path_.c_str()) != 0) {
      std::fprintf(stderr, "cannot rename %s to %s\n", tmp.c_str(), path_.c_str());
      return false;
    }
    return true;
  }

  const std::string& path() const { return path_; }
  size_t size() const { return rows_.size(); }

 private:
  std::string path_;
  std::vector<std::string> rows_;
};

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
