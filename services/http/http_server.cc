#include "services/http/http_server.h"

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <event2/listener.h>
#include <event2/thread.h>
#include <event2/util.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "base/openssl_errors.h"

namespace chunkattn::http {

// Replies with work for the loop, and the event that wakes it. `open` turns
// false (under mu) before the event is freed, so a late Post never touches it.
struct Reply::Mailbox {
  absl::Mutex mu;
  std::vector<std::shared_ptr<Reply>> dirty ABSL_GUARDED_BY(mu);
  event* wake ABSL_GUARDED_BY(mu) = nullptr;
  bool open ABSL_GUARDED_BY(mu) = true;
};

namespace {

constexpr size_t kMaxHeaderBytes = 16 << 10;

timeval Timeval(absl::Duration d) { return absl::ToTimeval(d); }

const char* Reason(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Payload Too Large";
    case 431: return "Request Header Fields Too Large";
    case 429: return "Too Many Requests";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return "";
  }
}

std::string Header(evhttp_request* request, const char* name) {
  const char* value = evhttp_find_header(evhttp_request_get_input_headers(request), name);
  return value == nullptr ? std::string() : std::string(value);
}

absl::StatusOr<ssl_ctx_st*> MakeSslContext(const Options& o) {
  if (o.tls_cert_file.empty() != o.tls_key_file.empty()) {
    return absl::InvalidArgumentError("http server: TLS needs both a certificate and a key file");
  }
  if (o.tls_cert_file.empty()) {
    if (!o.tls_client_ca_file.empty()) {
      return absl::InvalidArgumentError("http server: a client CA needs a certificate and key");
    }
    return nullptr;
  }
  SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
  if (ctx == nullptr) return absl::InternalError("http server: SSL_CTX_new: " + OpenSslErrors());
  auto fail = [ctx](const std::string& what) {
    SSL_CTX_free(ctx);
    return absl::InvalidArgumentError(absl::StrCat("http server: ", what, ": ", OpenSslErrors()));
  };
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  if (SSL_CTX_use_certificate_chain_file(ctx, o.tls_cert_file.c_str()) != 1) {
    return fail("certificate " + o.tls_cert_file);
  }
  if (SSL_CTX_use_PrivateKey_file(ctx, o.tls_key_file.c_str(), SSL_FILETYPE_PEM) != 1) {
    return fail("private key " + o.tls_key_file);
  }
  if (SSL_CTX_check_private_key(ctx) != 1) return fail("the key does not match the certificate");
  if (!o.tls_client_ca_file.empty()) {
    if (SSL_CTX_load_verify_locations(ctx, o.tls_client_ca_file.c_str(), nullptr) != 1) {
      return fail("client CA " + o.tls_client_ca_file);
    }
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  }
  return ctx;
}

bufferevent* MakeSslBufferevent(event_base* base, void* ctx) {
  SSL* ssl = SSL_new(static_cast<SSL_CTX*>(ctx));
  if (ssl == nullptr) return nullptr;
  bufferevent* bev = bufferevent_openssl_socket_new(base, -1, ssl, BUFFEREVENT_SSL_ACCEPTING,
                                                    BEV_OPT_CLOSE_ON_FREE | BEV_OPT_DEFER_CALLBACKS);
  if (bev != nullptr) bufferevent_openssl_set_allow_dirty_shutdown(bev, 1);
  return bev;
}

// A non-blocking listening socket with a deep backlog: a burst of a thousand
// connects must not overflow libevent's default of 128 into SYN retries.
absl::StatusOr<int> Listen(const std::string& host, int port) {
  if (port < 0 || port > 65535) return absl::InvalidArgumentError(absl::StrCat("http server: bad port ", port));
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICHOST | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (getaddrinfo(host.c_str(), service.c_str(), &hints, &found) != 0 || found == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("http server: host \"", host, "\" is not an IP address"));
  }
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> info(found, freeaddrinfo);
  const int fd = socket(info->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("http server: socket: ", std::strerror(errno)));
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd, info->ai_addr, info->ai_addrlen) != 0 || listen(fd, 4096) != 0) {
    const std::string why = std::strerror(errno);
    close(fd);
    return absl::UnavailableError(absl::StrCat("http server: cannot listen on ", host, ":", port, ": ", why));
  }
  return fd;
}

