// A blocking HTTP/1.1 client call on libevent's evhttp, for load generators
// and tests that drive the OpenAI-compatible front as a client would: one
// request on its own connection and event base, with the reply's
// Server-Sent Events handed over as they arrive (so a caller can time each
// token), or the whole body.
//
// Plain HTTP only (no TLS). Thread-compatible: each call owns its event base,
// so any number of threads may call at once.
#ifndef CHUNKATTN_SERVICES_HTTP_HTTP_CLIENT_H_
#define CHUNKATTN_SERVICES_HTTP_HTTP_CLIENT_H_

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace chunkattn::http {

// Where a base URL points: "http://HOST:PORT[/PREFIX]" (HOST may be a [v6]
// literal; PREFIX, without a trailing slash, leads every path).
struct BaseUrl {
  std::string host;
  int port = 80;
  std::string prefix;
};

// INVALID_ARGUMENT for anything but such a URL (https, a query, no host...).
absl::StatusOr<BaseUrl> ParseBaseUrl(absl::string_view url);

struct ClientRequest {
  std::string method = "GET";  // GET or POST
  std::string path;            // after the base URL's prefix, e.g. "/v1/completions"
  std::string body;            // sent as application/json when not empty
  std::string bearer_token;    // "Authorization: Bearer ..." when not empty
  std::string request_id;      // X-Request-Id when not empty
  absl::Duration timeout = absl::Seconds(60);  // the whole call, connect to last byte
};

struct ClientReply {
  int status = 0;
  std::string content_type;
  // The body, unless it was an event stream handed to on_event.
  std::string body;
};

// Called with each event's data (the "data: " lines of one event joined by
// "\n") of a 200 text/event-stream reply, in order, on the calling thread.
using EventHandler = std::function<void(absl::string_view data)>;

// Sends `request` and waits for the whole reply. UNAVAILABLE when the
// connection fails or closes early, DEADLINE_EXCEEDED after the timeout; any
// HTTP status is a reply (the caller judges it).
absl::StatusOr<ClientReply> Call(const BaseUrl& base, const ClientRequest& request,
                                 const EventHandler& on_event = nullptr);

// Splits a growing Server-Sent Events text into events: Feed what arrives;
// each complete event's data goes to the handler; comments and other fields
// are skipped. Separate from Call so it can be tested byte by byte.
class EventStreamParser {
 public:
  explicit EventStreamParser(EventHandler on_event) : on_event_(std::move(on_event)) {}
  void Feed(absl::string_view bytes);

 private:
  EventHandler on_event_;
  std::string pending_;  // an incomplete line
  std::string data_;     // the current event's data so far
  bool has_data_ = false;
};

}  // namespace chunkattn::http

#endif  // CHUNKATTN_SERVICES_HTTP_HTTP_CLIENT_H_
