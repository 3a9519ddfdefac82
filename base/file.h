// Reading a small file (a certificate, a token list, a prompt, a secret) whole.
#ifndef CHUNKATTN_BASE_FILE_H_
#define CHUNKATTN_BASE_FILE_H_

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
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

// A secret's file (a password, a URL that carries one): its bytes, so the
// secret is in no argv or environment (/proc/PID/cmdline, /environ). Refused
// (INVALID_ARGUMENT naming `flag` and `path`, never the contents) unless it
// is a regular file that others cannot read or write and its group cannot
// write: a Kubernetes Secret mounted with defaultMode 0440 (owner root, group
// the pod's fsGroup) passes, as does 0600; 0644 does not.
inline absl::StatusOr<std::string> ReadSecretFile(const std::string& flag, const std::string& path) {
  struct Fd {  // closed on every return
    int fd;
    ~Fd() {
      if (fd >= 0) ::close(fd);
    }
  } file{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (file.fd < 0) return absl::InvalidArgumentError(flag + ": cannot open " + path);
  struct stat st = {};
  // Of the file opened: no race with a swap of the path.
  if (::fstat(file.fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(flag + ": " + path + " is not a regular file");
  }
  if ((st.st_mode & (S_IRWXO | S_IWGRP)) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return absl::InvalidArgumentError(flag + ": " + path + " has mode " + mode +
                                      ": a secret's file must not be readable by others nor writable by its "
                                      "group (chmod 600, or 440 for a group)");
  }
  std::string text;
  char buffer[4096];
  for (ssize_t n; (n = ::read(file.fd, buffer, sizeof(buffer))) != 0;) {
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::InvalidArgumentError(flag + ": cannot read " + path);
    }
    text.append(buffer, static_cast<size_t>(n));
    if (text.size() > (size_t{1} << 20)) return absl::InvalidArgumentError(flag + ": " + path + " is over 1 MiB");
  }
  return text;
}

}  // namespace chunkattn

#endif  // CHUNKATTN_BASE_FILE_H_
