// chunkattn-worker: one tensor-parallel rank of the model. It waits for the
// cache coordinator to Join it (rank, world size, model, chunk size,
// rendezvous), then runs the plan stream the coordinator sends.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "base/address.h"
#include "base/device.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#if CHUNKATTN_WITH_CUDA
#include "kernels/cuda/device.h"
#endif
#include "base/flags.h"
#include "base/grpc_security.h"
#include "base/grpc_server.h"
#include "base/signals.h"
#include "workers/server/worker_service.h"

ABSL_FLAG(std::string, listen, "0.0.0.0:50061", "host:port of the worker's gRPC server");
ABSL_FLAG(std::string, device, "cpu", "cpu | cuda | cuda:N (builds with CUDA)");
ABSL_FLAG(int, threads, 0, "CPU attention threads; 0 = the CPUs this process may use (affinity, cgroup CPU limit)");
ABSL_FLAG(int64_t, kv_cache_mib, 0,
          "KV pool budget of this rank, MiB; 0 = 1024 on CPU, on GPU what --gpu_memory_fraction leaves");
ABSL_FLAG(double, gpu_memory_fraction, 0.9,
          "share of the GPU's memory this worker may use (weights, workspace and KV pool), in (0, 1]");
ABSL_FLAG(bool, cuda_graphs, true, "replay decode steps from CUDA graphs (one per batch-size bucket)");
ABSL_FLAG(std::string, collective_host, "",
          "address peers reach this rank's collectives at (default: the --listen host, or "
          "127.0.0.1 when that is 0.0.0.0)");
ABSL_FLAG(std::string, worker_token_file, "",
          "file of shared secrets, one per line: every call but health (the coordinator's, the peers' "
          "rendezvous) must send one; the first is what this worker sends its peers");
ABSL_FLAG(std::string, model_root, "",
          "a Join's model must lie under this folder (symbolic links resolved); empty = anywhere");

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
  if (device->cuda) {
#if CHUNKATTN_WITH_CUDA
    const int visible = chunkattn::cuda::DeviceCount();
    if (device->index >= visible) {
      std::fprintf(stderr, "error: --device %s: %d CUDA devices visible\n", device->ToString().c_str(), visible);
      return 2;
    }
#else
    std::fprintf(stderr, "error: --device %s: this build has no CUDA\n", device->ToString().c_str());
    return 2;
#endif
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
  chunkattn::WorkerOptions options;
  options.device = *device;
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

  chunkattn::WorkerService service(options);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  chunkattn::ConfigureServer(builder);
  int bound = 0;
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &bound);
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
  std::fprintf(stderr, "chunkattn-worker listening on %s (device %s, KV budget %s, %s, models from %s)\n",
               listen.c_str(), device->ToString().c_str(),
               mib > 0 ? (std::to_string(mib) + " MiB").c_str()
                       : (device->cuda ? "from --gpu_memory_fraction" : "1024 MiB"),
               auth->enabled() ? "worker token required" : "NO worker token: anyone who reaches this port may use it",
               options.model_root.empty() ? "anywhere" : options.model_root.c_str());
  chunkattn::WaitForTerminationSignal();
  std::fprintf(stderr, "worker: shutting down\n");
  // In-flight calls (a plan stream, a store wait) get 5 s, then are cancelled.
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  server->Wait();
  return 0;
}
