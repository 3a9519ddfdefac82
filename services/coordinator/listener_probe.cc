#include "services/coordinator/listener_probe.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "absl/time/clock.h"
#include "openssl/bio.h"
#include "openssl/ssl.h"

namespace chunkattn {
namespace {

// Waits for `events` on fd until `deadline`.
bool WaitFor(int fd, short events, absl::Time deadline) {
  while (true) {
    const int ms = static_cast<int>(absl::ToInt64Milliseconds(deadline - absl::Now()));
    if (ms <= 0) return false;
    pollfd p{fd, events, 0};
    const int n = poll(&p, 1, ms);
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) return false;
  }
}

// A TLS ClientHello, as OpenSSL's client sends it first; empty if OpenSSL
// cannot make one (the probe then sends nothing and waits for a close).
std::string ClientHello() {
  std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)> ctx(SSL_CTX_new(TLS_client_method()), SSL_CTX_free);
  if (ctx == nullptr) return "";
  std::unique_ptr<SSL, decltype(&SSL_free)> ssl(SSL_new(ctx.get()), SSL_free);
  BIO* in = BIO_new(BIO_s_mem());
  BIO* out = BIO_new(BIO_s_mem());
  if (ssl == nullptr || in == nullptr || out == nullptr) {
    BIO_free(in);
    BIO_free(out);
    return "";
  }
  SSL_set_bio(ssl.get(), in, out);  // `ssl` owns both from here
  SSL_set_connect_state(ssl.get());
  (void)SSL_do_handshake(ssl.get());  // writes the hello, then wants the server's reply
  char* data = nullptr;
  const long n = BIO_get_mem_data(out, &data);
  return n > 0 ? std::string(data, static_cast<size_t>(n)) : "";
}

}  // namespace

bool ListenerAnswers(const std::string& host, int port, absl::Duration timeout, bool tls) {
  sockaddr_storage addr{};
  socklen_t len = 0;
  std::string target = host;
  if (target.empty() || target == "0.0.0.0") target = "127.0.0.1";
  if (target == "::" || target == "[::]") target = "::1";
  if (target.size() > 2 && target.front() == '[') target = target.substr(1, target.size() - 2);
  auto* v4 = reinterpret_cast<sockaddr_in*>(&addr);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&addr);
  if (inet_pton(AF_INET, target.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<uint16_t>(port));
    len = sizeof(*v4);
  } else if (inet_pton(AF_INET6, target.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<uint16_t>(port));
    len = sizeof(*v6);
  } else {
    return true;  // not an address this probe can reach: nothing to conclude
  }
  const int fd = socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return true;  // this process is out of descriptors: the listener is not the one to blame
  const absl::Time deadline = absl::Now() + timeout;
  bool answered = false;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), len) == 0 || errno == EINPROGRESS) {
    int error = 0;
    socklen_t elen = sizeof(error);
    if (WaitFor(fd, POLLOUT, deadline) && getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &elen) == 0 && error == 0) {
      // The HTTP/2 client preface and an empty SETTINGS frame, or a ClientHello.
      static constexpr char kPreface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";
      const std::string first = tls ? ClientHello() : std::string(kPreface, sizeof(kPreface) - 1);
      (void)!send(fd, first.data(), first.size(), MSG_NOSIGNAL);
      answered = WaitFor(fd, POLLIN, deadline);  // a byte, a close or a reset: accepted and handled
    }
  }
  close(fd);
  return answered;
}

ListenerProbe::ListenerProbe(ListenerProbeOptions options, std::function<void()> on_dead)
    : options_(std::move(options)), on_dead_(std::move(on_dead)), thread_([this] { Run(); }) {}

ListenerProbe::~ListenerProbe() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void ListenerProbe::Run() {
  int silent = 0;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      auto stopping = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return stop_; };
      mu_.AwaitWithTimeout(absl::Condition(&stopping), options_.interval);
      if (stop_) return;
    }
    if (ListenerAnswers(options_.host, options_.port, options_.timeout, options_.tls)) {
      silent = 0;
      continue;
    }
    if (++silent == options_.failures) {
      std::fprintf(stderr, "listener %s:%d accepts no connection (%d probes in a row): reporting it dead\n",
                   options_.host.c_str(), options_.port, silent);
      on_dead_();
    }
  }
}

}  // namespace chunkattn
