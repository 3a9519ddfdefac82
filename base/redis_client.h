// A small Redis client (RESP2 over TCP) for the shared KV tier (issue 41):
// the few commands that tier needs (AUTH, SELECT, GET, SET with a TTL,
// pipelined EXISTS), each bounded by a deadline.
//
// Why our own and not hiredis: Debian 12's hiredis (0.14) has no TLS and no
// per-command deadline on its blocking API (a timeout per socket call, so a
// server that trickles bytes holds the caller for ever); the few commands we
// send fit in a few hundred lines that bound every wait with poll(). TLS
// (rediss://) is OpenSSL over the same non-blocking socket, the handshake
// under the connect deadline: the server's certificate is verified against
// RedisTlsOptions' CAs and the URL's host, and a client certificate is sent
// when given (Redis asks for one unless its tls-auth-clients is off).
//
// Every reply is checked before it is used: its type, a bulk string's length
// against the caller's bound, an array's size; a protocol error or an
// exceeded deadline closes the connection (the stream is then out of step)
// and the client waits `retry_after` before it dials again, so a Redis that is
// down costs its callers one failed connect per interval, not one per call.
//
// Thread-compatible: one thread uses a client (each user of the shared tier
// owns its own).
#ifndef CHUNKATTN_BASE_REDIS_CLIENT_H_
#define CHUNKATTN_BASE_REDIS_CLIENT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace chunkattn {

// redis://[[user]:password@]host:port[/db], or rediss:// for TLS
struct RedisUrl {
  bool tls = false;  // rediss://
  std::string host;
  int port = 6379;
  std::string user;      // empty: AUTH with the password alone (Redis's default user)
  std::string password;  // empty: no AUTH; percent-decoded
  int db = 0;

  // The URL with the password as "***": what logs, metrics and info show.
  std::string Redacted() const;
};

// INVALID_ARGUMENT (never quoting the password) unless `url` is
// redis[s]://[[user]:password@]host[:port][/db] with a port in [1, 65535] and
// a db in [0, 65535].
absl::StatusOr<RedisUrl> ParseRedisUrl(std::string_view url);

// rediss://: what the client trusts and presents, as PEM text (so the
// coordinator can hand its files' contents to workers that lack the files).
struct RedisTlsOptions {
  std::string ca_pem;    // CA certificates the server's must chain to; empty: the system's
  std::string cert_pem;  // the client's certificate (and chain), for Redis's tls-auth-clients
  std::string key_pem;   // its private key: a secret, never logged
};

// INVALID_ARGUMENT (naming the field, never quoting a key) unless the PEM
// texts parse: CAs as certificates, a certificate and a key given together
// and matching.
absl::Status CheckRedisTlsOptions(const RedisTlsOptions& tls);

// `url` with any password replaced by "***", for a URL that may not parse.
std::string RedactRedisUrl(std::string_view url);

struct RedisOptions {
  absl::Duration connect_timeout = absl::Milliseconds(200);  // TCP connect, AUTH and SELECT
  absl::Duration io_timeout = absl::Milliseconds(200);       // one command or pipeline, send to last reply
  absl::Duration retry_after = absl::Seconds(1);             // after a failed connection, before the next dial
  int64_t max_reply_bytes = int64_t{1} << 30;                // the longest bulk string accepted
  RedisTlsOptions tls;                                        // for a rediss:// URL
};

class RedisClient {
 public:
  // Does not connect: the first command does.
  RedisClient(RedisUrl url, RedisOptions options);
  ~RedisClient();
  RedisClient(const RedisClient&) = delete;
  RedisClient& operator=(const RedisClient&) = delete;

  // The value of `key`; nullopt when it has none. FAILED_PRECONDITION when
  // it holds more than `max_bytes` (or is not a string), UNAVAILABLE /
  // DEADLINE_EXCEEDED when Redis cannot be reached in time,
  // PERMISSION_DENIED when it refuses the password.
  absl::StatusOr<std::optional<std::string>> Get(std::string_view key, int64_t max_bytes);
  // SET key value, with PX `ttl` when ttl > 0. Codes of Get.
  absl::Status Set(std::string_view key, std::string_view value, absl::Duration ttl);
  // For each group of keys, how many exist (EXISTS k1 k2 ...), all groups in
  // one pipelined round trip. Codes of Get.
  absl::StatusOr<std::vector<int64_t>> ExistsEach(absl::Span<const std::vector<std::string>> groups);
  // PING: whether Redis answers, for tests and readiness.
  absl::Status Ping();

  bool connected() const { return fd_ >= 0; }
  // Whether the connection is TLS (after a command connected it).
  bool encrypted() const;
  const RedisUrl& url() const { return url_; }

 private:
  struct Reply;
  struct Tls;  // OpenSSL's context and connection (redis_client.cc)
  // Sends `commands` (each an argument vector) in one write and reads one
  // reply per command, all before `io_timeout`. Connects first when needed.
  absl::StatusOr<std::vector<Reply>> Run(const std::vector<std::vector<std::string_view>>& commands,
                                         int64_t max_bytes);
  absl::Status Connect();
  absl::Status Handshake(absl::Time deadline);  // TLS over fd_
  void Close();
  // Waits (poll) until fd_ is ready for `events` or `deadline` passes.
  bool WaitFor(short events, absl::Time deadline);
  // One send or receive on the connection, TLS or plain: the bytes moved, or
  // 0 with `*wait` the poll events to wait for first (0: try again at once);
  // an error leaves the connection to the caller's Fail.
  absl::StatusOr<size_t> SendSome(std::string_view bytes, short* wait);
  absl::StatusOr<size_t> RecvSome(char* out, size_t size, short* wait);
  absl::Status Fail(absl::Status status);  // closes the connection, returns `status`
  absl::Status WriteAll(std::string_view bytes, absl::Time deadline);
  // Reads until `buffer_` holds at least `n` bytes from `read_pos_`.
  absl::Status Fill(size_t n, absl::Time deadline);
  absl::StatusOr<std::string> ReadLine(absl::Time deadline);
  absl::StatusOr<Reply> ReadReply(absl::Time deadline, int64_t max_bytes, int depth);
  absl::StatusOr<std::vector<Reply>> Exchange(const std::vector<std::vector<std::string_view>>& commands,
                                              int64_t max_bytes, absl::Time deadline);

  RedisUrl url_;
  RedisOptions options_;
  int fd_ = -1;
  std::unique_ptr<Tls> tls_;  // with a rediss:// URL
  absl::Time retry_at_ = absl::InfinitePast();  // no dial before this, after a failure
  absl::Status last_error_;                     // why the last connection failed
  std::string buffer_;                          // bytes read, not yet parsed from read_pos_
  size_t read_pos_ = 0;
};

}  // namespace chunkattn

#endif  // CHUNKATTN_BASE_REDIS_CLIENT_H_
