// Publishes KV-event batches (kv_events.h) the way vLLM's ZmqEventPublisher
// does, and keeps them for subscribers that come late:
//  - a ZMQ PUB socket, each batch as the frames [topic, 8-byte big-endian
//    sequence number, msgpack batch]; it binds an endpoint with '*' or "::"
//    in it (or ipc://, inproc://) and connects to any other (a router that
//    binds one socket for every engine);
//  - a ZMQ ROUTER replay socket: a request [8-byte start sequence number]
//    (from a REQ or DEALER client) gets, for every kept batch from that
//    number on, [empty, topic, seq, payload], then the end marker
//    [empty, empty, 0xFF x 8, empty];
//  - the same batches for in-process subscribers (the gRPC SubscribeKvEvents
//    stream), through Since() and WaitFor().
// One ring keeps the last `buffer_steps` batches for all three (replies to
// a replay are encoded again: replays are rare, and the ring then holds each
// batch once). Sequence numbers start at 0 when the publisher starts and
// never go back.
//
// Threads: Publish from one thread (the engine's loop); Since, WaitFor and
// the stats from any thread. The publisher's own thread encodes, sends and
// answers replay requests, so Publish costs the loop only a queue push.
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

struct KvEventPublisherOptions {
  std::string endpoint;         // ZMQ PUB, e.g. tcp://*:5556; "" : none
  std::string replay_endpoint;  // ZMQ ROUTER, e.g. tcp://*:5557; "" : none (needs `endpoint`)
  std::string topic;            // the first frame, e.g. kv@<pod ip>@<served model>
  int64_t buffer_steps = 10000;  // batches kept for replay and late subscribers
  int32_t hwm = 100000;          // ZMQ send high-water mark, messages
  KvEventFormat format = KvEventFormat::kMap;
  std::string medium = "GPU";    // every event's storage tier
};

class KvEventPublisher {
 public:
  // Binds or connects the sockets and starts the thread. INVALID_ARGUMENT,
  // naming the coordinator's flag, for buffer_steps outside [1,
  // kMaxKvEventBufferSteps], a replay endpoint
  // without an endpoint or equal to it, or an endpoint ZMQ rejects (it says
  // why: malformed, address in use, ...).
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
    int64_t replay_requests = 0;
  };
  Stats stats() const;

 private:
  struct Zmq;  // the context and sockets, the publisher thread's
  explicit KvEventPublisher(KvEventPublisherOptions options);
  absl::Status Open();
  void Run();
  void Replay(const std::string& identity, uint64_t from);

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
};

}  // namespace chunkattn

#endif  // CHUNKATTN_SERVICES_KV_EVENTS_PUBLISHER_H_