int BoundPort(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return 0;
  if (addr.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
}

// The accept error callback gets the listener's user data, which evhttp set
// to itself: the server is found by its listener.
ABSL_CONST_INIT absl::Mutex listeners_mu(absl::kConstInit);
std::unordered_map<evconnlistener*, HttpServer*>& Listeners() ABSL_EXCLUSIVE_LOCKS_REQUIRED(listeners_mu) {
  static auto* servers = new std::unordered_map<evconnlistener*, HttpServer*>();
  return *servers;
}

constexpr absl::Duration kMinAcceptBackoff = absl::Milliseconds(50);
constexpr absl::Duration kMaxAcceptBackoff = absl::Seconds(1);

// What a head says about its body, or why it cannot be let through.
struct ParsedHead {
  RequestHead head;
  int problem = 0;  // an HTTP status the server refuses with; 0: none
  std::string problem_message;
  // The head as evhttp gets it: without a `Connection: close` header, which
  // the guard honours itself (close_after_reply). evhttp would free the
  // connection as soon as the reply left the guard, before the socket had
  // sent it.
  std::string passthrough;
  bool close_after_reply = false;
};

// The request line and the headers that matter before the body: evhttp
// parses the head again once it is let through (the guard never edits it).
ParsedHead ParseHead(absl::string_view text) {
  ParsedHead p;
  std::vector<absl::string_view> lines = absl::StrSplit(text, '\n');
  absl::string_view first = absl::StripTrailingAsciiWhitespace(lines.empty() ? "" : lines[0]);
  std::vector<absl::string_view> parts = absl::StrSplit(first, ' ', absl::SkipEmpty());
  if (parts.size() != 3 || !absl::StartsWith(parts[2], "HTTP/")) {
    p.problem = 400;
    p.problem_message = "malformed request line";
    return p;
  }
  p.head.method = std::string(parts[0]);
  // Refused, but after the headers are read: the check sees the credentials.
  if (p.head.method != "GET" && p.head.method != "POST" && p.head.method != "HEAD") {
    p.problem = 501;
    p.problem_message = absl::StrCat("method ", p.head.method, " not implemented");
  } else if (parts[2] != "HTTP/1.1") {
    p.problem = 505;
    p.problem_message = "HTTP/1.1 only";
  }
  absl::StrAppend(&p.passthrough, lines[0], "\n");
  absl::string_view target = parts[1];
  p.head.path = std::string(target.substr(0, target.find('?')));
  bool have_length = false;
  for (size_t i = 1; i < lines.size(); ++i) {
    absl::string_view line = absl::StripTrailingAsciiWhitespace(lines[i]);
    if (line.empty()) break;
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos) {
      p.problem = 400;
      p.problem_message = "malformed header line";
      return p;
    }
    const std::string name = absl::AsciiStrToLower(absl::StripAsciiWhitespace(line.substr(0, colon)));
    const absl::string_view value = absl::StripAsciiWhitespace(line.substr(colon + 1));
    if (name == "connection" && absl::StrContains(absl::AsciiStrToLower(value), "close")) {
      p.close_after_reply = true;
      continue;
    }
    absl::StrAppend(&p.passthrough, lines[i], "\n");
    if (name == "authorization") {
      p.head.authorization = std::string(value);
    } else if (name == "transfer-encoding" && p.problem == 0) {
      p.problem = 411;
      p.problem_message = "request bodies must have a Content-Length (no Transfer-Encoding)";
    } else if (name == "content-length") {
      int64_t n = 0;
      const bool digits = !value.empty() && value.size() <= 18 &&
                          std::all_of(value.begin(), value.end(), [](char c) { return absl::ascii_isdigit(c); });
      if (!digits || !absl::SimpleAtoi(value, &n) || (have_length && n != p.head.content_length)) {
        p.problem = value.size() > 18 && digits ? 413 : 400;
        p.problem_message = p.problem == 413 ? "request body too large" : "bad Content-Length";
        return p;
      }
      have_length = true;
      p.head.content_length = n;
    }
  }
  absl::StrAppend(&p.passthrough, "\r\n");
  return p;
}

}  // namespace

// The guard of one connection: evhttp reads the connection through a
// bufferevent filter whose input function is Filter; the timer admits the
// connection on the loop turn after its accept, then keeps one deadline.
// Loop thread only; freed by the filter's finalizer (Free).
struct HttpServer::Guard {
  enum class State { kHead, kBody, kDiscard };
  enum class Timer { kIdle, kHeadDeadline, kBodyDeadline, kKill, kDead };

  HttpServer* server;
  bufferevent* bev = nullptr;  // the filter: what evhttp reads and writes
  event* admit = nullptr;   // the caps, once, on the loop turn after the accept
  event* timer = nullptr;   // the one deadline (or the close) in force
  event* flush = nullptr;   // moves a reply on to the socket
  event* refill = nullptr;  // passes the next request once evhttp took the last
  Timer timer_role = Timer::kIdle;
  State state = State::kHead;
  bool head_started = false;  // bytes of the next head have arrived
  bool admitted = false;      // counted in per_peer_ and admitted_
  bool close_after_reply = false;  // the client asked (or was refused)
  bool closing = false;            // the reply has ended: close once it is sent
  std::string peer;
  int64_t body_left = 0;  // of the current request
  int64_t discard_left = 0;  // of a refused request's body
  int64_t reserved = 0;   // its share of receiving_body_bytes_
  std::optional<Refusal> refusal;  // to send instead of the request let through

  explicit Guard(HttpServer* s) : server(s) {}

