#include "services/kv_events/publisher.h"

#include <sys/eventfd.h>
#include <unistd.h>
#include <zmq.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "services/kv_events/curve.h"

namespace chunkattn {

namespace {

// A request is [identity, empty, 8 bytes]; a subscription a topic prefix; a
// CURVE handshake command a few hundred bytes. Anything larger ends the
// peer's connection before ZMQ allocates it.
constexpr int64_t kMaxInboundMessageBytes = 4096;
// Work per pass of the publisher's loop, so that live batches and ZAP
// replies never wait behind a flood.
constexpr int kMaxRequestsPerPass = 1024;
constexpr int kReplayBatchesPerPass = 64;
// How often replies blocked on a full peer queue are tried again: ZMQ tells
// a ROUTER nothing when one peer's queue drains.
constexpr long kReplayRetryMs = 2;
constexpr char kZapEndpoint[] = "inproc://zeromq.zap.01";  // RFC 27: where ZMQ asks

const std::string kEndSeq(8, '\xff');

std::string SeqBytes(uint64_t seq) {
  std::string b(8, '\0');
  for (int i = 0; i < 8; ++i) b[i] = static_cast<char>(seq >> (8 * (7 - i)));
  return b;
}

// Sends one frame without blocking: 0, or the errno (on a ROUTER with
// ZMQ_ROUTER_MANDATORY, the identity frame fails with EAGAIN when that
// peer's queue is full and EHOSTUNREACH when it is gone, sending nothing).
int SendFrame(void* socket, std::string_view frame, bool more) {
  if (zmq_send(socket, frame.data(), frame.size(), ZMQ_DONTWAIT | (more ? ZMQ_SNDMORE : 0)) >= 0) return 0;
  return zmq_errno();
}

// Sends `frames` as one multipart message; 0 or the first frame's errno
// (a PUB drops at its high-water mark and never fails).
int SendFrames(void* socket, const std::vector<std::string_view>& frames) {
  for (size_t i = 0; i < frames.size(); ++i) {
    if (int err = SendFrame(socket, frames[i], i + 1 < frames.size()); err != 0) return err;
  }
  return 0;
}

// One multipart message, without blocking; empty when none is waiting. The
// parts past `max_frames` are read but not kept: the message then has
// max_frames + 1 parts (the last empty), so that it reads as malformed.
std::vector<std::string> ReceiveFrames(void* socket, size_t max_frames) {
  std::vector<std::string> frames;
  int more = 1;
  while (more) {
    zmq_msg_t msg;
    zmq_msg_init(&msg);
    if (zmq_msg_recv(&msg, socket, ZMQ_DONTWAIT) < 0) {
      zmq_msg_close(&msg);
      break;
    }
    if (frames.size() < max_frames) {
      frames.emplace_back(static_cast<const char*>(zmq_msg_data(&msg)), zmq_msg_size(&msg));
    } else if (frames.size() == max_frames) {
      frames.emplace_back();
    }
    more = zmq_msg_more(&msg);
    zmq_msg_close(&msg);
  }
  return frames;
}

// The host of a tcp:// endpoint without its brackets ("" for other
// transports). A connect endpoint may name a source first ("src;host:port").
absl::string_view TcpHost(absl::string_view endpoint) {
  if (!absl::StartsWith(endpoint, "tcp://")) return {};
  absl::string_view rest = endpoint.substr(6);
  if (const size_t semi = rest.rfind(';'); semi != absl::string_view::npos) rest = rest.substr(semi + 1);
  const size_t colon = rest.rfind(':');
  absl::string_view host = colon == absl::string_view::npos ? rest : rest.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return host;
}

// Every address of the machine.
bool IsWildcardHost(absl::string_view host) { return host == "*" || host == "0.0.0.0" || host == "::"; }

// A loopback address ZMQ can bind (it binds IP literals and interface names,
// not host names: "localhost" stays a peer to connect to, as in vLLM).
bool IsLoopbackHost(absl::string_view host) { return host == "::1" || absl::StartsWith(host, "127."); }

// vLLM binds what looks like a local address and connects to anything else;
// we also bind 0.0.0.0 and IPv4 loopback, which vLLM would connect to.
bool ShouldBind(const std::string& endpoint) {
  const absl::string_view host = TcpHost(endpoint);
  return absl::StrContains(endpoint, "*") || absl::StrContains(endpoint, "::") ||
         absl::StartsWith(endpoint, "ipc://") || absl::StartsWith(endpoint, "inproc://") ||
         IsWildcardHost(host) || IsLoopbackHost(host);
}

std::string LastEndpoint(void* socket) {
  char buf[256];
  size_t size = sizeof(buf);
  if (zmq_getsockopt(socket, ZMQ_LAST_ENDPOINT, buf, &size) != 0 || size == 0) return "";
  return std::string(buf, size - 1);
}

std::string Z85Decode(const std::string& key) {
  std::string bytes(32, '\0');
  zmq_z85_decode(reinterpret_cast<uint8_t*>(bytes.data()), key.c_str());
  return bytes;
}

}  // namespace

struct KvEventPublisher::Zmq {
  void* context = nullptr;
  void* pub = nullptr;
  void* router = nullptr;
  void* zap = nullptr;  // REP on kZapEndpoint, with CURVE client keys
  absl::flat_hash_set<std::string> client_keys;  // 32-byte CURVE public keys admitted
  ~Zmq() {
    for (void* socket : {pub, router, zap}) {
      if (socket != nullptr) zmq_close(socket);
    }
    if (context != nullptr) zmq_ctx_term(context);
  }
};

KvEventPublisher::KvEventPublisher(KvEventPublisherOptions options) : options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<KvEventPublisher>> KvEventPublisher::Create(KvEventPublisherOptions options) {
  if (options.buffer_steps < 1 || options.buffer_steps > kMaxKvEventBufferSteps) {
    return absl::InvalidArgumentError(absl::StrCat("--kv_events_buffer_steps must be in [1, ",
                                                   kMaxKvEventBufferSteps, "], got ", options.buffer_steps));
  }
  if (options.replay_batches_per_request < 1 || options.replay_peer_queue < 1 || options.max_replays < 1) {
    return absl::InvalidArgumentError("KV-event replay bounds must be >= 1");
  }
  if (options.endpoint.empty() && !options.replay_endpoint.empty()) {
    return absl::InvalidArgumentError("--kv_events_replay_endpoint needs --kv_events_endpoint");
  }
  if (!options.endpoint.empty() && options.endpoint == options.replay_endpoint &&
      !absl::EndsWith(options.endpoint, ":*")) {  // a port the kernel picks differs each time
    // ZMQ would let the second bind of an ipc:// path take it from the first.
    return absl::InvalidArgumentError("--kv_events_endpoint and --kv_events_replay_endpoint are the same");
  }
  const bool curve = !options.curve_secret_key.empty();
  if (!options.curve_client_keys.empty() && !curve) {
    return absl::InvalidArgumentError("--kv_events_curve_client_keys_file needs --kv_events_curve_secret_key_file");
  }
  if (curve) {
    if (options.endpoint.empty()) {
      return absl::InvalidArgumentError("--kv_events_curve_secret_key_file needs --kv_events_endpoint");
    }
    if (!CurveAvailable()) {
      return absl::FailedPreconditionError(
          "--kv_events_curve_secret_key_file: this libzmq has no CURVE (it was built without libsodium)");
    }
    if (!IsZ85Key(options.curve_secret_key)) {
      return absl::InvalidArgumentError("--kv_events_curve_secret_key_file: not a Z85 CURVE key (40 characters)");
    }
    for (size_t i = 0; i < options.curve_client_keys.size(); ++i) {
      if (!IsZ85Key(options.curve_client_keys[i])) {
        return absl::InvalidArgumentError(absl::StrCat("--kv_events_curve_client_keys_file: key ", i + 1,
                                                       " is not a Z85 CURVE key (40 characters)"));
      }
    }
  }
  // A wildcard host hands every tenant's prompts to whoever reaches the
  // port: only with CURVE, or when the operator says so.
  for (const auto& [endpoint, flag] : {std::pair{&options.endpoint, "--kv_events_endpoint"},
                                       std::pair{&options.replay_endpoint, "--kv_events_replay_endpoint"}}) {
    if (!curve && !options.allow_plaintext_remote && IsWildcardHost(TcpHost(*endpoint))) {
      return absl::InvalidArgumentError(absl::StrCat(
          flag, ": ", *endpoint,
          " binds every address, and the events carry every tenant's prompt tokens in plaintext: bind "
          "loopback or one private address, turn on CURVE (--kv_events_curve_secret_key_file), or accept it "
          "with --kv_events_allow_plaintext_remote (behind a NetworkPolicy that admits only the routers)"));
    }
  }
  std::unique_ptr<KvEventPublisher> p(new KvEventPublisher(std::move(options)));
  if (!p->options_.endpoint.empty()) {
    if (absl::Status s = p->Open(); !s.ok()) return s;
    p->thread_ = std::thread([raw = p.get()] { raw->Run(); });
  }
  return p;
}

absl::Status KvEventPublisher::Open() {
  zmq_ = std::make_unique<Zmq>();
  zmq_->context = zmq_ctx_new();
  if (zmq_->context == nullptr) return absl::InternalError(absl::StrCat("zmq_ctx_new: ", zmq_strerror(errno)));
  const int linger = 0;  // closing never waits for unsent events
  const bool curve = !options_.curve_secret_key.empty();
  // The ZAP handler first: a connection accepted before it is bound would be
  // let in without its key being checked.
  if (!options_.curve_client_keys.empty()) {
    for (const std::string& key : options_.curve_client_keys) zmq_->client_keys.insert(Z85Decode(key));
    zmq_->zap = zmq_socket(zmq_->context, ZMQ_REP);
    if (zmq_->zap == nullptr) return absl::InternalError(absl::StrCat("zmq_socket: ", zmq_strerror(errno)));
    zmq_setsockopt(zmq_->zap, ZMQ_LINGER, &linger, sizeof(linger));
    if (zmq_bind(zmq_->zap, kZapEndpoint) != 0) {
      return absl::InternalError(absl::StrCat("ZAP handler: ", zmq_strerror(errno)));
    }
  }
  auto open = [&](int type, const std::string& endpoint, bool bind, void** socket,
                  std::string* bound) -> absl::Status {
    const char* what = type == ZMQ_PUB ? "--kv_events_endpoint" : "--kv_events_replay_endpoint";
    *socket = zmq_socket(zmq_->context, type);
    if (*socket == nullptr) return absl::InternalError(absl::StrCat("zmq_socket: ", zmq_strerror(errno)));
    zmq_setsockopt(*socket, ZMQ_LINGER, &linger, sizeof(linger));
    const int64_t max_in = kMaxInboundMessageBytes;
    zmq_setsockopt(*socket, ZMQ_MAXMSGSIZE, &max_in, sizeof(max_in));
    if (type == ZMQ_PUB) {
      // The PUB shares each message among its subscribers, so this bounds
      // what a stalled subscriber holds to the ring's worth.
      const int hwm = static_cast<int>(std::min<int64_t>(options_.hwm, options_.buffer_steps));
      zmq_setsockopt(*socket, ZMQ_SNDHWM, &hwm, sizeof(hwm));
    } else {
      // Per peer: a reply waits for its peer to read rather than queue.
      const int mandatory = 1;
      zmq_setsockopt(*socket, ZMQ_SNDHWM, &options_.replay_peer_queue, sizeof(options_.replay_peer_queue));
      zmq_setsockopt(*socket, ZMQ_ROUTER_MANDATORY, &mandatory, sizeof(mandatory));
    }
    if (absl::StrContains(TcpHost(endpoint), ":")) {  // an IPv6 address
      const int ipv6 = 1;
      zmq_setsockopt(*socket, ZMQ_IPV6, &ipv6, sizeof(ipv6));
    }
    if (curve) {
      const int server = 1;
      const char domain[] = "chunkattn-kv-events";
      if (zmq_setsockopt(*socket, ZMQ_CURVE_SERVER, &server, sizeof(server)) != 0 ||
          zmq_setsockopt(*socket, ZMQ_CURVE_SECRETKEY, options_.curve_secret_key.data(), kCurveKeyZ85Chars) != 0 ||
          zmq_setsockopt(*socket, ZMQ_ZAP_DOMAIN, domain, sizeof(domain) - 1) != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("--kv_events_curve_secret_key_file: ZMQ refused the key: ", zmq_strerror(errno)));
      }
    }
    const int rc = bind ? zmq_bind(*socket, endpoint.c_str()) : zmq_connect(*socket, endpoint.c_str());
    if (rc != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": cannot ", bind ? "bind" : "connect to", " ", endpoint, ": ", zmq_strerror(errno)));
    }
    *bound = bind ? LastEndpoint(*socket) : endpoint;
    return absl::OkStatus();
  };
  if (absl::Status s = open(ZMQ_PUB, options_.endpoint, ShouldBind(options_.endpoint), &zmq_->pub, &bound_endpoint_);
      !s.ok()) {
    return s;
  }
  if (!options_.replay_endpoint.empty()) {
    if (absl::Status s = open(ZMQ_ROUTER, options_.replay_endpoint, true, &zmq_->router, &bound_replay_endpoint_);
        !s.ok()) {
      return s;
    }
  }
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) return absl::InternalError(absl::StrCat("eventfd: ", std::strerror(errno)));
  return absl::OkStatus();
}

