// An HTTP/1.1 server for the OpenAI-compatible front, on libevent's evhttp:
// one event loop thread serves every connection (keep-alive, pipelining,
// chunked replies), so a thousand open streams cost a thousand sockets and
// buffers, not a thousand threads. TLS (and mutual TLS) through OpenSSL when
// certificate files are given.
//
// A handler gets each complete request on the loop thread and must not block
// there: it answers through a Reply, which any thread may use, later. Replies
// are applied on the loop thread in call order.
//
// Every byte a client sends passes a guard (a bufferevent filter between the
// socket and evhttp) that bounds what an unauthenticated or hostile client
// can hold:
//  - connections: beyond max_connections in all or max_connections_per_peer
//    from one address, a new connection is closed at once; when accept()
//    fails (out of descriptors) the listener pauses and retries with backoff,
//    logging at most once per 10 s;
//  - heads: a request's head (line and headers, at most 16 KiB) must arrive
//    whole within header_timeout of its first byte (of the connection, for the
//    first request); a connection that never sends is closed then;
//  - the head is checked (Options::head_check: route, method, credentials)
//    before any byte of its body is read: a refusal is answered at once and
//    the body is never buffered. So are a body over max_body_bytes (413), a
//    chunked or otherwise encoded request body (411: Content-Length only) and
//    a body that would take the bodies being received past
//    max_buffered_body_bytes (503);
//  - a body must arrive whole within body_timeout of its head (a total, not
//    an inactivity timeout: a trickle is cut);
//  - requests pass one at a time (a pipelined one waits in the socket's
//    buffer, bounded by its read watermark), and while a reply is pending the
//    connection is watched, so a client that leaves is noticed at once
//    (OnClose), streamed or not;
//  - a reply that ends the connection (Connection: close, a refusal) is sent
//    whole before the close: a refused body is read and dropped meanwhile,
//    for header_timeout at most.
// A connection idles request_timeout between requests. While a reply is
// pending the connection may stay silent for up to reply_timeout (a long
// prefill). A client that reads slower than its reply is written, letting
// more than max_pending_bytes queue, is dropped (its OnClose runs).
//
// Thread-safe. The destructor stops the loop and joins it; replies still open
// get their OnClose, and later calls on them are dropped.
#ifndef CHUNKATTN_SERVICES_HTTP_HTTP_SERVER_H_
#define CHUNKATTN_SERVICES_HTTP_HTTP_SERVER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

struct bufferevent;
struct event_base;
struct evconnlistener;
struct evhttp;
struct evhttp_connection;
struct evhttp_request;
struct event;
struct ssl_ctx_st;

namespace chunkattn::http {

struct Request {
  std::string method;  // GET, POST, HEAD, ...
  std::string path;    // without the query
  std::string body;
  std::string authorization;  // the Authorization header; empty when absent
  std::string request_id;     // the X-Request-Id header; empty when absent
};

class HttpServer;

// One request's reply. Send, or StartStream then Write... then End; anything
// after the reply ended, or after the client went away, is dropped.
class Reply : public std::enable_shared_from_this<Reply> {
 public:
  // The whole reply (Content-Length; to a HEAD, its head alone).
  void Send(int status, std::string content_type, std::string body, std::string extra_header = "");
  // A streamed reply (chunked transfer coding), e.g. Server-Sent Events.
  void StartStream(int status, std::string content_type);
  void Write(std::string data);
  void End();

  // `on_close` runs once if the client goes away (or the server stops)
  // before the reply ended: on the loop thread, or at once on the calling
  // thread when that already happened.
  void OnClose(std::function<void()> on_close);
  bool closed() const { return closed_.load(); }

 private:
  friend class HttpServer;
  struct Op {
    enum Kind { kSend, kStart, kWrite, kEnd } kind;
    int status = 0;
    std::string content_type;
    std::string data;
    std::string extra_header;
  };
  struct Mailbox;
  explicit Reply(std::shared_ptr<Mailbox> mailbox) : mailbox_(std::move(mailbox)) {}
  void Post(Op op);

