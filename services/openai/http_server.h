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
// Limits: a request body over max_body_bytes is refused with 413 and headers
// over 16 KiB with 400 before they are read (libevent answers these itself,
// with a short HTML page); a request must arrive within request_timeout, and
// a connection idles that long between requests. While a reply is pending
// the connection may stay silent for up to reply_timeout (a long prefill).
// A client that reads slower than its reply is written, letting more than
// max_pending_bytes queue, is dropped (its OnClose runs).
//
// Thread-safe. The destructor stops the loop and joins it; replies still open
// get their OnClose, and later calls on them are dropped.
#ifndef CHUNKATTN_SERVICES_OPENAI_HTTP_SERVER_H_
#define CHUNKATTN_SERVICES_OPENAI_HTTP_SERVER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

struct event_base;
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
  // The whole reply (Content-Length).
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

struct Options {
  std::string host = "0.0.0.0";  // an IPv4 or IPv6 literal
  int port = 8000;                // 0 picks a free port (see port())
  size_t max_body_bytes = 16 << 20;
  absl::Duration request_timeout = absl::Seconds(30);
  absl::Duration reply_timeout = absl::Hours(1);
  size_t max_pending_bytes = 4 << 20;
  // PEM files: cert + key serve HTTPS; a client CA on top requires client
  // certificates it signed.
  std::string tls_cert_file, tls_key_file, tls_client_ca_file;
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

 private:
  HttpServer(Options options, Handler handler);
  static void OnRequest(evhttp_request* request, void* self);
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
};

}  // namespace chunkattn::http

#endif  // CHUNKATTN_SERVICES_OPENAI_HTTP_SERVER_H_
