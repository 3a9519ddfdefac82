// chunkattn-worker: one tensor-parallel rank of the model. It waits for the
// cache coordinator to Join it (rank, world size, model, chunk size,
// rendezvous), then runs the plan stream the coordinator sends.
//
// Transport: plaintext, TLS, or mutual TLS (--tls_*: the coordinator and the
// other ranks must then show a certificate the CA signed, and this rank calls
// rank 0's rendezvous store the same way); --health_port serves health alone
// in plaintext, for Kubernetes' probes.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "base/address.h"
#include "base/device.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "base/flags.h"
#include "base/grpc_security.h"
#include "base/grpc_server.h"
#include "base/signals.h"
#include "workers/model/gpu_model.h"
#include "workers/server/worker_service.h"

ABSL_FLAG(std::string, listen, "0.0.0.0:50061", "host:port of the worker's gRPC server");
ABSL_FLAG(std::string, device, "cpu", "cpu | cuda | cuda:N (builds with CUDA)");
ABSL_FLAG(int, threads, 0, "CPU attention threads; 0 = the CPUs this process may use (affinity, cgroup CPU limit)");
ABSL_FLAG(int64_t, kv_cache_mib, 0,
          "KV pool budget of this rank, MiB; 0 = 1024 on CPU, on GPU what --gpu_memory_fraction leaves");
ABSL_FLAG(double, gpu_memory_fraction, 0.9,
          "share of the GPU's memory this worker may use (weights, workspace and KV pool), in (0, 1]");
ABSL_FLAG(std::string, weight_dtype, "auto",
          "weight matrices on this rank: auto (as the checkpoint stores them) | float32 | float16 | bfloat16 | "
          "int8 (CPU only: weight-only int8, one fp16 scale per 32 columns)");
ABSL_FLAG(int64_t, host_kv_cache_mib, 0,
          "host KV tier of this rank, MiB of RAM: chunks the coordinator moves out of the KV pool to load back "
          "later instead of recomputing them; 0 = off");
ABSL_FLAG(std::string, disk_kv_cache_dir, "",
          "disk KV tier of this rank: an existing directory for its one file (created per session, mode 0600, "
          "removed at the session's end; it holds prompts' KV); empty = off");
ABSL_FLAG(int64_t, disk_kv_cache_mib, 0, "disk KV tier budget, MiB (> 0 with --disk_kv_cache_dir)");
ABSL_FLAG(bool, cuda_graphs, true, "replay decode steps from CUDA graphs (one per batch-size bucket)");
ABSL_FLAG(std::string, collective_host, "",
          "address peers reach this rank's collectives at (default: the --listen host, or "
          "127.0.0.1 when that is 0.0.0.0)");
ABSL_FLAG(std::string, worker_token_file, "",
          "file of shared secrets, one per line: every call but health (the coordinator's, the peers' "
          "rendezvous) must send one; the first is what this worker sends its peers");
ABSL_FLAG(std::string, tls_cert_file, "",
          "PEM certificate chain: serve the worker port over TLS; also this worker's client certificate "
          "when it calls rank 0's rendezvous store");
ABSL_FLAG(std::string, tls_key_file, "", "PEM private key of --tls_cert_file");
ABSL_FLAG(std::string, tls_client_ca_file, "",
          "PEM CA bundle: require client certificates it signed (mTLS: the coordinator's, the peers'); also "
          "the roots rank 0's certificate must chain to (without it: the system's roots)");
ABSL_FLAG(std::string, worker_tls_server_name, "chunkattn-worker",
          "with --tls_cert_file: the name rank 0's certificate must carry, whatever its address (one "
          "certificate for every worker); empty = the rendezvous address's host");
ABSL_FLAG(int, health_port, 0,
          "plaintext grpc.health.v1 port on the --listen host, for probes (Kubernetes' cannot speak TLS); "
          "0 = off");
ABSL_FLAG(std::string, model_root, "",
          "a Join's model must lie under this folder (symbolic links resolved); empty = anywhere");
ABSL_FLAG(double, drain_timeout_s, 30,
          "on SIGTERM: health turns NOT_SERVING and Joins are refused at once; the coordinator's session is "
          "served until it finishes its running requests and lets go, for at most this long");

