// The API listener's probe (services/coordinator/listener_probe.h) against
// real listeners on 127.0.0.1: gRPC servers in plaintext, TLS and mutual TLS,
// and a socket that listens but never accepts (a dead gRPC listener looks
// like that: connections queue in the kernel's backlog, nobody answers).
// gRPC's own log is captured, to show that a TLS probe leaves it clean where
// the plaintext preface sent to a TLS port would log a failed handshake.
#include "services/coordinator/listener_probe.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "grpc/support/log.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/security/server_credentials.h"
#include "gtest/gtest.h"
#include "openssl/evp.h"
#include "openssl/pem.h"
#include "openssl/x509.h"

namespace chunkattn {
namespace {

constexpr absl::Duration kTimeout = absl::Seconds(2);

// gRPC's log lines since the last Take(); gRPC logs from its own threads.
class GrpcLog {
 public:
  static void Install() { gpr_set_log_function(&GrpcLog::Append); }
  static std::string Take() {
    absl::MutexLock lock(&mu_);
    return std::exchange(*text_, "");
  }

 private:
  static void Append(gpr_log_func_args* args) {
    absl::MutexLock lock(&mu_);
    text_->append(args->message).append("\n");
  }
  static absl::Mutex mu_;
  static std::string* text_;
};
absl::Mutex GrpcLog::mu_;
std::string* GrpcLog::text_ = new std::string;

// A self-signed certificate for 127.0.0.1 and its key, in PEM.
struct SelfSigned {
  std::string key_pem, cert_pem;
};

std::string ToPem(int (*write)(BIO*, void*), void* object) {
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new(BIO_s_mem()), BIO_free);
  write(bio.get(), object);
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

SelfSigned MakeSelfSigned() {
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(EVP_EC_gen("P-256"), EVP_PKEY_free);
  std::unique_ptr<X509, decltype(&X509_free)> cert(X509_new(), X509_free);
  EXPECT_TRUE(key != nullptr && cert != nullptr);
  X509_set_version(cert.get(), 2);
  ASN1_INTEGER_set(X509_get_serialNumber(cert.get()), 1);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -60);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), 3600);
  X509_set_pubkey(cert.get(), key.get());
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>("localhost"), -1,
                             -1, 0);
  X509_set_issuer_name(cert.get(), name);
  EXPECT_GT(X509_sign(cert.get(), key.get(), EVP_sha256()), 0);
  SelfSigned out;
  out.key_pem = ToPem(
      [](BIO* b, void* k) {
        return PEM_write_bio_PrivateKey(b, static_cast<EVP_PKEY*>(k), nullptr, nullptr, 0, nullptr, nullptr);
      },
      key.get());
  out.cert_pem = ToPem([](BIO* b, void* c) { return PEM_write_bio_X509(b, static_cast<X509*>(c)); }, cert.get());
  return out;
}

// A gRPC server on 127.0.0.1 with `credentials`, answering every call
// UNIMPLEMENTED (a service it must have, and the probe calls none).
class Server {
 public:
  explicit Server(std::shared_ptr<grpc::ServerCredentials> credentials) {
    grpc::ServerBuilder builder;
    builder.RegisterCallbackGenericService(&generic_);
    builder.AddListeningPort("127.0.0.1:0", std::move(credentials), &port_);
    server_ = builder.BuildAndStart();
    EXPECT_NE(server_, nullptr) << GrpcLog::Take();
    EXPECT_GT(port_, 0);
  }
  ~Server() { server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1))); }
  int port() const { return port_; }

 private:
  grpc::CallbackGenericService generic_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

std::shared_ptr<grpc::ServerCredentials> Tls(const SelfSigned& cert, bool require_client_certificate) {
  grpc::SslServerCredentialsOptions options(
      require_client_certificate ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                                 : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  options.pem_key_cert_pairs.push_back({cert.key_pem, cert.cert_pem});
  if (require_client_certificate) options.pem_root_certs = cert.cert_pem;
  return grpc::SslServerCredentials(options);
}

// A socket on 127.0.0.1 that listens and never accepts.
class Deaf {
 public:
  Deaf() {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&addr), len), 0);
    EXPECT_EQ(listen(fd_, 16), 0);
    EXPECT_EQ(getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len), 0);
    port_ = ntohs(addr.sin_port);
  }
  ~Deaf() { close(fd_); }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

class ListenerProbeTest : public testing::Test {
 protected:
  static void SetUpTestSuite() { GrpcLog::Install(); }
};

TEST_F(ListenerProbeTest, PlaintextServerAnswersAndADeafSocketDoesNot) {
  Server server(grpc::InsecureServerCredentials());
  EXPECT_TRUE(ListenerAnswers("127.0.0.1", server.port(), kTimeout));
  EXPECT_TRUE(ListenerAnswers("0.0.0.0", server.port(), kTimeout));  // a wildcard bind, probed on loopback
  Deaf deaf;
  EXPECT_FALSE(ListenerAnswers("127.0.0.1", deaf.port(), absl::Milliseconds(300)));
  EXPECT_FALSE(ListenerAnswers("127.0.0.1", deaf.port(), absl::Milliseconds(300), /*tls=*/true));
}

TEST_F(ListenerProbeTest, TlsProbeAnswersAndLogsNothing) {
  const SelfSigned cert = MakeSelfSigned();
  for (bool mutual : {false, true}) {
    SCOPED_TRACE(mutual ? "mutual TLS" : "TLS");
    Server server(Tls(cert, mutual));
    GrpcLog::Take();
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(ListenerAnswers("127.0.0.1", server.port(), kTimeout, /*tls=*/true));
    absl::SleepFor(absl::Milliseconds(300));  // the server's handshake ends on its own threads
    const std::string quiet = GrpcLog::Take();
    EXPECT_FALSE(absl::StrContains(quiet, "Handshake failed")) << quiet;
    // What the TLS probe spares the log: the plaintext preface is answered
    // too (by a close), but logged as a failed handshake every time.
    EXPECT_TRUE(ListenerAnswers("127.0.0.1", server.port(), kTimeout));
    absl::SleepFor(absl::Milliseconds(300));
    const std::string noisy = GrpcLog::Take();
    EXPECT_TRUE(absl::StrContains(noisy, "Handshake failed")) << noisy;
  }
}

TEST_F(ListenerProbeTest, ReportsDeadAfterConsecutiveFailuresOnly) {
  ListenerProbeOptions options;
  options.host = "127.0.0.1";
  options.interval = absl::Milliseconds(20);
  options.timeout = absl::Milliseconds(100);
  options.failures = 3;
  Server live(grpc::InsecureServerCredentials());
  Deaf deaf;
  std::atomic<int> live_dead{0}, deaf_dead{0};
  {
    options.port = live.port();
    ListenerProbe probe_live(options, [&] { ++live_dead; });
    options.port = deaf.port();
    ListenerProbe probe_deaf(options, [&] { ++deaf_dead; });
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (deaf_dead.load() == 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
    absl::SleepFor(absl::Milliseconds(500));  // more failed probes: still reported once
  }
  EXPECT_EQ(deaf_dead.load(), 1);
  EXPECT_EQ(live_dead.load(), 0);
}

}  // namespace
}  // namespace chunkattn
