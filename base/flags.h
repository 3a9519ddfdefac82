// Command-line spelling shared by the binaries: absl flags are named with
// underscores (--max_new_tokens), while Kubernetes manifests and the issue
// tracker's conventions use dashes (--metrics-port). NormalizeFlagDashes lets
// both spellings work by rewriting "--a-b=v" to "--a_b=v" in place before
// absl::ParseCommandLine. Only the flag name is touched, never its value,
// and nothing after a bare "--".
#ifndef CHUNKATTN_BASE_FLAGS_H_
#define CHUNKATTN_BASE_FLAGS_H_

#include <cstring>

namespace chunkattn {

// REQUIRES: argv[0 .. argc) are writable, NUL-terminated strings.
inline void NormalizeFlagDashes(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    char* a = argv[i];
    if (std::strcmp(a, "--") == 0) return;
    if (a[0] != '-') continue;
    char* name = a + (a[1] == '-' ? 2 : 1);
    for (char* p = name; *p != '\0' && *p != '='; ++p) {
      if (*p == '-') *p = '_';
    }
  }
}

}  // namespace chunkattn

#endif  // CHUNKATTN_BASE_FLAGS_H_
