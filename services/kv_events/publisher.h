// Publishes KV-event batches (kv_events.h) the way vLLM's ZmqEventPublisher
// does, and keeps them for subscribers that come late:
//  - a ZMQ PUB socket, each batch as the frames [topic, 8-byte big-endian
//    sequence number, msgpack batch]. It binds an endpoint whose host is a
//    wildcard ('*', 0.0.0.0, "::") or a loopback address (127.0.0.0/8,
//    [::1]), any endpoint with '*' or "::" in it, and ipc:// or inproc://;
//    it connects to any other (a router that binds one socket for every
//    engine);
//  - a ZMQ ROUTER replay socket: a request [8-byte start sequence number]
//    (from a REQ or DEALER client) gets the kept batches from that number
//    on, at most `replay_batches_per_request` of them, each as [empty,
//    topic, seq, payload], then the end marker [empty, empty, 0xFF x 8,
//    empty]. A client asks again from the last seq + 1 until a reply is
//    empty (it is then up to date);
//  - the same batches for in-process subscribers (the gRPC SubscribeKvEvents
//    stream), through Since() and WaitFor().
// One ring keeps the last `buffer_steps` batches for all three (replies to
// a replay are encoded again: replays are rare, and the ring then holds each
// batch once). Sequence numbers start at 0 when the publisher starts and
// never go back.
//
// The events carry every tenant's prompt tokens, so the sockets are guarded
// (SECURITY.md, "The KV-event ports"):
//  - a wildcard host is refused unless CURVE is on or the caller said so
//    (allow_plaintext_remote);
//  - with a CURVE secret key both sockets speak only CURVE (encrypted, and
//    only clients that know the server's public key); with client keys, a
//    ZAP handler on the publisher's thread admits only those;
//  - replies are paced: at most `max_replays` in progress, one per peer,
//    each sent only as fast as its peer reads (a ROUTER queue of
//    `replay_peer_queue` messages per peer, ZMQ_ROUTER_MANDATORY), and one
//    that makes no progress for kReplayStallTimeout is dropped. A request
//    beyond `max_replays` gets the end marker alone; a second one from a peer
//    whose reply is in progress is dropped. Memory held for replays is thus
//    about max_replays x replay_peer_queue batches, whatever the requests.
//
// Threads: Publish from one thread (the engine's loop); Since, WaitFor and
// the stats from any thread. The publisher's own thread encodes, sends,
// answers replay requests and ZAP requests, so Publish costs the loop only a
// queue push.
#ifndef CHUNKATTN_SERVICES_KV_EVENTS_PUBLISHER_H_
#define CHUNKATTN_SERVICES_KV_EVENTS_PUBLISHER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "services/kv_events/kv_events.h"

namespace chunkattn {

// The most batches a publisher keeps (each holds a step's events).
inline constexpr int64_t kMaxKvEventBufferSteps = 1000000;
// A replay in progress that sends nothing for this long (its peer reads
// nothing) is dropped.
inline constexpr absl::Duration kReplayStallTimeout = absl::Seconds(10);

struct KvEventPublisherOptions {
  std::string endpoint;         // ZMQ PUB, e.g. tcp://127.0.0.1:5556; "" : none
  std::string replay_endpoint;  // ZMQ ROUTER, e.g. tcp://127.0.0.1:5557; "" : none (needs `endpoint`)
  std::string topic;            // the first frame, e.g. kv@<pod ip>@<served model>
  int64_t buffer_steps = 10000;  // batches kept for replay and late subscribers
  // ZMQ send high-water mark of the PUB socket, messages per subscriber;
  // capped at buffer_steps (a subscriber further behind cannot be healed by
  // a replay anyway).
  int32_t hwm = 100000;
  KvEventFormat format = KvEventFormat::kMap;
  std::string medium = "GPU";    // every event's storage tier

  // Whether a wildcard host (tcp://*:P, tcp://0.0.0.0:P, tcp://[::]:P) may
  // be bound without CURVE: every tenant's prompts, in plaintext, to
  // whoever reaches the port.
  bool allow_plaintext_remote = false;
  // CURVE on both sockets: the server's secret key (Z85, curve.h); "" :
  // plaintext.
  std::string curve_secret_key;
  // The CURVE clients admitted (Z85 public keys); empty: any client that
  // knows the server's public key. Needs curve_secret_key.
  std::vector<std::string> curve_client_keys;