  void Arm(Timer role, absl::Duration after) {
    evtimer_del(timer);
    timer_role = role;
    const timeval tv = Timeval(after);
    evtimer_add(timer, &tv);
  }
  void Disarm() {
    evtimer_del(timer);
    timer_role = Timer::kIdle;
  }
  // Closes the connection on the next loop turn (never from inside the
  // filter, which evhttp is calling).
  void KillSoon() {
    evtimer_del(timer);
    timer_role = Timer::kKill;
    event_active(timer, EV_TIMEOUT, 0);
  }
  void ReleaseBody() {
    server->receiving_body_bytes_ -= reserved;
    reserved = 0;
  }

  // Puts a refusal in place of the head (evhttp then answers it through
  // OnRequest and closes) and drops everything the client sends after it.
  // A body the client sends anyway (`body_bytes` announced) is read and
  // dropped before the close, so that the close does not reset a connection
  // whose client has not read the answer yet; for header_timeout at most.
  void Refuse(Refusal r, evbuffer* dst, int64_t body_bytes = 0) {
    ++server->refused_heads_;
    refusal = std::move(r);
    state = State::kDiscard;
    discard_left = body_bytes;
    close_after_reply = true;
    static constexpr char kSynthetic[] = "GET /.refused HTTP/1.1\r\n\r\n";
    evbuffer_add(dst, kSynthetic, sizeof(kSynthetic) - 1);
    Arm(Timer::kKill, server->options_.header_timeout);
  }

  // Decides a complete head of `length` bytes at the front of `src`.
  void Decide(evbuffer* src, evbuffer* dst, size_t length) {
    std::string text(length, '\0');
    evbuffer_remove(src, text.data(), length);
    ParsedHead p = ParseHead(text);
    const Options& o = server->options_;
    if (p.problem == 0 && static_cast<uint64_t>(p.head.content_length) > o.max_body_bytes) {
      p.problem = 413;
      p.problem_message = absl::StrCat("request body over ", o.max_body_bytes, " bytes");
    }
    if (p.problem == 0 &&
        server->receiving_body_bytes_ + p.head.content_length > static_cast<int64_t>(o.max_buffered_body_bytes)) {
      p.problem = 503;
      p.problem_message = "too many request bodies are being received; retry later";
    }
    std::optional<Refusal> refusal;
    if (o.head_check) {
      RequestHead head = p.head;
      head.problem = p.problem;
      head.problem_message = p.problem_message;
      refusal = o.head_check(head);
    }
    if (!refusal && p.problem != 0) refusal = Refusal{p.problem, "text/plain", p.problem_message + "\n", ""};
    if (refusal) return Refuse(*std::move(refusal), dst, p.head.content_length);
    close_after_reply |= p.close_after_reply;
    evbuffer_add(dst, p.passthrough.data(), p.passthrough.size());
    head_started = false;
    if (p.head.content_length > 0) {
      state = State::kBody;
      body_left = p.head.content_length;
      reserved = body_left;
      server->receiving_body_bytes_ += reserved;
      Arm(Timer::kBodyDeadline, o.body_timeout);
    } else {
      Disarm();
    }
  }

  static bufferevent_filter_result Filter(evbuffer* src, evbuffer* dst, ev_ssize_t dst_limit,
                                          bufferevent_flush_mode /*mode*/, void* arg) {
    auto* g = static_cast<Guard*>(arg);
    const size_t before = evbuffer_get_length(dst);
    while (evbuffer_get_length(src) > 0) {
      if (g->state == State::kDiscard || g->timer_role == Timer::kKill || g->timer_role == Timer::kDead) {
        const size_t n = evbuffer_get_length(src);
        evbuffer_drain(src, n);
        if (g->discard_left > 0) {
          g->discard_left -= static_cast<int64_t>(std::min<size_t>(n, g->discard_left));
          if (g->discard_left == 0 && g->closing) {
            g->CloseIfSent(bufferevent_get_output(bufferevent_get_underlying(g->bev)));
          }
        }
        break;
      }
      if (g->state == State::kBody) {
        size_t n = std::min<size_t>(evbuffer_get_length(src), g->body_left);
        if (dst_limit > 0) {
          const size_t moved = evbuffer_get_length(dst) - before;
          n = std::min<size_t>(n, static_cast<size_t>(dst_limit) > moved ? dst_limit - moved : 0);
        }
        if (n == 0) break;
        evbuffer_remove_buffer(src, dst, n);
        g->body_left -= static_cast<int64_t>(n);
        if (g->body_left == 0) {
          g->ReleaseBody();
          g->state = State::kHead;
          g->Disarm();
        }
        continue;
      }
      // One request at a time: the next head waits (in the socket's
      // bufferevent, bounded by its read watermark) until evhttp has taken
      // what was passed.
      if (evbuffer_get_length(dst) > 0) break;
      // A head: blank lines before it are skipped (as evhttp does).
      unsigned char c = 0;
      while (evbuffer_copyout(src, &c, 1) == 1 && (c == '\r' || c == '\n')) evbuffer_drain(src, 1);
      const size_t have = evbuffer_get_length(src);
      if (have == 0) break;
      if (!g->head_started) {
        g->head_started = true;
        if (g->timer_role == Timer::kIdle) g->Arm(Timer::kHeadDeadline, g->server->options_.header_timeout);
      }
      evbuffer_ptr crlf = evbuffer_search(src, "\r\n\r\n", 4, nullptr);
      evbuffer_ptr lf = evbuffer_search(src, "\n\n", 2, nullptr);
      size_t end = 0;
      if (crlf.pos >= 0) end = static_cast<size_t>(crlf.pos) + 4;
      if (lf.pos >= 0 && (end == 0 || static_cast<size_t>(lf.pos) + 2 < end)) end = static_cast<size_t>(lf.pos) + 2;
      if (end == 0 && have <= kMaxHeaderBytes) break;  // the rest of the head is to come
      if (end == 0 || end > kMaxHeaderBytes) {
        evbuffer_drain(src, have);
        g->Refuse(Refusal{431, "text/plain", "request head over 16 KiB\n", ""}, dst);
        break;
      }
      g->Decide(src, dst, end);
    }
    return evbuffer_get_length(dst) > before ? BEV_OK : BEV_NEED_MORE;
  }

