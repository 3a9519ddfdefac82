// Helpers the harnesses share: failing with a message, a private folder for
// the files they write (under $TMPDIR, which tests/fuzz/run_fuzzer.sh points into
// its own work folder and removes, crash or not), and inputs made of
// several messages.
#ifndef CHUNKATTN_TESTS_FUZZ_FUZZ_UTIL_H_
#define CHUNKATTN_TESTS_FUZZ_FUZZ_UTIL_H_

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <cstring>
#include <string>
#include <vector>

namespace chunkattn::fuzz {

[[noreturn]] inline void Fail(const char* harness, const std::string& what) {
  std::fprintf(stderr, "%s: %s\n", harness, what.c_str());
  std::abort();
}

// A folder of this process's own, removed at a normal exit.
inline const std::string& PrivateDir() {
  // Never destroyed: the exit handler still needs it after static
  // destructors (registered after it) have run.
  static const std::string* dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    auto* path = new std::string(std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/chunkattn-fuzz-XXXXXX");
    if (mkdtemp(path->data()) == nullptr) Fail("fuzz_util", "mkdtemp failed under " + *path);
    std::atexit([] { std::filesystem::remove_all(PrivateDir()); });
    return path;
  }();
  return *dir;
}

inline void WriteFile(const std::string& path, const uint8_t* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!out) Fail("fuzz_util", "cannot write " + path);
}

// An input of several messages, each a 4-byte little-endian length and its
// bytes: at most `max` of them, a length past the end taking what is left.
inline std::vector<std::string> SplitFrames(const uint8_t* data, size_t size, size_t max) {
  std::vector<std::string> frames;
  while (size >= 4 && frames.size() < max) {
    uint32_t len = 0;
    std::memcpy(&len, data, 4);
    data += 4, size -= 4;
    len = static_cast<uint32_t>(std::min<size_t>(len, size));
    frames.emplace_back(reinterpret_cast<const char*>(data), len);
    data += len, size -= len;
  }
  return frames;
}

// The inverse of SplitFrames.
inline std::string JoinFrames(const std::vector<std::string>& frames) {
  std::string out;
  for (const std::string& f : frames) {
    const uint32_t len = static_cast<uint32_t>(f.size());
    out.append(reinterpret_cast<const char*>(&len), 4);
    out += f;
  }
  return out;
}

}  // namespace chunkattn::fuzz

#endif  // CHUNKATTN_TESTS_FUZZ_FUZZ_UTIL_H_