KvEventPublisher::~KvEventPublisher() {
  stop_ = true;
  if (wake_fd_ >= 0) {
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
  }
  if (thread_.joinable()) thread_.join();
  zmq_.reset();
  if (wake_fd_ >= 0) close(wake_fd_);
}

void KvEventPublisher::Publish(std::vector<KvEvent> events) {
  if (events.empty()) return;
  auto batch = std::make_shared<KvEventBatch>();
  batch->ts = static_cast<double>(absl::ToUnixMicros(absl::Now())) / 1e6;
  batch->events = std::move(events);
  {
    absl::MutexLock lock(&mu_);
    batch->seq = next_seq_++;
    ++stats_.batches;
    stats_.events += static_cast<int64_t>(batch->events.size());
    ring_.push_back(std::move(batch));
    while (static_cast<int64_t>(ring_.size()) > options_.buffer_steps) ring_.pop_front();
  }
  if (wake_fd_ >= 0) {
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
  }
}

std::vector<std::shared_ptr<const KvEventBatch>> KvEventPublisher::Since(uint64_t from) const {
  return Range(from, UINT64_MAX, SIZE_MAX);
}

std::vector<std::shared_ptr<const KvEventBatch>> KvEventPublisher::Range(uint64_t from, uint64_t end,
                                                                          size_t max) const {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<const KvEventBatch>> out;
  if (ring_.empty()) return out;
  const uint64_t first = ring_.front()->seq;  // the ring's numbers are consecutive
  for (size_t i = from > first ? from - first : 0; i < ring_.size() && out.size() < max && ring_[i]->seq < end; ++i) {
    out.push_back(ring_[i]);
  }
  return out;
}

