#include "base/redis_client.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "base/openssl_errors.h"

namespace chunkattn {

struct RedisClient::Reply {
  enum class Type { kString, kStatus, kError, kInteger, kNil, kArray };
  Type type = Type::kNil;
  std::string str;  // kString, kStatus, kError
  int64_t integer = 0;
  std::vector<Reply> elements;
};

namespace {

// Debian's absl has a string_view of its own (not std's).
absl::string_view A(std::string_view s) { return absl::string_view(s.data(), s.size()); }

constexpr int kMaxArray = 1 << 20;  // elements of one array reply
constexpr int kMaxDepth = 4;        // nested arrays: none of our commands nests

absl::Status BadUrl(std::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("--kv_store_url: ", A(why),
                                                 " (want redis[s]://[[user]:password@]host:port[/db])"));
}

struct BioDeleter {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Deleter {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyDeleter {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct CtxDeleter {
  void operator()(SSL_CTX* c) const { SSL_CTX_free(c); }
};
using CtxPtr = std::unique_ptr<SSL_CTX, CtxDeleter>;

std::unique_ptr<BIO, BioDeleter> PemBio(const std::string& pem) {
  return std::unique_ptr<BIO, BioDeleter>(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// The certificates of a PEM text; INVALID_ARGUMENT naming `what` when it has none or a bad one.
absl::StatusOr<std::vector<std::unique_ptr<X509, X509Deleter>>> ReadCertificates(const std::string& pem,
                                                                                  std::string_view what) {
  std::vector<std::unique_ptr<X509, X509Deleter>> out;
  auto bio = PemBio(pem);
  while (X509* x = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) out.emplace_back(x);
  const unsigned long last = ERR_peek_last_error();
  // The loop ends on "no start line" after the last certificate; anything else is a bad one.
  if (last != 0 && !(ERR_GET_LIB(last) == ERR_LIB_PEM && ERR_GET_REASON(last) == PEM_R_NO_START_LINE)) {
    return absl::InvalidArgumentError(absl::StrCat(A(what), ": not PEM certificates (", OpenSslErrors(), ")"));
  }
  ERR_clear_error();
  if (out.empty()) return absl::InvalidArgumentError(absl::StrCat(A(what), ": no PEM certificate"));
  return out;
}

// A client context for `tls`: TLS 1.2 or later, the peer verified.
absl::StatusOr<CtxPtr> MakeTlsContext(const RedisTlsOptions& tls) {
  ERR_clear_error();
  CtxPtr ctx(SSL_CTX_new(TLS_client_method()));
  if (ctx == nullptr) return absl::InternalError(absl::StrCat("redis TLS: ", OpenSslErrors()));
  SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION);
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, nullptr);
  SSL_CTX_set_mode(ctx.get(), SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  if (tls.ca_pem.empty()) {
    if (SSL_CTX_set_default_verify_paths(ctx.get()) != 1) {
      return absl::FailedPreconditionError(absl::StrCat("redis TLS: the system's CAs: ", OpenSslErrors()));
    }
  } else {
    auto cas = ReadCertificates(tls.ca_pem, "redis TLS CA");
    if (!cas.ok()) return cas.status();
    X509_STORE* store = SSL_CTX_get_cert_store(ctx.get());
    for (const auto& ca : *cas) X509_STORE_add_cert(store, ca.get());
  }
  if (tls.cert_pem.empty() != tls.key_pem.empty()) {
    return absl::InvalidArgumentError("redis TLS: a client certificate and its key go together");
  }
  if (!tls.cert_pem.empty()) {
    auto chain = ReadCertificates(tls.cert_pem, "redis TLS client certificate");
    if (!chain.ok()) return chain.status();
    if (SSL_CTX_use_certificate(ctx.get(), (*chain)[0].get()) != 1) {
      return absl::InvalidArgumentError(absl::StrCat("redis TLS client certificate: ", OpenSslErrors()));
    }
    for (size_t i = 1; i < chain->size(); ++i) {
      SSL_CTX_add_extra_chain_cert(ctx.get(), (*chain)[i].release());  // the context owns it now
    }
    auto bio = PemBio(tls.key_pem);
    std::unique_ptr<EVP_PKEY, KeyDeleter> key(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
    if (key == nullptr) {
      ERR_clear_error();  // its words could describe the key's bytes: say only that it failed
      return absl::InvalidArgumentError("redis TLS client key: not an unencrypted PEM private key");
    }
    if (SSL_CTX_use_PrivateKey(ctx.get(), key.get()) != 1 || SSL_CTX_check_private_key(ctx.get()) != 1) {
      ERR_clear_error();
      return absl::InvalidArgumentError("redis TLS client key: does not match the client certificate");
    }
  }
  return ctx;
}

// %XX escapes of a URL's userinfo; false for a malformed one.
bool PercentDecode(std::string_view in, std::string* out) {
  out->clear();
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '%') {
      out->push_back(in[i]);
      continue;
    }
    if (i + 2 >= in.size()) return false;
    int v = 0;
    for (int k = 1; k <= 2; ++k) {
      const char c = in[i + k];
      if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) return false;
      v = v * 16 + (absl::ascii_isdigit(static_cast<unsigned char>(c)) ? c - '0' : (absl::ascii_tolower(c) - 'a' + 10));
    }
    out->push_back(static_cast<char>(v));
    i += 2;
  }
  return true;
}

// RESP's form of one command: an array of bulk strings (binary-safe).
void AppendCommand(const std::vector<std::string_view>& args, std::string* out) {
  absl::StrAppend(out, "*", args.size(), "\r\n");
  for (std::string_view a : args) absl::StrAppend(out, "$", a.size(), "\r\n", A(a), "\r\n");
}

}  // namespace

absl::Status CheckRedisTlsOptions(const RedisTlsOptions& tls) { return MakeTlsContext(tls).status(); }

struct RedisClient::Tls {
  CtxPtr ctx;
  absl::Status ctx_error;  // why there is no ctx
  SSL* ssl = nullptr;      // the connection's; null between connections
};

std::string RedisUrl::Redacted() const {
  std::string out = tls ? "rediss://" : "redis://";
  if (!user.empty() || !password.empty()) absl::StrAppend(&out, user, password.empty() ? "" : ":***", "@");
  absl::StrAppend(&out, host.find(':') != std::string::npos ? absl::StrCat("[", host, "]") : host, ":", port);
  if (db != 0) absl::StrAppend(&out, "/", db);
  return out;
}

std::string RedactRedisUrl(std::string_view url) {
  const size_t scheme = url.find("://");
  const size_t start = scheme == std::string_view::npos ? 0 : scheme + 3;
  const size_t at = url.rfind('@');
  if (at == std::string_view::npos || at < start) return std::string(url);
  const size_t colon = url.substr(start, at - start).find(':');
  if (colon == std::string_view::npos) return absl::StrCat(A(url.substr(0, start)), "***", A(url.substr(at)));
  return absl::StrCat(A(url.substr(0, start + colon)), ":***", A(url.substr(at)));
}

absl::StatusOr<RedisUrl> ParseRedisUrl(std::string_view url) {
  if (url.size() > 4096) return BadUrl("longer than 4096 bytes");
  RedisUrl out;
  out.tls = absl::StartsWithIgnoreCase(A(url), "rediss://");
  const std::string_view scheme = out.tls ? "rediss://" : "redis://";
  if (!absl::StartsWithIgnoreCase(A(url), A(scheme))) return BadUrl("not a redis:// or rediss:// URL");
  std::string_view rest = url.substr(scheme.size());
  if (const size_t at = rest.rfind('@'); at != std::string_view::npos) {
    const std::string_view userinfo = rest.substr(0, at);
    rest = rest.substr(at + 1);
    const size_t colon = userinfo.find(':');
    const std::string_view user = userinfo.substr(0, colon);
    const std::string_view password = colon == std::string_view::npos ? "" : userinfo.substr(colon + 1);
    if (colon == std::string_view::npos) return BadUrl("user info without a password");
    if (!PercentDecode(user, &out.user) || !PercentDecode(password, &out.password)) {
      return BadUrl("a malformed %-escape in the user info");
    }
    if (out.password.empty()) return BadUrl("an empty password");
  }
  std::string_view hostport = rest;
  if (const size_t slash = rest.find('/'); slash != std::string_view::npos) {
    hostport = rest.substr(0, slash);
    const std::string_view db = rest.substr(slash + 1);
    if (!db.empty() && (!absl::SimpleAtoi(A(db), &out.db) || out.db < 0 || out.db > 65535)) {
      return BadUrl(absl::StrCat("db \"", A(db), "\" is not in 0..65535"));
    }
  }
  if (hostport.find_first_of("?#") != std::string_view::npos) return BadUrl("query strings are not supported");
  std::string_view port;
  if (!hostport.empty() && hostport.front() == '[') {
    const size_t close = hostport.find(']');
    if (close == std::string_view::npos || close < 2) return BadUrl("a bad [IPv6] host");
    out.host = std::string(hostport.substr(1, close - 1));
    const std::string_view after = hostport.substr(close + 1);
    if (!after.empty() && after.front() != ':') return BadUrl("a bad [IPv6] host");
    if (!after.empty()) port = after.substr(1);
  } else {
    const size_t colon = hostport.find(':');
    out.host = std::string(hostport.substr(0, colon));
    if (colon != std::string_view::npos) port = hostport.substr(colon + 1);
  }
  if (out.host.empty()) return BadUrl("no host");
  for (char c : out.host) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_' && c != ':') {
      return BadUrl("a host with characters outside [A-Za-z0-9.-_:]");
    }
  }
  if (!port.empty() && (!absl::SimpleAtoi(A(port), &out.port) || out.port < 1 || out.port > 65535)) {
    return BadUrl(absl::StrCat("port \"", A(port), "\" is not in 1..65535"));
  }
  return out;
}

