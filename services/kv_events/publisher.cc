#include "services/kv_events/publisher.h"

#include <sys/eventfd.h>
#include <unistd.h>
#include <zmq.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace chunkattn {

namespace {

std::string SeqBytes(uint64_t seq) {
  std::string b(8, '\0');
  for (int i = 0; i < 8; ++i) b[i] = static_cast<char>(seq >> (8 * (7 - i)));
  return b;
}

// Sends `frames` as one multipart message; never blocks (a PUB drops at its
// high-water mark, a ROUTER drops for a peer that is gone).
void SendFrames(void* socket, const std::vector<std::string_view>& frames) {
  for (size_t i = 0; i < frames.size(); ++i) {
    const int flags = ZMQ_DONTWAIT | (i + 1 < frames.size() ? ZMQ_SNDMORE : 0);
    if (zmq_send(socket, frames[i].data(), frames[i].size(), flags) < 0) return;
  }
}

// vLLM binds what looks like a local address and connects to anything else.
bool ShouldBind(const std::string& endpoint) {
  return absl::StrContains(endpoint, "*") || absl::StrContains(endpoint, "::") ||
         absl::StartsWith(endpoint, "ipc://") || absl::StartsWith(endpoint, "inproc://");
}

std::string LastEndpoint(void* socket) {
  char buf[256];
  size_t size = sizeof(buf);
  if (zmq_getsockopt(socket, ZMQ_LAST_ENDPOINT, buf, &size) != 0 || size == 0) return "";
  return std::string(buf, size - 1);
}

}  // namespace

struct KvEventPublisher::Zmq {
  void* context = nullptr;
  void* pub = nullptr;
  void* router = nullptr;
  ~Zmq() {
    if (pub != nullptr) zmq_close(pub);
    if (router != nullptr) zmq_close(router);
    if (context != nullptr) zmq_ctx_term(context);
  }
};

KvEventPublisher::KvEventPublisher(KvEventPublisherOptions options) : options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<KvEventPublisher>> KvEventPublisher::Create(KvEventPublisherOptions options) {
  if (options.buffer_steps < 1 || options.buffer_steps > kMaxKvEventBufferSteps) {
    return absl::InvalidArgumentError(absl::StrCat("--kv_events_buffer_steps must be in [1, ",
                                                   kMaxKvEventBufferSteps, "], got ", options.buffer_steps));
  }
  if (options.endpoint.empty() && !options.replay_endpoint.empty()) {
    return absl::InvalidArgumentError("--kv_events_replay_endpoint needs --kv_events_endpoint");
  }
  if (!options.endpoint.empty() && options.endpoint == options.replay_endpoint &&
      !absl::EndsWith(options.endpoint, ":*")) {  // a port the kernel picks differs each time
    // ZMQ would let the second bind of an ipc:// path take it from the first.
    return absl::InvalidArgumentError("--kv_events_endpoint and --kv_events_replay_endpoint are the same");
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
  auto open = [&](int type, const std::string& endpoint, bool bind, void** socket,
                  std::string* bound) -> absl::Status {
    const char* what = type == ZMQ_PUB ? "--kv_events_endpoint" : "--kv_events_replay_endpoint";
    *socket = zmq_socket(zmq_->context, type);
    if (*socket == nullptr) return absl::InternalError(absl::StrCat("zmq_socket: ", zmq_strerror(errno)));
    zmq_setsockopt(*socket, ZMQ_LINGER, &linger, sizeof(linger));
    // The ROUTER too: a replay sends up to buffer_steps messages at once.
    zmq_setsockopt(*socket, ZMQ_SNDHWM, &options_.hwm, sizeof(options_.hwm));
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
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<const KvEventBatch>> out;
  if (ring_.empty()) return out;
  const uint64_t first = ring_.front()->seq;  // the ring's numbers are consecutive
  for (size_t i = from > first ? from - first : 0; i < ring_.size(); ++i) out.push_back(ring_[i]);
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
  const std::string_view topic = options_.topic;
  while (!stop_) {
    zmq_pollitem_t items[2] = {{nullptr, wake_fd_, ZMQ_POLLIN, 0}, {zmq_->router, 0, ZMQ_POLLIN, 0}};
    if (zmq_poll(items, zmq_->router != nullptr ? 2 : 1, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (items[0].revents & ZMQ_POLLIN) {
      uint64_t count;
      (void)!read(wake_fd_, &count, sizeof(count));
    }
    if (stop_) return;
    // Send what was published since the last pass, in order.
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
    if (zmq_->router == nullptr || !(items[1].revents & ZMQ_POLLIN)) continue;
    // Replay requests: [identity, empty, 8-byte start]; others are dropped.
    for (;;) {
      std::vector<std::string> frames;
      int more = 1;
      while (more) {
        zmq_msg_t msg;
        zmq_msg_init(&msg);
        if (zmq_msg_recv(&msg, zmq_->router, ZMQ_DONTWAIT) < 0) {
          zmq_msg_close(&msg);
          break;
        }
        frames.emplace_back(static_cast<const char*>(zmq_msg_data(&msg)), zmq_msg_size(&msg));
        more = zmq_msg_more(&msg);
        zmq_msg_close(&msg);
      }
      if (frames.empty()) break;
      if (frames.size() != 3 || !frames[1].empty() || frames[2].size() != 8) continue;
      uint64_t from = 0;
      for (unsigned char c : frames[2]) from = (from << 8) | c;
      {
        absl::MutexLock lock(&mu_);
        ++stats_.replay_requests;
      }
      Replay(frames[0], from);
    }
  }
}

void KvEventPublisher::Replay(const std::string& identity, uint64_t from) {
  // Only what was sent live (a request never gets ahead of the subscribers),
  // encoded again: the ring keeps each batch once, structured, for both
  // sockets and the in-process subscribers.
  const std::string_view topic = options_.topic;
  for (const auto& batch : Since(from)) {
    if (batch->seq >= sent_seq_) break;
    const std::string payload = EncodeKvEventBatch(*batch, options_.format, options_.medium);
    const std::string seq_bytes = SeqBytes(batch->seq);
    SendFrames(zmq_->router, {identity, "", topic, seq_bytes, payload});
  }
  SendFrames(zmq_->router, {identity, "", "", std::string(8, '\xff'), ""});
}

}  // namespace chunkattn
