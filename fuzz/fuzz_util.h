// Helpers the file-reading harnesses share: a private folder for the files
// they write (under $TMPDIR, which fuzz/run_fuzzer.sh points into its own
// work folder and removes, crash or not).
#ifndef CHUNKATTN_FUZZ_FUZZ_UTIL_H_
#define CHUNKATTN_FUZZ_FUZZ_UTIL_H_

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

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

}  // namespace chunkattn::fuzz

#endif  // CHUNKATTN_FUZZ_FUZZ_UTIL_H_