RedisClient::RedisClient(RedisUrl url, RedisOptions options) : url_(std::move(url)), options_(std::move(options)) {
  if (!url_.tls) return;
  tls_ = std::make_unique<Tls>();
  absl::StatusOr<CtxPtr> ctx = MakeTlsContext(options_.tls);
  if (ctx.ok()) {
    tls_->ctx = std::move(*ctx);
  } else {
    tls_->ctx_error = ctx.status();
  }
}

bool RedisClient::encrypted() const { return tls_ != nullptr && tls_->ssl != nullptr; }

bool RedisClient::WaitFor(short events, absl::Time deadline) {
  const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
  pollfd p{fd_, events, 0};
  return ms > 0 && ::poll(&p, 1, static_cast<int>(ms)) != 0;  // an interrupted poll: try the I/O again
}

absl::Status RedisClient::Handshake(absl::Time deadline) {
  if (tls_->ctx == nullptr) return tls_->ctx_error;
  ERR_clear_error();
  tls_->ssl = SSL_new(tls_->ctx.get());
  if (tls_->ssl == nullptr || SSL_set_fd(tls_->ssl, fd_) != 1) {
    return absl::InternalError(absl::StrCat("redis ", url_.Redacted(), ": TLS: ", OpenSslErrors()));
  }
  // The certificate must name the URL's host: its IP address, or its DNS name (sent as SNI too).
  X509_VERIFY_PARAM* param = SSL_get0_param(tls_->ssl);
  if (X509_VERIFY_PARAM_set1_ip_asc(param, url_.host.c_str()) != 1) {
    ERR_clear_error();
    SSL_set_tlsext_host_name(tls_->ssl, url_.host.c_str());
    SSL_set1_host(tls_->ssl, url_.host.c_str());
  }
  while (true) {
    const int rc = SSL_connect(tls_->ssl);
    if (rc == 1) return absl::OkStatus();
    const int error = SSL_get_error(tls_->ssl, rc);
    if (error == SSL_ERROR_WANT_READ || error == SSL_ERROR_WANT_WRITE) {
      if (!WaitFor(error == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline)) {
        return absl::DeadlineExceededError(absl::StrCat("redis ", url_.Redacted(), ": TLS handshake timed out"));
      }
      continue;
    }
    const long verify = SSL_get_verify_result(tls_->ssl);
    const std::string why = verify != X509_V_OK ? X509_verify_cert_error_string(verify) : OpenSslErrors();
    ERR_clear_error();
    return absl::UnavailableError(absl::StrCat("redis ", url_.Redacted(), ": TLS handshake: ", why));
  }
}