  // The caps: the peer is known once evhttp has given the bufferevent its
  // socket. A head that came first keeps its own deadline.
  static void OnAdmit(evutil_socket_t, short, void* arg) {
    auto* g = static_cast<Guard*>(arg);
    HttpServer* s = g->server;
    if (!g->Alive() || g->timer_role == Timer::kDead) return;
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    const evutil_socket_t fd = bufferevent_getfd(g->bev);
    char host[INET6_ADDRSTRLEN] = "?";
    if (fd >= 0 && getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      const void* a = addr.ss_family == AF_INET6
                          ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&addr)->sin6_addr)
                          : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&addr)->sin_addr);
      evutil_inet_ntop(addr.ss_family, a, host, sizeof(host));
    }
    int& from_peer = s->per_peer_[host];
    // Admitted ones, not open ones: those accepted in the same loop turn are
    // open but not yet admitted, and a burst would be refused whole rather
    // than beyond the cap.
    if (s->admitted_ >= s->options_.max_connections ||
        from_peer >= s->options_.max_connections_per_peer) {
      if (from_peer == 0) s->per_peer_.erase(host);
      ++s->refused_connections_;
      return g->Kill();
    }
    ++from_peer;
    ++s->admitted_;
    g->admitted = true;
    g->peer = host;
    // The first head's clock runs from the connection's start.
    if (g->timer_role == Timer::kIdle && g->state == State::kHead) {
      g->Arm(Timer::kHeadDeadline, s->options_.header_timeout);
    }
  }

  static void OnTimer(evutil_socket_t, short, void* arg) {
    auto* g = static_cast<Guard*>(arg);
    HttpServer* s = g->server;
    switch (g->timer_role) {
      case Timer::kHeadDeadline:
      case Timer::kBodyDeadline:
        ++s->deadlines_;
        return g->Kill();
      case Timer::kKill:
        return g->Kill();
      case Timer::kIdle:
      case Timer::kDead:
        return;
    }
  }

  // Whether evhttp still holds the bufferevent. Once it frees it (clearing
  // its callbacks) the filter waits for its finalizer, and any call that
  // takes a reference on it would finalize it twice.
  bool Alive() const {
    bufferevent_event_cb eventcb = nullptr;
    bufferevent_getcb(bev, nullptr, nullptr, &eventcb, nullptr);
    return eventcb != nullptr;
  }

  // As if the client had closed: evhttp frees the connection (running its
  // close callback, so an open reply sees the client gone).
  void Kill() {
    timer_role = Timer::kDead;
    if (Alive()) bufferevent_trigger_event(bev, BEV_EVENT_EOF | BEV_EVENT_READING, 0);
  }

  static void OnOutput(evbuffer*, const evbuffer_cb_info* info, void* arg) {
    auto* g = static_cast<Guard*>(arg);
    if (info->n_added > 0) event_active(g->flush, EV_WRITE, 0);
  }
  static void OnFlush(evutil_socket_t, short, void* arg) {
    auto* g = static_cast<Guard*>(arg);
    if (g->Alive()) bufferevent_flush(g->bev, EV_WRITE, BEV_NORMAL);
  }
  // evhttp took bytes from what the guard passed: once it has taken all,
  // the next request waiting in the socket's buffer goes through (a filter
  // asks for input only when the socket has more, or its own buffer was full).
  static void OnTaken(evbuffer* buffer, const evbuffer_cb_info* info, void* arg) {
    auto* g = static_cast<Guard*>(arg);
    if (info->n_deleted > 0 && evbuffer_get_length(buffer) == 0) event_active(g->refill, EV_READ, 0);
  }
  static void OnRefill(evutil_socket_t, short, void* arg) {
    auto* g = static_cast<Guard*>(arg);
    bufferevent* socket = g->Alive() ? bufferevent_get_underlying(g->bev) : nullptr;
    if (socket != nullptr && evbuffer_get_length(bufferevent_get_input(socket)) > 0) {
      bufferevent_flush(g->bev, EV_READ, BEV_FLUSH);  // whether or not evhttp reads just now
    }
  }
  // The socket's (or TLS's) output: once a closing reply has left it whole,
  // the connection closes.
  static void OnSent(evbuffer* buffer, const evbuffer_cb_info*, void* arg) {
    auto* g = static_cast<Guard*>(arg);
    if (g->closing) g->CloseIfSent(buffer);
  }
  void CloseIfSent(evbuffer* socket_output) {
    if (discard_left == 0 && evbuffer_get_length(socket_output) == 0 &&
        evbuffer_get_length(bufferevent_get_output(bev)) == 0 && timer_role != Timer::kDead) {
      KillSoon();
    }
  }

  // The filter's finalizer: the connection is gone.
  static void Free(void* arg) {
    auto* g = static_cast<Guard*>(arg);
    HttpServer* s = g->server;
    s->guards_.erase(g->bev);
    if (g->admitted) {
      auto it = s->per_peer_.find(g->peer);
      if (it != s->per_peer_.end() && --it->second <= 0) s->per_peer_.erase(it);
      --s->admitted_;
    }
    g->ReleaseBody();
    --s->open_connections_;
    if (g->timer != nullptr) event_free(g->timer);
    if (g->admit != nullptr) event_free(g->admit);
    if (g->flush != nullptr) event_free(g->flush);
    if (g->refill != nullptr) event_free(g->refill);
    delete g;
  }
};

