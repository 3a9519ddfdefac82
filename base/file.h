// Reading a small file (a certificate, a token list, a prompt) whole.
#ifndef CHUNKATTN_BASE_FILE_H_
#define CHUNKATTN_BASE_FILE_H_

#include <fstream>
#include <sstream>
#include <string>

#include "absl/status/statusor.h"

namespace chunkattn {

// The file's bytes: NOT_FOUND "cannot open PATH" when it cannot be opened,
// DATA_LOSS "cannot read PATH" when reading it fails.
inline absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError("cannot open " + path);
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::DataLossError("cannot read " + path);
  return text.str();
}

}  // namespace chunkattn

#endif  // CHUNKATTN_BASE_FILE_H_