bool KvEventPublisher::WaitFor(uint64_t seq, absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto ready = [this, seq]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return next_seq_ > seq; };
  return mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
}

uint64_t KvEventPublisher::next_seq() const {
  absl::MutexLock lock(&mu_);
  return next_seq_;
}

uint64_t KvEventPublisher::oldest_seq() const {
  absl::MutexLock lock(&mu_);
  return ring_.empty() ? next_seq_ : ring_.front()->seq;
}

KvEventPublisher::Stats KvEventPublisher::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void KvEventPublisher::Run() {
  bool more = false;  // some reply could send more at once
  while (!stop_) {
    zmq_pollitem_t items[3] = {{nullptr, wake_fd_, ZMQ_POLLIN, 0}};
    int n = 1, router_item = -1, zap_item = -1;
    if (zmq_->router != nullptr) {
      router_item = n;
      items[n++] = {zmq_->router, 0, ZMQ_POLLIN, 0};
    }
    if (zmq_->zap != nullptr) {
      zap_item = n;
      items[n++] = {zmq_->zap, 0, ZMQ_POLLIN, 0};
    }
    const long timeout_ms = more ? 0 : replies_.empty() ? -1 : kReplayRetryMs;
    if (zmq_poll(items, n, timeout_ms) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (items[0].revents & ZMQ_POLLIN) {
      uint64_t count;
      (void)!read(wake_fd_, &count, sizeof(count));
    }
    if (stop_) return;
    // Handshakes first: a connecting router waits on them.
    if (zap_item >= 0 && (items[zap_item].revents & ZMQ_POLLIN)) AnswerZap();
    SendLive();
    more = false;
    if (router_item < 0) continue;
    if (items[router_item].revents & ZMQ_POLLIN) ReadReplayRequests();
    ServeReplies(&more);
  }
}

void KvEventPublisher::SendLive() {
  // What was published since the last pass, in order.
  const std::string_view topic = options_.topic;
  for (const auto& batch : Since(sent_seq_)) {
    std::string payload = EncodeKvEventBatch(*batch, options_.format, options_.medium);
    const std::string seq = SeqBytes(batch->seq);
    SendFrames(zmq_->pub, {topic, seq, payload});
    {
      absl::MutexLock lock(&mu_);
      stats_.bytes += static_cast<int64_t>(payload.size());
    }
    sent_seq_ = batch->seq + 1;
  }
}

void KvEventPublisher::ReadReplayRequests() {
  // Requests: [identity, empty, 8-byte start]; others are dropped.
  for (int n = 0; n < kMaxRequestsPerPass; ++n) {
    const std::vector<std::string> frames = ReceiveFrames(zmq_->router, 3);
    if (frames.empty()) break;
    if (frames.size() != 3 || !frames[1].empty() || frames[2].size() != 8) continue;
    uint64_t from = 0;
    for (unsigned char c : frames[2]) from = (from << 8) | c;
    const std::string& identity = frames[0];
    // A conforming client waits for the end marker before it asks again.
    const bool busy = std::any_of(replies_.begin(), replies_.end(),
                                  [&](const Reply& r) { return r.identity == identity; });
    const bool full = static_cast<int32_t>(replies_.size()) >= options_.max_replays;
    {
      absl::MutexLock lock(&mu_);
      ++stats_.replay_requests;
      if (busy || full) ++stats_.replay_refused;
    }
    if (busy) continue;
    if (full) {  // an empty reply: the client asks again later
      SendFrames(zmq_->router, {identity, "", "", kEndSeq, ""});
      continue;
    }
    replies_.push_back(Reply{identity, from, options_.replay_batches_per_request, absl::Now()});
  }
}

KvEventPublisher::Progress KvEventPublisher::ContinueReply(Reply& reply, int max_batches) {
  const std::string_view topic = options_.topic;
  int sent = 0;
  auto send = [&]() -> Progress {
    while (reply.left > 0 && sent < max_batches) {
      // Only what was sent live: a reply never gets ahead of the subscribers.
      // A few at a time: a blocked peer is tried every kReplayRetryMs.
      const auto batches =
          Range(reply.next, sent_seq_, static_cast<size_t>(std::min({reply.left, max_batches - sent, 8})));
      if (batches.empty()) break;
      for (const auto& batch : batches) {
        // The identity first: it fails, sending nothing, while the peer's
        // queue is full, and then nothing is encoded.
        if (const int err = SendFrame(zmq_->router, reply.identity, true); err != 0) {
          return err == EAGAIN ? Progress::kBlocked : Progress::kGone;
        }
        const std::string payload = EncodeKvEventBatch(*batch, options_.format, options_.medium);
        const std::string seq_bytes = SeqBytes(batch->seq);
        SendFrames(zmq_->router, {"", topic, seq_bytes, payload});
        reply.next = batch->seq + 1;
        --reply.left;
        ++sent;
      }
    }
    if (sent == max_batches && reply.left > 0) return Progress::kMore;
    if (const int err = SendFrames(zmq_->router, {reply.identity, "", "", kEndSeq, ""}); err != 0) {
      return err == EAGAIN ? Progress::kBlocked : Progress::kGone;
    }
    return Progress::kDone;
  };
  const Progress progress = send();
  if (sent > 0) {
    reply.last_progress = absl::Now();
    absl::MutexLock lock(&mu_);
    stats_.replay_batches += sent;
  }
  return progress;
}

void KvEventPublisher::ServeReplies(bool* more) {
  if (replies_.empty()) return;
  const absl::Time now = absl::Now();
  int64_t dropped = 0;
  for (size_t i = 0; i < replies_.size();) {
    const Progress progress = ContinueReply(replies_[i], kReplayBatchesPerPass);
    const bool drop = progress == Progress::kGone ||
                      (progress == Progress::kBlocked && now - replies_[i].last_progress > kReplayStallTimeout);
    if (progress == Progress::kMore) *more = true;
    if (progress == Progress::kDone || drop) {
      dropped += drop ? 1 : 0;
      if (i + 1 < replies_.size()) replies_[i] = std::move(replies_.back());  // any order will do
      replies_.pop_back();
      continue;
    }
    ++i;
  }
  absl::MutexLock lock(&mu_);
  stats_.replay_dropped += dropped;
  stats_.replays_in_progress = static_cast<int64_t>(replies_.size());
}

void KvEventPublisher::AnswerZap() {
  // RFC 27: [version, request id, domain, address, routing id, mechanism,
  // credentials...]; CURVE's one credential is the client's public key.
  for (;;) {
    const std::vector<std::string> frames = ReceiveFrames(zmq_->zap, 7);
    if (frames.empty()) return;
    const bool ok = frames.size() == 7 && frames[0] == "1.0" && frames[5] == "CURVE" &&
                    zmq_->client_keys.contains(frames[6]);
    if (!ok) {
      absl::MutexLock lock(&mu_);
      ++stats_.curve_denied;
    }
    const std::string request_id = frames.size() > 1 ? frames[1] : "";
    // A REP must answer every request, or it reads no other.
    SendFrames(zmq_->zap, {"1.0", request_id, ok ? "200" : "400", ok ? "OK" : "client key not admitted", "", ""});
  }
}

}  // namespace chunkattn