void Reply::Send(int status, std::string content_type, std::string body, std::string extra_header) {
  Post({Op::kSend, status, std::move(content_type), std::move(body), std::move(extra_header)});
}
void Reply::StartStream(int status, std::string content_type) {
  Post({Op::kStart, status, std::move(content_type), {}, {}});
}
void Reply::Write(std::string data) { Post({Op::kWrite, 0, {}, std::move(data), {}}); }
void Reply::End() { Post({Op::kEnd, 0, {}, {}, {}}); }

void Reply::OnClose(std::function<void()> on_close) {
  {
    absl::MutexLock lock(&mu_);
    if (!closed_.load()) {
      on_close_ = std::move(on_close);
      return;
    }
  }
  on_close();
}

void Reply::Post(Op op) {
  {
    absl::MutexLock lock(&mu_);
    if (closed_.load()) return;
    ops_.push_back(std::move(op));
    if (queued_) return;
    queued_ = true;
  }
  absl::MutexLock lock(&mailbox_->mu);
  if (!mailbox_->open) return;
  mailbox_->dirty.push_back(shared_from_this());
  if (mailbox_->dirty.size() == 1) event_active(mailbox_->wake, EV_READ, 0);
}

HttpServer::HttpServer(Options options, Handler handler)
    : options_(std::move(options)), handler_(std::move(handler)), mailbox_(std::make_shared<Reply::Mailbox>()) {}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(Options options, Handler handler) {
  if (!handler) return absl::InvalidArgumentError("http server: no handler");
  // Once per process, before any event base: makes event_active callable
  // from the engine's threads.
  static std::once_flag threads;
  std::call_once(threads, [] { evthread_use_pthreads(); });

  std::unique_ptr<HttpServer> server(new HttpServer(std::move(options), std::move(handler)));
  const Options& o = server->options_;
  absl::StatusOr<ssl_ctx_st*> ssl = MakeSslContext(o);
  if (!ssl.ok()) return ssl.status();
  server->ssl_ctx_ = *ssl;
  absl::StatusOr<int> fd = Listen(o.host, o.port);
  if (!fd.ok()) return fd.status();
  server->port_ = BoundPort(*fd);

  server->base_ = event_base_new();
  server->http_ = server->base_ ? evhttp_new(server->base_) : nullptr;
  if (server->http_ == nullptr) {
    close(*fd);
    return absl::InternalError("http server: cannot create the event loop");
  }
  evhttp_bound_socket* bound = evhttp_accept_socket_with_handle(server->http_, *fd);
  if (bound == nullptr) {  // owns fd from here
    close(*fd);
    return absl::InternalError("http server: cannot accept on the socket");
  }
  // Out of descriptors, accept() fails until one frees: pause and retry
  // rather than spin (libevent's default logs every failure, in a loop).
  server->listener_ = evhttp_bound_socket_get_listener(bound);
  server->accept_retry_ = evtimer_new(server->base_, &HttpServer::OnAcceptRetry, server.get());
  server->accept_backoff_ = kMinAcceptBackoff;
  {
    absl::MutexLock lock(&listeners_mu);
    Listeners()[server->listener_] = server.get();
  }
  evconnlistener_set_error_cb(server->listener_, &HttpServer::OnAcceptError);
  evhttp_set_max_body_size(server->http_, static_cast<ev_ssize_t>(o.max_body_bytes));
  // Read (and drop) the rest of an oversized body before the 413, so a
  // client still sending sees the answer rather than a reset.
  evhttp_set_flags(server->http_, EVHTTP_SERVER_LINGERING_CLOSE);
  evhttp_set_max_headers_size(server->http_, kMaxHeaderBytes);
  const timeval timeout = Timeval(o.request_timeout);
  evhttp_set_timeout_tv(server->http_, &timeout);
  evhttp_set_allowed_methods(server->http_, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_HEAD);
  evhttp_set_gencb(server->http_, &HttpServer::OnRequest, server.get());
  evhttp_set_bevcb(server->http_, &HttpServer::NewConnection, server.get());
  {
    absl::MutexLock lock(&server->mailbox_->mu);
    server->wake_ = event_new(server->base_, -1, 0, &HttpServer::OnWake, server.get());
    server->mailbox_->wake = server->wake_;
  }
  HttpServer* raw = server.get();
  server->thread_ = std::thread([raw] { event_base_loop(raw->base_, EVLOOP_NO_EXIT_ON_EMPTY); });
  return server;
}

