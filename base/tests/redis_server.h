// A redis-server of a test's own on 127.0.0.1 (Debian's, which
// scripts/install-deps.sh installs): a free port, no persistence, optionally a
// password; killed (SIGKILL) with the object or by Kill(). Tests only.
#ifndef CHUNKATTN_BASE_TESTS_REDIS_SERVER_H_
#define CHUNKATTN_BASE_TESTS_REDIS_SERVER_H_

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/redis_client.h"

namespace chunkattn {

class RedisServerForTest {
 public:
  explicit RedisServerForTest(std::string password = "") : password_(std::move(password)) {}
  ~RedisServerForTest() { Kill(); }

  // Starts it and waits (up to 10 s) until it answers PING. False when
  // redis-server is missing or never answers.
  bool Start() {
    port_ = FreePort();
    std::vector<std::string> args = {"redis-server", "--port",        std::to_string(port_),
                                     "--bind",       "127.0.0.1",     "--save",
                                     "",             "--appendonly",  "no",
                                     "--loglevel",   "warning",       "--daemonize",
                                     "no"};
    if (!password_.empty()) args.insert(args.end(), {"--requirepass", password_});
    pid_ = ::fork();
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlives a test that crashed
      const int null = ::open("/dev/null", O_WRONLY);  // its banner and warnings are not the test's output
      if (null >= 0) {
        ::dup2(null, 1);
        ::dup2(null, 2);
      }
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execvp("redis-server", argv.data());
      ::_exit(127);
    }
    if (pid_ < 0) return false;
    RedisOptions options;
    options.retry_after = absl::ZeroDuration();
    RedisClient client(url(), options);
    for (int i = 0; i < 200; ++i) {
      if (client.Ping().ok()) return true;
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {  // exited: not installed, or the port taken
        pid_ = -1;
        return false;
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
    return false;
  }

  void Kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

  int port() const { return port_; }
  RedisUrl url() const {
    RedisUrl u;
    u.host = "127.0.0.1";
    u.port = port_;
    u.password = password_;
    return u;
  }

 private:
  static int FreePort() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    ::close(fd);
    return ntohs(a.sin_port);
  }

  std::string password_;
  int port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace chunkattn

#endif  // CHUNKATTN_BASE_TESTS_REDIS_SERVER_H_