int main(int argc, char** argv) {
  chunkattn::NormalizeFlagDashes(argc, argv);
  absl::SetProgramUsageMessage("chunkattn compute worker: --listen HOST:PORT --device cpu|cuda:N");
  absl::ParseCommandLine(argc, argv);
  if (!chunkattn::InstallTerminationHandlers()) {
    std::perror("error: signal handlers");
    return 1;
  }
  const std::string listen = absl::GetFlag(FLAGS_listen);
  absl::StatusOr<chunkattn::HostPort> address = chunkattn::ParseHostPort("--listen", listen, 0);
  if (!address.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(address.status().message()).c_str());
    return 2;
  }
  absl::StatusOr<chunkattn::DeviceSpec> device = chunkattn::ParseDevice(absl::GetFlag(FLAGS_device));
  if (!device.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(device.status().message()).c_str());
    return 2;
  }
  if (absl::Status usable = chunkattn::CheckDevice(*device); !usable.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(usable.message()).c_str());
    return 2;
  }
  const double drain_timeout = absl::GetFlag(FLAGS_drain_timeout_s);
  if (!(drain_timeout >= 0 && drain_timeout <= 86400)) {
    std::fprintf(stderr, "error: --drain_timeout_s must be in [0, 86400], got %g\n", drain_timeout);
    return 2;
  }
  const int64_t mib = absl::GetFlag(FLAGS_kv_cache_mib);
  const double fraction = absl::GetFlag(FLAGS_gpu_memory_fraction);
  if (mib < 0 || mib > (int64_t{1} << 30)) {
    std::fprintf(stderr, "error: --kv_cache_mib must be in [0, 2^30]\n");
    return 2;
  }
  if (!(fraction > 0 && fraction <= 1)) {
    std::fprintf(stderr, "error: --gpu_memory_fraction must be in (0, 1]\n");
    return 2;
  }
  absl::StatusOr<chunkattn::WeightDType> weight_dtype =
      chunkattn::ParseWeightDType(absl::GetFlag(FLAGS_weight_dtype));
  if (!weight_dtype.ok()) {
    std::fprintf(stderr, "error: --weight_dtype: %s\n", std::string(weight_dtype.status().message()).c_str());
    return 2;
  }
  if (device->cuda && *weight_dtype == chunkattn::WeightDType::kInt8) {
    std::fprintf(stderr, "error: --weight_dtype int8 runs on the CPU only\n");
    return 2;
  }
  absl::StatusOr<chunkattn::KvTierOptions> kv_tiers = chunkattn::KvTierOptionsFromFlags(
      absl::GetFlag(FLAGS_host_kv_cache_mib), absl::GetFlag(FLAGS_disk_kv_cache_dir),
      absl::GetFlag(FLAGS_disk_kv_cache_mib));
  if (!kv_tiers.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(kv_tiers.status().message()).c_str());
    return 2;
  }
  chunkattn::WorkerOptions options;
  options.device = *device;
  options.kv_tiers = *kv_tiers;
  options.weight_dtype = *weight_dtype;
  options.threads = absl::GetFlag(FLAGS_threads);
  options.kv_cache_bytes = mib << 20;
  options.gpu_memory_fraction = fraction;
  options.cuda_graphs = absl::GetFlag(FLAGS_cuda_graphs);
  options.collective_host = absl::GetFlag(FLAGS_collective_host);
  if (options.collective_host.empty()) {
    options.collective_host =
        (address->host == "0.0.0.0" || address->host == "[::]") ? "127.0.0.1" : address->host;
  }

  absl::StatusOr<chunkattn::TokenAuth> auth =
      chunkattn::TokenAuth::FromFile(absl::GetFlag(FLAGS_worker_token_file), "--worker_token_file");
  if (!auth.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(auth.status().message()).c_str());
    return 2;
  }
  options.auth = *auth;
  if (const std::string root = absl::GetFlag(FLAGS_model_root); !root.empty()) {
    std::error_code error;
    const std::filesystem::path resolved = std::filesystem::canonical(root, error);
    if (error || !std::filesystem::is_directory(resolved)) {
      std::fprintf(stderr, "error: --model_root %s is not a folder\n", root.c_str());
      return 2;
    }
    options.model_root = resolved.string();
  }
  const chunkattn::TlsFiles tls{absl::GetFlag(FLAGS_tls_cert_file), absl::GetFlag(FLAGS_tls_key_file),
                                absl::GetFlag(FLAGS_tls_client_ca_file)};
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials = chunkattn::MakeServerCredentials(tls);
  if (!credentials.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(credentials.status().message()).c_str());
    return 2;
  }
  if (!tls.cert_chain.empty()) {
    // One internal PKI: the certificate this worker serves with is also the
    // one it shows rank 0, and the CA its callers must chain to is the one
    // rank 0's certificate must.
    absl::StatusOr<chunkattn::ChannelSecurity> peer_channel = chunkattn::MakeChannelSecurity(
        {{"--tls_client_ca_file", tls.client_ca}, {"--tls_cert_file", tls.cert_chain},
         {"--tls_key_file", tls.private_key}, absl::GetFlag(FLAGS_worker_tls_server_name)});
    if (!peer_channel.ok()) {
      std::fprintf(stderr, "error: %s\n", std::string(peer_channel.status().message()).c_str());
      return 2;
    }
    options.peer_channel = *std::move(peer_channel);
  }
  const int health_port = absl::GetFlag(FLAGS_health_port);
  if (health_port < 0 || health_port > 65535) {
    std::fprintf(stderr, "error: --health_port must be in [0, 65535]\n");
    return 2;
  }

  chunkattn::WorkerService service(options);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  chunkattn::ConfigureServer(builder);
  int bound = 0;
  builder.AddListeningPort(listen, *credentials, &bound);
  builder.SetMaxReceiveMessageSize(256 << 20);
  builder.SetMaxSendMessageSize(256 << 20);
  // Every call holds a sync-server thread: cap them, so a flood of calls
  // queues instead of growing the process.
  grpc::ResourceQuota quota("chunkattn-worker");
  quota.SetMaxThreads(512);
  builder.SetResourceQuota(quota);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || bound == 0) {
    std::fprintf(stderr, "error: cannot listen on %s\n", listen.c_str());
    return 1;
  }
  // Health alone, in plaintext, for probes that cannot speak TLS. (Its
  // destructor shuts it down, after the worker port.)
  std::unique_ptr<grpc::Server> health_server;
  if (health_port > 0) {
    const std::string health_address = absl::StrCat(address->host, ":", health_port);
    grpc::ServerBuilder health_builder;
    chunkattn::ConfigureServer(health_builder);
    int health_bound = 0;
    health_builder.AddListeningPort(health_address, grpc::InsecureServerCredentials(), &health_bound);
    health_server = health_builder.BuildAndStart();
    if (health_server == nullptr || health_bound == 0) {
      std::fprintf(stderr, "error: cannot listen on %s\n", health_address.c_str());
      return 1;
    }
    health_server->GetHealthCheckService()->SetServingStatus("", true);
    // Stays SERVING through a drain (readiness, "", does not): a liveness
    // probe must not kill a worker that is finishing its requests.
    health_server->GetHealthCheckService()->SetServingStatus("liveness", true);
  }
  std::fprintf(stderr, "chunkattn-worker listening on %s (%s, device %s, KV budget %s, %s, models from %s)\n",
               listen.c_str(),
               tls.cert_chain.empty() ? "plaintext" : tls.client_ca.empty() ? "TLS" : "mutual TLS",
               device->ToString().c_str(),
               mib > 0 ? (std::to_string(mib) + " MiB").c_str()
                       : (device->cuda ? "from --gpu_memory_fraction" : "1024 MiB"),
               auth->enabled() ? "worker token required" : "NO worker token: anyone who reaches this port may use it",
               options.model_root.empty() ? "anywhere" : options.model_root.c_str());
  chunkattn::WaitForTerminationSignal();
  // Drain: the coordinator learns it from the next step result (or its idle
  // probe), finishes what runs, starts nothing new and closes the stream.
  server->GetHealthCheckService()->SetServingStatus("", false);
  if (health_server != nullptr) health_server->GetHealthCheckService()->SetServingStatus("", false);
  service.BeginDrain();
  std::fprintf(stderr, "worker: draining (up to %g s)\n", drain_timeout);
  const bool released = service.AwaitReleased(absl::Seconds(drain_timeout));
  std::fprintf(stderr, "worker: %s, shutting down\n", released ? "released" : "drain timeout");
  // Released: what is still in flight (a store wait) gets 5 s. Timed out:
  // the coordinator had its time, the plan stream is cancelled now.
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(released ? 5 : 0));
  server->Wait();
  return 0;
}
