// Checks that a listening port still accepts, from inside its own process.
// gRPC 1.51's listener stops for good after one failed accept() (out of
// descriptors: it logs "Failed accept4" and never accepts again) while the
// process, and a health port on another listener, go on answering SERVING.
// The probe notices: every `interval` it connects to the port and sends what
// a client sends first, the HTTP/2 client preface on a plaintext port or a TLS
// ClientHello on a TLS one; a listener that accepts answers (SETTINGS, a
// ServerHello, an alert or a close: any byte or a close will do) within
// `timeout`. A connection left in the kernel's backlog gets nothing. The
// probe then closes: a TLS server sees a client that went away mid-handshake,
// which gRPC does not log (it logs bytes that are not TLS), so a probe every
// few seconds leaves the log clean.
// After `failures` probes in a row get nothing, `on_dead` runs once (the
// coordinator turns liveness NOT_SERVING, so Kubernetes restarts the pod).
//
// Thread-compatibility: its own thread runs the probes and `on_dead`; the
// destructor stops and joins it.
#ifndef CHUNKATTN_SERVICES_COORDINATOR_LISTENER_PROBE_H_
#define CHUNKATTN_SERVICES_COORDINATOR_LISTENER_PROBE_H_

#include <functional>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace chunkattn {

struct ListenerProbeOptions {
  std::string host = "127.0.0.1";  // an IP literal; a wildcard bind is probed on loopback
  int port = 0;
  absl::Duration interval = absl::Seconds(5);
  absl::Duration timeout = absl::Seconds(2);
  int failures = 3;
  bool tls = false;  // the port serves TLS (mutual or not)
};

// Whether the listener at host:port accepted a connection and answered (or
// closed it) within `timeout`; `tls` as in ListenerProbeOptions.
bool ListenerAnswers(const std::string& host, int port, absl::Duration timeout, bool tls = false);

class ListenerProbe {
 public:
  ListenerProbe(ListenerProbeOptions options, std::function<void()> on_dead);
  ~ListenerProbe();
  ListenerProbe(const ListenerProbe&) = delete;
  ListenerProbe& operator=(const ListenerProbe&) = delete;

 private:
  void Run();

  const ListenerProbeOptions options_;
  const std::function<void()> on_dead_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace chunkattn

#endif  // CHUNKATTN_SERVICES_COORDINATOR_LISTENER_PROBE_H_