HttpServer::~HttpServer() {
  {
    // The loop sees `open` false at its next wake and breaks. (A plain
    // loopbreak before the loop has started would be forgotten.)
    absl::MutexLock lock(&mailbox_->mu);
    mailbox_->open = false;
    mailbox_->dirty.clear();
    if (wake_ != nullptr) event_active(wake_, EV_READ, 0);
  }
  if (thread_.joinable()) thread_.join();
  if (listener_ != nullptr) {
    absl::MutexLock lock(&listeners_mu);
    Listeners().erase(listener_);
  }
  // The loop has ended: this thread owns everything now.
  std::unordered_map<evhttp_connection*, std::shared_ptr<Reply>> open;
  open.swap(open_);
  for (auto& [connection, reply] : open) {
    evhttp_connection_set_closecb(connection, nullptr, nullptr);
    std::function<void()> on_close;
    {
      absl::MutexLock lock(&reply->mu_);
      reply->closed_ = true;
      reply->request_ = nullptr;
      on_close = std::move(reply->on_close_);
    }
    if (on_close) on_close();
  }
  if (http_ != nullptr) evhttp_free(http_);  // closes the connections
  if (accept_retry_ != nullptr) event_free(accept_retry_);
  if (wake_ != nullptr) event_free(wake_);
  if (base_ != nullptr) event_base_free(base_);
  if (ssl_ctx_ != nullptr) SSL_CTX_free(ssl_ctx_);
}

HttpServer::Stats HttpServer::stats() const {
  Stats s;
  s.open_connections = open_connections_.load();
  s.refused_connections = refused_connections_.load();
  s.refused_heads = refused_heads_.load();
  s.deadlines = deadlines_.load();
  s.accept_errors = accept_errors_.load();
  return s;
}

bufferevent* HttpServer::NewConnection(event_base* base, void* arg) {
  auto* self = static_cast<HttpServer*>(arg);
  self->accept_backoff_ = kMinAcceptBackoff;  // accept() works again
  bufferevent* socket = self->ssl_ctx_ != nullptr ? MakeSslBufferevent(base, self->ssl_ctx_)
                                                  : bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE);
  if (socket == nullptr) return nullptr;
  // What the socket's bufferevent holds while a request waits its turn.
  bufferevent_setwatermark(socket, EV_READ, 0, kMaxHeaderBytes + (64 << 10));
  auto* guard = new Guard(self);
  guard->timer = evtimer_new(base, &Guard::OnTimer, guard);
  guard->admit = event_new(base, -1, 0, &Guard::OnAdmit, guard);
  bufferevent* filter = guard->timer == nullptr || guard->admit == nullptr ? nullptr
                                                : bufferevent_filter_new(socket, &Guard::Filter, nullptr,
                                                                         BEV_OPT_CLOSE_ON_FREE, &Guard::Free, guard);
  if (filter == nullptr) {
    if (guard->timer != nullptr) event_free(guard->timer);
    if (guard->admit != nullptr) event_free(guard->admit);
    delete guard;
    bufferevent_free(socket);
    return nullptr;
  }
  // evhttp adds a reply to the output before it enables writing, and a
  // filter moves output on only when data is added while writing is on: a
  // flush on the next loop turn moves it.
  guard->flush = event_new(base, -1, 0, &Guard::OnFlush, guard);
  guard->refill = event_new(base, -1, 0, &Guard::OnRefill, guard);
  if (guard->flush == nullptr || guard->refill == nullptr) {
    bufferevent_free(filter);  // frees the guard
    return nullptr;
  }
  evbuffer_add_cb(bufferevent_get_output(filter), &Guard::OnOutput, guard);
  evbuffer_add_cb(bufferevent_get_input(filter), &Guard::OnTaken, guard);
  evbuffer_add_cb(bufferevent_get_output(socket), &Guard::OnSent, guard);
  guard->bev = filter;
  self->guards_[filter] = guard;
  ++self->open_connections_;
  // Admitted (or closed) on the next loop turn, once evhttp has given the
  // bufferevent its socket and the peer is known.
  event_active(guard->admit, EV_TIMEOUT, 0);
  return filter;
}

