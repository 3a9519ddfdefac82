#include "services/openai/http_server.h"

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <event2/thread.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

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
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 413: return "Payload Too Large";
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

std::string OpenSslError() {
  const unsigned long e = ERR_get_error();
  if (e == 0) return "unknown error";
  char buffer[256];
  ERR_error_string_n(e, buffer, sizeof(buffer));
  return buffer;
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
  if (ctx == nullptr) return absl::InternalError("http server: SSL_CTX_new: " + OpenSslError());
  auto fail = [ctx](const std::string& what) {
    SSL_CTX_free(ctx);
    return absl::InvalidArgumentError(absl::StrCat("http server: ", what, ": ", OpenSslError()));
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

}  // namespace

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
  if (evhttp_accept_socket_with_handle(server->http_, *fd) == nullptr) {  // owns fd from here
    close(*fd);
    return absl::InternalError("http server: cannot accept on the socket");
  }
  evhttp_set_max_body_size(server->http_, static_cast<ev_ssize_t>(o.max_body_bytes));
  // Read (and drop) the rest of an oversized body before the 413, so a
  // client still sending sees the answer rather than a reset.
  evhttp_set_flags(server->http_, EVHTTP_SERVER_LINGERING_CLOSE);
  evhttp_set_max_headers_size(server->http_, kMaxHeaderBytes);
  const timeval timeout = Timeval(o.request_timeout);
  evhttp_set_timeout_tv(server->http_, &timeout);
  evhttp_set_allowed_methods(server->http_, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_HEAD);
  evhttp_set_gencb(server->http_, &HttpServer::OnRequest, server.get());
  if (server->ssl_ctx_ != nullptr) evhttp_set_bevcb(server->http_, MakeSslBufferevent, server->ssl_ctx_);
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
  if (wake_ != nullptr) event_free(wake_);
  if (base_ != nullptr) event_base_free(base_);
  if (ssl_ctx_ != nullptr) SSL_CTX_free(ssl_ctx_);
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
  self->handler_(std::move(r), std::move(reply));
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
        evbuffer* body = evbuffer_new();
        evbuffer_add(body, op.data.data(), op.data.size());
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
        if (bev != nullptr && evbuffer_get_length(bufferevent_get_output(bev)) > options_.max_pending_bytes) {
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
