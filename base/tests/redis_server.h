// A redis-server of a test's own on 127.0.0.1 (Debian's, which
// scripts/install-deps.sh installs): a free port, no persistence, optionally a
// password or TLS; killed (SIGKILL) with the object or by Kill(). And the
// certificates for its TLS, made by the openssl command. Tests only.
#ifndef CHUNKATTN_BASE_TESTS_REDIS_SERVER_H_
#define CHUNKATTN_BASE_TESTS_REDIS_SERVER_H_

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/redis_client.h"
#include "base/tests/temp_dir.h"

namespace chunkattn {

class RedisServerForTest {
 public:
  explicit RedisServerForTest(std::string password = "") : password_(std::move(password)) {}
  // TLS only (rediss://): no plaintext port; the server's certificate and key
  // files, the CA its clients' certificates must chain to (when
  // `auth_clients`), and what Start's own PING trusts and presents.
  struct Tls {
    std::string cert_file, key_file, ca_file;
    bool auth_clients = true;
    RedisTlsOptions client;
  };
  RedisServerForTest(std::string password, Tls tls) : password_(std::move(password)), tls_(std::move(tls)) {}
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
    if (tls_.has_value()) {
      args[2] = "0";  // --port 0: no plaintext
      args.insert(args.end(), {"--tls-port", std::to_string(port_), "--tls-cert-file", tls_->cert_file,
                               "--tls-key-file", tls_->key_file, "--tls-ca-cert-file", tls_->ca_file,
                               "--tls-auth-clients", tls_->auth_clients ? "yes" : "no"});
    }
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
    if (tls_.has_value()) options.tls = tls_->client;
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
    u.tls = tls_.has_value();
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
  std::optional<Tls> tls_;
  int port_ = 0;
  pid_t pid_ = -1;
};

// Certificates made by the openssl command (Debian's, scripts/install-deps.sh)
// in a temp folder: a CA, a server certificate for IP 127.0.0.1 only, a
// client certificate, and another CA that signed none of them.
class RedisTlsFilesForTest {
 public:
  bool Make() {
    dir_ = testing::MakeTempDir("chunkattn-redis-tls");
    if (dir_.empty()) return false;
    const std::string script = absl::StrCat(
        "set -e; cd '", dir_, "'; key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out $1; }; ",
        "for ca in ca other; do key $ca.key; openssl req -x509 -new -key $ca.key -subj /CN=$ca -days 2 -out $ca.crt; done; ",
        "printf 'subjectAltName=IP:127.0.0.1\n' > server.ext; printf 'extendedKeyUsage=clientAuth\n' > client.ext; ",
        "for who in server client; do key $who.key; openssl req -new -key $who.key -subj /CN=$who -out $who.csr; ",
        "openssl x509 -req -in $who.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -extfile $who.ext ",
        "-out $who.crt; done 2>/dev/null");
    return std::system(script.c_str()) == 0;
  }
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }
  std::string Read(const std::string& name) const {
    std::ifstream f(Path(name));
    return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  RedisTlsOptions Client() const { return {Read("ca.crt"), Read("client.crt"), Read("client.key")}; }
  RedisServerForTest::Tls Server(bool auth_clients) const {
    return {Path("server.crt"), Path("server.key"), Path("ca.crt"), auth_clients, Client()};
  }

 private:
  std::string dir_;
};

}  // namespace chunkattn

#endif  // CHUNKATTN_BASE_TESTS_REDIS_SERVER_H_
