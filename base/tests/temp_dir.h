// A test's own temporary folders, removed when its process exits.
#ifndef CHUNKATTN_BASE_TESTS_TEMP_DIR_H_
#define CHUNKATTN_BASE_TESTS_TEMP_DIR_H_

#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <string>
#include <system_error>
#include <vector>

#include "gtest/gtest.h"

namespace chunkattn::testing {

// A new folder $TMPDIR/PREFIX-XXXXXX (default /tmp), removed with everything
// in it when the test process exits normally, whether its tests passed or
// failed (ctest runs each test in its own process). Empty (and a test
// failure) if it cannot be made.
inline std::string MakeTempDir(const std::string& prefix) {
  struct Dirs {
    const pid_t owner = getpid();  // a forked death-test child leaves them alone
    std::mutex mu;
    std::vector<std::string> paths;
    ~Dirs() {
      if (getpid() != owner) return;
      std::error_code ec;
      for (const std::string& p : paths) std::filesystem::remove_all(p, ec);
    }
  };
  static Dirs dirs;
  std::error_code ec;
  std::filesystem::path base = std::filesystem::temp_directory_path(ec);
  if (ec) base = "/tmp";
  std::string tmpl = (base / (prefix + "-XXXXXX")).string();
  if (mkdtemp(tmpl.data()) == nullptr) {
    ADD_FAILURE() << "mkdtemp " << tmpl << ": " << std::strerror(errno);
    return "";
  }
  std::lock_guard<std::mutex> lock(dirs.mu);
  dirs.paths.push_back(tmpl);
  return tmpl;
}

}  // namespace chunkattn::testing

#endif  // CHUNKATTN_BASE_TESTS_TEMP_DIR_H_
