#include "services/http/http_client.h"

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace chunkattn::http {
namespace {

// A non-streamed body over this is a broken server, not a reply to keep.
constexpr size_t kMaxBodyBytes = 64 << 20;

struct BaseDeleter {
  void operator()(event_base* b) const { event_base_free(b); }
};
struct ConnectionDeleter {
  void operator()(evhttp_connection* c) const { evhttp_connection_free(c); }
};
struct UriDeleter {
  void operator()(evhttp_uri* u) const { evhttp_uri_free(u); }
};

// One call's state; libevent's callbacks run on the calling thread inside
// event_base_dispatch.
struct CallState {
  event_base* base = nullptr;
  const EventHandler* on_event = nullptr;
  std::optional<EventStreamParser> parser;  // a 200 event stream
  ClientReply reply;
  bool headers_seen = false, done = false, failed = false, too_big = false;
  std::optional<evhttp_request_error> error;  // what libevent reported, if anything

  void Headers(evhttp_request* req) {
    if (headers_seen) return;
    headers_seen = true;
    reply.status = evhttp_request_get_response_code(req);
    const char* type = evhttp_find_header(evhttp_request_get_input_headers(req), "Content-Type");
    reply.content_type = type != nullptr ? type : "";
    if (reply.status == 200 && *on_event != nullptr &&
        absl::StartsWithIgnoreCase(reply.content_type, "text/event-stream")) {
      parser.emplace(*on_event);
    }
  }
  void Drain(evhttp_request* req) {
    evbuffer* in = evhttp_request_get_input_buffer(req);
    const size_t n = evbuffer_get_length(in);
    if (n == 0) return;
    std::string bytes(n, '\0');
    evbuffer_remove(in, bytes.data(), n);
    if (parser) {
      parser->Feed(bytes);
    } else if (reply.body.size() + n > kMaxBodyBytes) {
      too_big = true;
      event_base_loopbreak(base);
    } else {
      reply.body += bytes;
    }
  }
};

void OnChunk(evhttp_request* req, void* arg) {
  auto* s = static_cast<CallState*>(arg);
  s->Headers(req);
  s->Drain(req);
}

void OnDone(evhttp_request* req, void* arg) {
  auto* s = static_cast<CallState*>(arg);
  // A null request or no status: the connection failed or closed early.
  if (req != nullptr && evhttp_request_get_response_code(req) != 0) {
    s->Headers(req);
    s->Drain(req);
    s->done = true;
  } else {
    s->failed = true;
  }
  event_base_loopbreak(s->base);
}

void OnError(evhttp_request_error error, void* arg) { static_cast<CallState*>(arg)->error = error; }

const char* ErrorText(std::optional<evhttp_request_error> error) {
  if (!error) return "the connection failed";
  switch (*error) {
    case EVREQ_HTTP_TIMEOUT: return "timed out";
    case EVREQ_HTTP_EOF: return "the server closed the connection";
    case EVREQ_HTTP_INVALID_HEADER: return "the reply's headers are malformed";
    case EVREQ_HTTP_BUFFER_ERROR: return "reading or writing the socket failed";
    case EVREQ_HTTP_DATA_TOO_LONG: return "the reply is too long";
    default: return "the request was cancelled";
  }
}

}  // namespace

absl::StatusOr<BaseUrl> ParseBaseUrl(absl::string_view url) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("'", url, "' is not an http://HOST:PORT[/PREFIX] URL: ", why));
  };
  if (absl::StartsWithIgnoreCase(url, "https://")) return bad("TLS is not supported by this client");
  std::unique_ptr<evhttp_uri, UriDeleter> uri(evhttp_uri_parse(std::string(url).c_str()));
  if (uri == nullptr) return bad("it does not parse");
  const char* scheme = evhttp_uri_get_scheme(uri.get());
  if (scheme == nullptr || !absl::EqualsIgnoreCase(scheme, "http")) return bad("the scheme must be http");
  const char* host = evhttp_uri_get_host(uri.get());
  if (host == nullptr || *host == '\0') return bad("no host");
  if (evhttp_uri_get_query(uri.get()) != nullptr || evhttp_uri_get_fragment(uri.get()) != nullptr ||
      evhttp_uri_get_userinfo(uri.get()) != nullptr) {
    return bad("no user, query or fragment allowed");
  }
  BaseUrl out;
  out.host = host;
  // libevent keeps a v6 literal's brackets; connecting wants the bare address.
  if (out.host.size() > 2 && out.host.front() == '[' && out.host.back() == ']') {
    out.host = out.host.substr(1, out.host.size() - 2);
  }
  const int port = evhttp_uri_get_port(uri.get());
  if (port == 0 || port > 65535) return bad("the port must be in [1, 65535]");
  out.port = port < 0 ? 80 : port;
  const char* path = evhttp_uri_get_path(uri.get());
  out.prefix = path != nullptr ? path : "";
  while (!out.prefix.empty() && out.prefix.back() == '/') out.prefix.pop_back();
  return out;
}

