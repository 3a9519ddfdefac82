// OpenSSL's queued errors as one line, for a status message: they say what
// failed (a verify result, a bad PEM line), never key material. Empties the
// thread's queue. Header-only: its users link OpenSSL themselves.
#ifndef CHUNKATTN_BASE_OPENSSL_ERRORS_H_
#define CHUNKATTN_BASE_OPENSSL_ERRORS_H_

#include <openssl/err.h>

#include <string>

namespace chunkattn {

inline std::string OpenSslErrors() {
  std::string out;
  for (unsigned long e = ERR_get_error(); e != 0; e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? "unknown error" : out;
}

}  // namespace chunkattn

#endif  // CHUNKATTN_BASE_OPENSSL_ERRORS_H_