  const std::shared_ptr<Mailbox> mailbox_;
  absl::Mutex mu_;
  std::vector<Op> ops_ ABSL_GUARDED_BY(mu_);
  bool queued_ ABSL_GUARDED_BY(mu_) = false;  // in the mailbox
  std::function<void()> on_close_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> closed_{false};
  // The loop thread only: the request while its reply is open.
  evhttp_request* request_ = nullptr;
};

// A request's head, as the guard sees it before the body.
struct RequestHead {
  std::string method;  // as sent: GET, POST, ...
  std::string path;    // without the query
  std::string authorization;
  int64_t content_length = 0;
  // Set when the server refuses the request whatever the check says (a body
  // too large, a Transfer-Encoding, too many bodies in flight): the check
  // should answer with this status in its own format, after its own checks.
  int problem = 0;
  std::string problem_message;
};

// An answer sent instead of reading the request on (then the connection
// closes).
struct Refusal {
  int status = 400;
  std::string content_type = "text/plain";
  std::string body;
  std::string extra_header;  // "Name: value", or empty
};

// Called on the loop thread for every request's head; must not block. A
// refusal is sent at once; nullopt lets the request through.
using HeadCheck = std::function<std::optional<Refusal>(const RequestHead& head)>;

struct Options {
  std::string host = "0.0.0.0";  // an IPv4 or IPv6 literal
  int port = 8000;                // 0 picks a free port (see port())
  size_t max_body_bytes = 16 << 20;
  absl::Duration request_timeout = absl::Seconds(30);
  absl::Duration reply_timeout = absl::Hours(1);
  size_t max_pending_bytes = 4 << 20;
  int max_connections = 1024;
  int max_connections_per_peer = 256;
  absl::Duration header_timeout = absl::Seconds(10);
  absl::Duration body_timeout = absl::Seconds(60);
  size_t max_buffered_body_bytes = 64 << 20;
  // Initialized, as every field is, so that `{host, port}` sets the rest.
  HeadCheck head_check = nullptr;  // empty: every head passes
  // PEM files: cert + key serve HTTPS; a client CA on top requires client
  // certificates it signed.
  std::string tls_cert_file = {}, tls_key_file = {}, tls_client_ca_file = {};
};

// Called on the loop thread for every complete request; must not block.
using Handler = std::function<void(Request request, std::shared_ptr<Reply> reply)>;

class HttpServer {
 public:
  // INVALID_ARGUMENT: a bad host, port or TLS file set; UNAVAILABLE: the port
  // cannot be bound.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(Options options, Handler handler);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const { return port_; }

  // What the guard did, since the start.
  struct Stats {
    int64_t open_connections = 0;
    int64_t refused_connections = 0;  // over a connection cap
    int64_t refused_heads = 0;        // answered from the head (head_check, 411, 413, 503)
    int64_t deadlines = 0;            // connections cut at header_timeout or body_timeout
    int64_t accept_errors = 0;        // accept() failures (out of descriptors)
  };
  Stats stats() const;

 private:
  HttpServer(Options options, Handler handler);
  struct Guard;  // one per connection: the filter's state (http_server.cc)
  friend struct Guard;
  // evhttp's bufferevent for a new connection: the guard over the socket (or
  // TLS) bufferevent.
  static bufferevent* NewConnection(event_base* base, void* self);
  static void OnAcceptError(evconnlistener* listener, void* self);
  static void OnAcceptRetry(int fd, short events, void* self);
  static void OnRequest(evhttp_request* request, void* self);
  // Detects the client leaving while its reply is pending (loop thread).
  void WatchForClose(evhttp_connection* connection);
  static void OnConnectionClose(evhttp_connection* connection, void* self);
  static void OnWake(int fd, short events, void* self);
  // Applies the posted ops of `reply` (loop thread).
  void Apply(Reply& reply, std::vector<Reply::Op> ops);
  // The reply ended or its client left: forget its connection (loop thread).
  void Detach(Reply& reply);

  const Options options_;
  const Handler handler_;
  std::shared_ptr<Reply::Mailbox> mailbox_;
  event_base* base_ = nullptr;
  evhttp* http_ = nullptr;
  event* wake_ = nullptr;
  ssl_ctx_st* ssl_ctx_ = nullptr;
  int port_ = 0;
  std::thread thread_;
  // The loop thread only: the open reply of each connection.
  std::unordered_map<evhttp_connection*, std::shared_ptr<Reply>> open_;
  // The loop thread only: the guards by the bufferevent evhttp reads, the
  // admitted connections per peer address and in all, the body bytes being
  // received.
  std::unordered_map<bufferevent*, Guard*> guards_;
  std::unordered_map<std::string, int> per_peer_;
  int admitted_ = 0;
  int64_t receiving_body_bytes_ = 0;
  evconnlistener* listener_ = nullptr;
  event* accept_retry_ = nullptr;
  absl::Duration accept_backoff_;
  absl::Time last_accept_log_ = absl::InfinitePast();
  int64_t accept_errors_logged_ = 0;
  std::atomic<int64_t> open_connections_{0}, refused_connections_{0}, refused_heads_{0}, deadlines_{0},
      accept_errors_{0};
};

}  // namespace chunkattn::http

#endif  // CHUNKATTN_SERVICES_HTTP_HTTP_SERVER_H_