absl::StatusOr<ClientReply> Call(const BaseUrl& base, const ClientRequest& request, const EventHandler& on_event) {
  if (request.method != "GET" && request.method != "POST") {
    return absl::InvalidArgumentError(absl::StrCat("unsupported method ", request.method));
  }
  if (request.timeout <= absl::ZeroDuration()) return absl::InvalidArgumentError("the timeout must be positive");
  std::unique_ptr<event_base, BaseDeleter> ev_base(event_base_new());
  if (ev_base == nullptr) return absl::InternalError("event_base_new failed");
  // Freed before the base (declared after it).
  std::unique_ptr<evhttp_connection, ConnectionDeleter> connection(
      evhttp_connection_base_new(ev_base.get(), nullptr, base.host.c_str(), static_cast<uint16_t>(base.port)));
  if (connection == nullptr) return absl::InternalError("evhttp_connection_base_new failed");
  // One attempt: a load generator must see failures, not hide them in retries.
  evhttp_connection_set_retries(connection.get(), 0);
  const timeval whole = absl::ToTimeval(request.timeout);
  evhttp_connection_set_timeout_tv(connection.get(), &whole);
  evhttp_connection_set_max_headers_size(connection.get(), 64 << 10);

  CallState state;
  state.base = ev_base.get();
  state.on_event = &on_event;
  // Owned by the connection from evhttp_make_request on (freed after OnDone,
  // or by evhttp_connection_free if the call ends first).
  evhttp_request* req = evhttp_request_new(OnDone, &state);
  if (req == nullptr) return absl::InternalError("evhttp_request_new failed");
  evhttp_request_set_chunked_cb(req, OnChunk);
  evhttp_request_set_error_cb(req, OnError);
  evkeyvalq* headers = evhttp_request_get_output_headers(req);
  const std::string host_header =
      absl::StrContains(base.host, ':') ? absl::StrCat("[", base.host, "]:", base.port) : absl::StrCat(base.host, ":", base.port);
  evhttp_add_header(headers, "Host", host_header.c_str());
  evhttp_add_header(headers, "Connection", "close");
  evhttp_add_header(headers, "Accept", "application/json, text/event-stream");
  if (!request.bearer_token.empty()) {
    evhttp_add_header(headers, "Authorization", absl::StrCat("Bearer ", request.bearer_token).c_str());
  }
  if (!request.request_id.empty()) evhttp_add_header(headers, "X-Request-Id", request.request_id.c_str());
  if (!request.body.empty()) {
    evhttp_add_header(headers, "Content-Type", "application/json");
    evbuffer_add(evhttp_request_get_output_buffer(req), request.body.data(), request.body.size());
  }
  const std::string uri = base.prefix + (request.path.empty() ? "/" : request.path);
  if (evhttp_make_request(connection.get(), req, request.method == "GET" ? EVHTTP_REQ_GET : EVHTTP_REQ_POST,
                          uri.c_str()) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot send the request to ", base.host, ":", base.port));
  }
  // The inactivity timeout above bounds each wait; this bounds the whole call.
  event_base_loopexit(ev_base.get(), &whole);
  event_base_dispatch(ev_base.get());
  if (state.too_big) {
    return absl::ResourceExhaustedError(absl::StrCat("the reply's body is over ", kMaxBodyBytes, " bytes"));
  }
  if (!state.done) {
    const std::string where = absl::StrCat(request.method, " ", uri, " on ", base.host, ":", base.port);
    if (!state.failed || state.error == EVREQ_HTTP_TIMEOUT) {
      return absl::DeadlineExceededError(
          absl::StrCat(where, ": no reply within ", absl::FormatDuration(request.timeout)));
    }
    return absl::UnavailableError(absl::StrCat(where, ": ", ErrorText(state.error)));
  }
  return std::move(state.reply);
}

void EventStreamParser::Feed(absl::string_view bytes) {
  pending_.append(bytes.data(), bytes.size());
  size_t start = 0;
  for (size_t nl; (nl = pending_.find('\n', start)) != std::string::npos; start = nl + 1) {
    absl::string_view line(pending_.data() + start, nl - start);
    absl::ConsumeSuffix(&line, "\r");
    if (line.empty()) {  // the end of an event
      if (has_data_) on_event_(data_);
      data_.clear();
      has_data_ = false;
      continue;
    }
    if (line.front() == ':') continue;  // a comment
    absl::string_view field = line, value;
    if (const size_t colon = line.find(':'); colon != absl::string_view::npos) {
      field = line.substr(0, colon);
      value = line.substr(colon + 1);
      absl::ConsumePrefix(&value, " ");
    }
    if (field != "data") continue;
    if (has_data_) data_ += '\n';
    data_.append(value.data(), value.size());
    has_data_ = true;
  }
  pending_.erase(0, start);
}

}  // namespace chunkattn::http