  // Replay bounds (above).
  int32_t replay_batches_per_request = 1000;
  int32_t replay_peer_queue = 128;  // ZMQ_SNDHWM of the ROUTER, messages per peer
  int32_t max_replays = 16;         // replies in progress at once
};

class KvEventPublisher {
 public:
  // Binds or connects the sockets and starts the thread. INVALID_ARGUMENT,
  // naming the coordinator's flag, for buffer_steps outside [1,
  // kMaxKvEventBufferSteps], a replay endpoint
  // without an endpoint or equal to it, an endpoint ZMQ rejects (it says
  // why: malformed, address in use, ...), a wildcard host without CURVE or
  // allow_plaintext_remote, a CURVE key that is not Z85, client keys or
  // CURVE without an endpoint, or replay bounds below 1.
  // FAILED_PRECONDITION for CURVE keys when libzmq has no CURVE.
  static absl::StatusOr<std::unique_ptr<KvEventPublisher>> Create(KvEventPublisherOptions options);
  ~KvEventPublisher();  // stops the thread, closes the sockets at once
  KvEventPublisher(const KvEventPublisher&) = delete;
  KvEventPublisher& operator=(const KvEventPublisher&) = delete;

  // The next batch, stamped now with the next sequence number. An empty
  // `events` publishes nothing.
  void Publish(std::vector<KvEvent> events);

  // The kept batches with seq >= `from`, in order.
  std::vector<std::shared_ptr<const KvEventBatch>> Since(uint64_t from) const;
  // Waits until a batch with seq >= `seq` exists or `timeout` passes;
  // whether it exists.
  bool WaitFor(uint64_t seq, absl::Duration timeout) const;
  // The sequence number the next batch will get, and the oldest one kept
  // (== next_seq() while none is).
  uint64_t next_seq() const;
  uint64_t oldest_seq() const;

  // The endpoints as bound (a port 0 resolved), "" when off.
  const std::string& bound_endpoint() const { return bound_endpoint_; }
  const std::string& bound_replay_endpoint() const { return bound_replay_endpoint_; }
  const KvEventPublisherOptions& options() const { return options_; }

  struct Stats {
    int64_t batches = 0;        // published
    int64_t events = 0;
    int64_t bytes = 0;          // msgpack payload sent on the PUB socket
    int64_t replay_requests = 0;   // well-formed ones received
    int64_t replay_batches = 0;    // sent in replies
    int64_t replay_refused = 0;    // requests beyond the bounds (end marker alone, or dropped)
    int64_t replay_dropped = 0;    // replies abandoned: the peer left or read nothing for kReplayStallTimeout
    int64_t replays_in_progress = 0;  // now
    int64_t curve_denied = 0;      // CURVE clients whose key is not admitted
  };
  Stats stats() const;

 private:
  struct Zmq;  // the context and sockets, the publisher thread's
  // A replay reply in progress.
  struct Reply {
    std::string identity;  // the ROUTER's peer
    uint64_t next = 0;     // the next batch to send
    int32_t left = 0;      // batches it may still get
    absl::Time last_progress;
  };
  enum class Progress { kDone, kMore, kBlocked, kGone };

  explicit KvEventPublisher(KvEventPublisherOptions options);
  absl::Status Open();
  void Run();
  void SendLive();
  void ReadReplayRequests();
  Progress ContinueReply(Reply& reply, int max_batches);
  void ServeReplies(bool* more);
  void AnswerZap();
  // Up to `max` kept batches with seq in [from, end), in order.
  std::vector<std::shared_ptr<const KvEventBatch>> Range(uint64_t from, uint64_t end, size_t max) const;

  const KvEventPublisherOptions options_;
  std::unique_ptr<Zmq> zmq_;
  std::string bound_endpoint_;
  std::string bound_replay_endpoint_;
  int wake_fd_ = -1;  // eventfd: Publish and the destructor wake the thread
  std::thread thread_;
  std::atomic<bool> stop_{false};

  mutable absl::Mutex mu_;
  mutable absl::CondVar cv_;
  std::deque<std::shared_ptr<const KvEventBatch>> ring_ ABSL_GUARDED_BY(mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  Stats stats_ ABSL_GUARDED_BY(mu_);

  // Publisher thread only.
  uint64_t sent_seq_ = 0;  // the next batch to send on PUB
  std::vector<Reply> replies_;  // at most options_.max_replays
};

}  // namespace chunkattn

#endif  // CHUNKATTN_SERVICES_KV_EVENTS_PUBLISHER_H_