void HttpServer::OnAcceptError(evconnlistener* listener, void*) {
  const int err = EVUTIL_SOCKET_ERROR();
  HttpServer* self = nullptr;
  {
    absl::MutexLock lock(&listeners_mu);
    auto it = Listeners().find(listener);
    if (it != Listeners().end()) self = it->second;
  }
  if (self == nullptr) return;
  ++self->accept_errors_;
  ++self->accept_errors_logged_;
  evconnlistener_disable(listener);
  const timeval tv = Timeval(self->accept_backoff_);
  evtimer_add(self->accept_retry_, &tv);
  const absl::Time now = absl::Now();
  if (now - self->last_accept_log_ >= absl::Seconds(10)) {
    std::fprintf(stderr, "http server: accept: %s (%lld failures since the last report); retrying in %s\n",
                 evutil_socket_error_to_string(err), static_cast<long long>(self->accept_errors_logged_),
                 absl::FormatDuration(self->accept_backoff_).c_str());
    self->last_accept_log_ = now;
    self->accept_errors_logged_ = 0;
  }
  self->accept_backoff_ = std::min(2 * self->accept_backoff_, kMaxAcceptBackoff);
}

void HttpServer::OnAcceptRetry(evutil_socket_t, short, void* arg) {
  auto* self = static_cast<HttpServer*>(arg);
  evconnlistener_enable(self->listener_);
}

void HttpServer::OnRequest(evhttp_request* request, void* arg) {
  auto* self = static_cast<HttpServer*>(arg);
  Request r;
  switch (evhttp_request_get_command(request)) {
    case EVHTTP_REQ_GET: r.method = "GET"; break;
    case EVHTTP_REQ_POST: r.method = "POST"; break;
    case EVHTTP_REQ_HEAD: r.method = "HEAD"; break;
    default: r.method = "OTHER"; break;
  }
  const char* uri = evhttp_request_get_uri(request);
  r.path = uri == nullptr ? "/" : uri;
  r.path = r.path.substr(0, r.path.find('?'));
  r.authorization = Header(request, "Authorization");
  r.request_id = Header(request, "X-Request-Id");
  evbuffer* body = evhttp_request_get_input_buffer(request);
  r.body.resize(evbuffer_get_length(body));
  if (!r.body.empty()) evbuffer_copyout(body, r.body.data(), r.body.size());

  std::shared_ptr<Reply> reply(new Reply(self->mailbox_));
  reply->request_ = request;
  evhttp_connection* connection = evhttp_request_get_connection(request);
  evhttp_connection_set_closecb(connection, &HttpServer::OnConnectionClose, self);
  const timeval patient = Timeval(self->options_.reply_timeout);
  evhttp_connection_set_timeout_tv(connection, &patient);
  self->open_[connection] = reply;
  // A head the guard refused arrives as a stand-in request: answer it.
  auto guard = self->guards_.find(evhttp_connection_get_bufferevent(connection));
  if (guard != self->guards_.end() && guard->second->refusal) {
    Refusal refusal = *std::move(guard->second->refusal);
    guard->second->refusal.reset();
    reply->Send(refusal.status, std::move(refusal.content_type), std::move(refusal.body),
                std::move(refusal.extra_header));
    return;
  }
  self->handler_(std::move(r), std::move(reply));
  self->WatchForClose(connection);
}

void HttpServer::WatchForClose(evhttp_connection* connection) {
  // evhttp stops reading once a request is whole, so a client that leaves
  // before its reply would be noticed only when the reply is written: a long
  // non-streamed completion would run to its end. Read on with no read
  // callback, as evhttp itself does while it writes: the close reaches its
  // event callback (and OnConnectionClose). A pipelined request waits in the
  // guard meanwhile (Guard::Filter passes one at a time).
  bufferevent* bev = evhttp_connection_get_bufferevent(connection);
  if (bev == nullptr || open_.count(connection) == 0) return;  // answered already
  bufferevent_data_cb writecb = nullptr;
  bufferevent_event_cb eventcb = nullptr;
  void* arg = nullptr;
  bufferevent_getcb(bev, nullptr, &writecb, &eventcb, &arg);
  bufferevent_setcb(bev, nullptr, writecb, eventcb, arg);
  bufferevent_enable(bev, EV_READ);
}