RedisClient::~RedisClient() { Close(); }

void RedisClient::Close() {
  if (tls_ != nullptr && tls_->ssl != nullptr) {
    SSL_free(tls_->ssl);  // no close_notify: the connection is dropped, not drained
    tls_->ssl = nullptr;
  }
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  buffer_.clear();
  read_pos_ = 0;
}

absl::Status RedisClient::Fail(absl::Status status) {
  Close();
  return status;
}

absl::Status RedisClient::Connect() {
  if (tls_ != nullptr && tls_->ctx == nullptr) return tls_->ctx_error;  // options that never work: no dial
  const absl::Time deadline = absl::Now() + options_.connect_timeout;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(url_.port);
  // getaddrinfo has no deadline of its own; a name in /etc/hosts or an
  // address resolves at once, and a Kubernetes Service name from the
  // cluster's DNS.
  if (const int rc = ::getaddrinfo(url_.host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return absl::UnavailableError(absl::StrFormat("redis %s: %s", url_.Redacted(), ::gai_strerror(rc)));
  }
  absl::Status last = absl::UnavailableError(absl::StrFormat("redis %s: no address", url_.Redacted()));
  for (addrinfo* a = found; a != nullptr && fd_ < 0; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int rc = ::connect(fd, a->ai_addr, a->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      const int64_t ms = std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now()));
      rc = ::poll(&p, 1, static_cast<int>(ms));
      if (rc == 1) {
        int error = 0;
        socklen_t len = sizeof(error);
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len);
        rc = error == 0 ? 0 : -1;
        errno = error;
      } else {
        rc = -1;
        errno = ETIMEDOUT;  // or a poll error: either way no connection in time
      }
    }
    if (rc != 0) {
      last = absl::UnavailableError(absl::StrFormat("redis %s: connect: %s", url_.Redacted(), std::strerror(errno)));
      ::close(fd);
      continue;
    }
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    fd_ = fd;
  }
  ::freeaddrinfo(found);
  if (fd_ < 0) return last;
  if (tls_ != nullptr) {
    if (absl::Status s = Handshake(deadline); !s.ok()) return Fail(s);
  }
  std::vector<std::vector<std::string_view>> hello;
  if (!url_.password.empty()) {
    if (url_.user.empty()) {
      hello.push_back({"AUTH", url_.password});
    } else {
      hello.push_back({"AUTH", url_.user, url_.password});
    }
  }
  const std::string db = std::to_string(url_.db);
  if (url_.db != 0) hello.push_back({"SELECT", db});
  if (hello.empty()) return absl::OkStatus();
  absl::StatusOr<std::vector<Reply>> replies = Exchange(hello, 1 << 10, deadline);
  if (!replies.ok()) return Fail(replies.status());
  for (size_t i = 0; i < replies->size(); ++i) {
    const Reply& r = (*replies)[i];
    if (r.type == Reply::Type::kError) {
      // Redis's own words name no secret ("WRONGPASS invalid username-password pair").
      const bool auth = !url_.password.empty() && i == 0;
      return Fail((auth ? absl::PermissionDeniedError : absl::FailedPreconditionError)(
          absl::StrFormat("redis %s: %s: %s", url_.Redacted(), auth ? "AUTH" : "SELECT", r.str)));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<size_t> RedisClient::SendSome(std::string_view bytes, short* wait) {
  *wait = 0;
  if (encrypted()) {
    const int n = SSL_write(tls_->ssl, bytes.data(), static_cast<int>(std::min<size_t>(bytes.size(), 1 << 30)));
    if (n > 0) return static_cast<size_t>(n);
    const int error = SSL_get_error(tls_->ssl, n);
    if (error != SSL_ERROR_WANT_READ && error != SSL_ERROR_WANT_WRITE) {
      return absl::UnavailableError(absl::StrFormat("redis %s: TLS send: %s", url_.Redacted(), OpenSslErrors()));
    }
    *wait = error == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT;
    return 0;
  }
  const ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  if (n > 0) return static_cast<size_t>(n);
  if (n < 0 && errno == EINTR) return 0;
  if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
    return absl::UnavailableError(absl::StrFormat("redis %s: send: %s", url_.Redacted(), std::strerror(errno)));
  }
  *wait = POLLOUT;
  return 0;
}

absl::StatusOr<size_t> RedisClient::RecvSome(char* out, size_t size, short* wait) {
  *wait = 0;
  if (encrypted()) {
    const int got = SSL_read(tls_->ssl, out, static_cast<int>(size));
    if (got > 0) return static_cast<size_t>(got);
    const int error = SSL_get_error(tls_->ssl, got);
    if (error == SSL_ERROR_ZERO_RETURN || (error == SSL_ERROR_SYSCALL && got == 0)) {
      return absl::UnavailableError(absl::StrFormat("redis %s: connection closed", url_.Redacted()));
    }
    if (error != SSL_ERROR_WANT_READ && error != SSL_ERROR_WANT_WRITE) {
      return absl::UnavailableError(absl::StrFormat("redis %s: TLS recv: %s", url_.Redacted(), OpenSslErrors()));
    }
    *wait = error == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT;
    return 0;
  }
  const ssize_t got = ::recv(fd_, out, size, 0);
  if (got > 0) return static_cast<size_t>(got);
  if (got == 0) return absl::UnavailableError(absl::StrFormat("redis %s: connection closed", url_.Redacted()));
  if (errno == EINTR) return 0;
  if (errno != EAGAIN && errno != EWOULDBLOCK) {
    return absl::UnavailableError(absl::StrFormat("redis %s: recv: %s", url_.Redacted(), std::strerror(errno)));
  }
  *wait = POLLIN;
  return 0;
}

absl::Status RedisClient::WriteAll(std::string_view bytes, absl::Time deadline) {
  while (!bytes.empty()) {
    short wait = 0;
    absl::StatusOr<size_t> n = SendSome(bytes, &wait);
    if (!n.ok()) return Fail(n.status());
    bytes.remove_prefix(*n);
    if (wait != 0 && !WaitFor(wait, deadline)) {
      return Fail(absl::DeadlineExceededError(absl::StrFormat("redis %s: send timed out", url_.Redacted())));
    }
  }
  return absl::OkStatus();
}

absl::Status RedisClient::Fill(size_t n, absl::Time deadline) {
  char chunk[64 << 10];
  while (buffer_.size() - read_pos_ < n) {
    short wait = 0;
    absl::StatusOr<size_t> got = RecvSome(chunk, sizeof(chunk), &wait);
    if (!got.ok()) return Fail(got.status());
    buffer_.append(chunk, *got);
    if (wait != 0 && !WaitFor(wait, deadline)) {
      return Fail(absl::DeadlineExceededError(absl::StrFormat("redis %s: no reply in time", url_.Redacted())));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> RedisClient::ReadLine(absl::Time deadline) {
  constexpr size_t kMaxLine = 4096;  // a type byte, a number or a short status / error
  while (true) {
    const size_t end = buffer_.find("\r\n", read_pos_);
    if (end != std::string::npos) {
      std::string line = buffer_.substr(read_pos_, end - read_pos_);
      read_pos_ = end + 2;
      return line;
    }
    if (buffer_.size() - read_pos_ > kMaxLine) {
      return Fail(absl::DataLossError(absl::StrFormat("redis %s: a reply line over %d bytes", url_.Redacted(), kMaxLine)));
    }
    if (absl::Status s = Fill(buffer_.size() - read_pos_ + 1, deadline); !s.ok()) return s;
  }
}

absl::StatusOr<RedisClient::Reply> RedisClient::ReadReply(absl::Time deadline, int64_t max_bytes, int depth) {
  absl::StatusOr<std::string> line = ReadLine(deadline);
  if (!line.ok()) return line.status();
  auto bad = [&](std::string_view why) {
    return Fail(absl::DataLossError(absl::StrFormat("redis %s: %s", url_.Redacted(), why)));
  };
  if (line->empty()) return bad("an empty reply line");
  Reply r;
  const char type = (*line)[0];
  const std::string_view body = std::string_view(*line).substr(1);
  switch (type) {
    case '+':
      r.type = Reply::Type::kStatus;
      r.str = std::string(body);
      return r;
    case '-':
      r.type = Reply::Type::kError;
      r.str = std::string(body);
      return r;
    case ':':
      r.type = Reply::Type::kInteger;
      if (!absl::SimpleAtoi(A(body), &r.integer)) return bad("a malformed integer reply");
      return r;
    case '$': {
      int64_t n = 0;
      if (!absl::SimpleAtoi(A(body), &n) || n < -1) return bad("a malformed bulk length");
      if (n == -1) return r;  // nil
      if (n > max_bytes) {
        // The stream would have to be read past the value: drop the connection.
        Close();
        return absl::FailedPreconditionError(
            absl::StrFormat("redis %s: a value of %d bytes, over the %d expected", url_.Redacted(), n, max_bytes));
      }
      if (absl::Status s = Fill(static_cast<size_t>(n) + 2, deadline); !s.ok()) return s;
      if (buffer_.compare(read_pos_ + static_cast<size_t>(n), 2, "\r\n") != 0) return bad("a bulk string without CRLF");
      r.type = Reply::Type::kString;
      r.str = buffer_.substr(read_pos_, static_cast<size_t>(n));
      read_pos_ += static_cast<size_t>(n) + 2;
      return r;
    }
    case '*': {
      int64_t n = 0;
      if (!absl::SimpleAtoi(A(body), &n) || n < -1 || n > kMaxArray) return bad("a malformed or huge array");
      if (n == -1) return r;
      if (depth >= kMaxDepth) return bad("arrays nested too deep");
      r.type = Reply::Type::kArray;
      for (int64_t i = 0; i < n; ++i) {
        absl::StatusOr<Reply> e = ReadReply(deadline, max_bytes, depth + 1);
        if (!e.ok()) return e.status();
        r.elements.push_back(std::move(*e));
      }
      return r;
    }
    default:
      return bad(absl::StrFormat("an unknown reply type 0x%02x", static_cast<unsigned char>(type)));
  }
}

absl::StatusOr<std::vector<RedisClient::Reply>> RedisClient::Exchange(
    const std::vector<std::vector<std::string_view>>& commands, int64_t max_bytes, absl::Time deadline) {
  std::string out;
  for (const auto& c : commands) AppendCommand(c, &out);
  if (absl::Status s = WriteAll(out, deadline); !s.ok()) return s;
  std::vector<Reply> replies;
  replies.reserve(commands.size());
  for (size_t i = 0; i < commands.size(); ++i) {
    absl::StatusOr<Reply> r = ReadReply(deadline, max_bytes, 0);
    if (!r.ok()) return r.status();
    replies.push_back(std::move(*r));
  }
  // Everything read was parsed: start the next exchange on an empty buffer.
  if (read_pos_ != buffer_.size()) return Fail(absl::DataLossError("redis: bytes after the last reply"));
  buffer_.clear();
  read_pos_ = 0;
  return replies;
}

absl::StatusOr<std::vector<RedisClient::Reply>> RedisClient::Run(
    const std::vector<std::vector<std::string_view>>& commands, int64_t max_bytes) {
  if (fd_ < 0) {
    if (absl::Now() < retry_at_) return last_error_;
    if (absl::Status s = Connect(); !s.ok()) {
      Close();
      retry_at_ = absl::Now() + options_.retry_after;
      last_error_ = s;
      return s;
    }
  }
  absl::StatusOr<std::vector<Reply>> replies =
      Exchange(commands, std::min(max_bytes, options_.max_reply_bytes), absl::Now() + options_.io_timeout);
  if (!replies.ok() && fd_ < 0 && !absl::IsFailedPrecondition(replies.status())) {
    // The connection broke (or timed out): the next call dials again, after
    // the interval, so a stalled server is not asked again at once. (An
    // oversized value only cost its connection.)
    retry_at_ = absl::Now() + options_.retry_after;
    last_error_ = replies.status();
  }
  return replies;
}

absl::StatusOr<std::optional<std::string>> RedisClient::Get(std::string_view key, int64_t max_bytes) {
  absl::StatusOr<std::vector<Reply>> r = Run({{"GET", key}}, max_bytes);
  if (!r.ok()) return r.status();
  Reply& reply = (*r)[0];
  if (reply.type == Reply::Type::kNil) return std::optional<std::string>();
  if (reply.type != Reply::Type::kString) {
    return absl::FailedPreconditionError(absl::StrFormat("redis GET: %s", reply.str));
  }
  return std::optional<std::string>(std::move(reply.str));
}

absl::Status RedisClient::Set(std::string_view key, std::string_view value, absl::Duration ttl) {
  const std::string ms = std::to_string(std::max<int64_t>(1, absl::ToInt64Milliseconds(ttl)));
  std::vector<std::string_view> args = {"SET", key, value};
  if (ttl > absl::ZeroDuration()) args.insert(args.end(), {"PX", ms});
  absl::StatusOr<std::vector<Reply>> r = Run({args}, 1 << 10);
  if (!r.ok()) return r.status();
  const Reply& reply = (*r)[0];
  if (reply.type != Reply::Type::kStatus) {
    // OOM under maxmemory with noeviction, READONLY on a replica: Redis's words.
    return absl::ResourceExhaustedError(absl::StrFormat("redis SET: %s", reply.str));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> RedisClient::ExistsEach(absl::Span<const std::vector<std::string>> groups) {
  std::vector<std::vector<std::string_view>> commands;
  commands.reserve(groups.size());
  for (const auto& g : groups) {
    std::vector<std::string_view> c = {"EXISTS"};
    c.insert(c.end(), g.begin(), g.end());
    commands.push_back(std::move(c));
  }
  if (commands.empty()) return std::vector<int64_t>();
  absl::StatusOr<std::vector<Reply>> r = Run(commands, 1 << 10);
  if (!r.ok()) return r.status();
  std::vector<int64_t> out;
  for (const Reply& reply : *r) {
    if (reply.type != Reply::Type::kInteger) {
      return absl::FailedPreconditionError(absl::StrFormat("redis EXISTS: %s", reply.str));
    }
    out.push_back(reply.integer);
  }
  return out;
}

absl::Status RedisClient::Ping() {
  absl::StatusOr<std::vector<Reply>> r = Run({{"PING"}}, 1 << 10);
  if (!r.ok()) return r.status();
  if ((*r)[0].type != Reply::Type::kStatus) {
    return absl::FailedPreconditionError(absl::StrFormat("redis PING: %s", (*r)[0].str));
  }
  return absl::OkStatus();
}

}  // namespace chunkattn