void HttpServer::OnConnectionClose(evhttp_connection* connection, void* arg) {
  auto* self = static_cast<HttpServer*>(arg);
  auto it = self->open_.find(connection);
  if (it == self->open_.end()) return;
  std::shared_ptr<Reply> reply = std::move(it->second);
  self->open_.erase(it);
  std::function<void()> on_close;
  {
    absl::MutexLock lock(&reply->mu_);
    reply->closed_ = true;
    reply->ops_.clear();
    on_close = std::move(reply->on_close_);
  }
  // A client that left mid-reply: libevent detached the request from its
  // connection and leaves it to us; otherwise it frees it with the connection.
  if (reply->request_ != nullptr && evhttp_request_get_connection(reply->request_) == nullptr) {
    evhttp_request_free(reply->request_);
  }
  reply->request_ = nullptr;
  if (on_close) on_close();
}

void HttpServer::OnWake(int, short, void* arg) {
  auto* self = static_cast<HttpServer*>(arg);
  std::vector<std::shared_ptr<Reply>> dirty;
  {
    absl::MutexLock lock(&self->mailbox_->mu);
    if (!self->mailbox_->open) {
      event_base_loopbreak(self->base_);
      return;
    }
    dirty.swap(self->mailbox_->dirty);
  }
  for (const std::shared_ptr<Reply>& reply : dirty) {
    std::vector<Reply::Op> ops;
    {
      absl::MutexLock lock(&reply->mu_);
      ops.swap(reply->ops_);
      reply->queued_ = false;
    }
    self->Apply(*reply, std::move(ops));
  }
}

void HttpServer::Detach(Reply& reply) {
  evhttp_connection* connection = evhttp_request_get_connection(reply.request_);
  reply.request_ = nullptr;
  if (connection != nullptr) {
    auto guard = guards_.find(evhttp_connection_get_bufferevent(connection));
    if (guard != guards_.end() && guard->second->close_after_reply) guard->second->closing = true;
  }
  {
    absl::MutexLock lock(&reply.mu_);
    reply.closed_ = true;  // ended: later calls are dropped, and no OnClose
    reply.on_close_ = nullptr;
  }
  if (connection == nullptr) return;
  evhttp_connection_set_closecb(connection, nullptr, nullptr);
  const timeval timeout = Timeval(options_.request_timeout);
  evhttp_connection_set_timeout_tv(connection, &timeout);
  open_.erase(connection);
}

void HttpServer::Apply(Reply& reply, std::vector<Reply::Op> ops) {
  for (Reply::Op& op : ops) {
    evhttp_request* request = reply.request_;
    if (request == nullptr) return;  // ended or gone
    evkeyvalq* headers = evhttp_request_get_output_headers(request);
    switch (op.kind) {
      case Reply::Op::kSend: {
        evhttp_add_header(headers, "Content-Type", op.content_type.c_str());
        if (!op.extra_header.empty()) {
          const size_t colon = op.extra_header.find(':');
          evhttp_add_header(headers, op.extra_header.substr(0, colon).c_str(),
                            op.extra_header.substr(colon + 2).c_str());
        }
        // evhttp sends whatever body it is given, even to a HEAD (whose
        // client would read it as the next reply): a HEAD gets the length a
        // GET would get, and no body.
        const bool head = evhttp_request_get_command(request) == EVHTTP_REQ_HEAD;
        if (head) evhttp_add_header(headers, "Content-Length", std::to_string(op.data.size()).c_str());
        evbuffer* body = evbuffer_new();
        if (!head) evbuffer_add(body, op.data.data(), op.data.size());
        Detach(reply);  // before the send: a send may free the request
        evhttp_send_reply(request, op.status, Reason(op.status), body);
        evbuffer_free(body);
        return;
      }
      case Reply::Op::kStart:
        evhttp_add_header(headers, "Content-Type", op.content_type.c_str());
        evhttp_add_header(headers, "Cache-Control", "no-cache");
        evhttp_send_reply_start(request, op.status, Reason(op.status));
        break;
      case Reply::Op::kWrite: {
        evhttp_connection* connection = evhttp_request_get_connection(request);
        bufferevent* bev = connection ? evhttp_connection_get_bufferevent(connection) : nullptr;
        size_t pending = 0;
        for (bufferevent* b = bev; b != nullptr; b = bufferevent_get_underlying(b)) {
          pending += evbuffer_get_length(bufferevent_get_output(b));  // the guard's, then the socket's
        }
        if (pending > options_.max_pending_bytes) {
          evhttp_connection_free(connection);  // a slow reader: runs OnConnectionClose
          return;
        }
        evbuffer* chunk = evbuffer_new();
        evbuffer_add(chunk, op.data.data(), op.data.size());
        evhttp_send_reply_chunk(request, chunk);
        evbuffer_free(chunk);
        break;
      }
      case Reply::Op::kEnd:
        Detach(reply);
        evhttp_send_reply_end(request);
        return;
    }
  }
}

}  // namespace chunkattn::http
