#include "workers/server/worker_service.h"

#include <atomic>
#include <chrono>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "base/grpc_status.h"
#include "base/redis_client.h"
#include "base/status_macros.h"
#include "proto/model/model_config.h"
#include "gloo/rendezvous/store.h"
#include "grpcpp/create_channel.h"
#include "kernels/api/dtype.h"
#include "proto/plan/plan_proto.h"
#include "workers/collectives/gloo_communicator.h"
#include "workers/model/gpu_model.h"
#include "workers/model/llama.h"
#include "workers/model/weights.h"
#include "workers/server/plan_executor.h"
#include "workers/server/shared_kv_store.h"

namespace chunkattn {

using internal::v1::JoinRequest;
using internal::v1::JoinResponse;

namespace {

// A gloo rendezvous store backed by a worker's StoreSet/StoreGet RPCs. Gloo's
// Store interface reports errors by throwing; ConnectGloo catches them.
class GrpcStore : public gloo::rendezvous::Store {
 public:
  GrpcStore(const std::string& address, std::string prefix, std::chrono::milliseconds timeout,
            const TokenAuth* auth, const ChannelSecurity& security)
      : stub_(internal::v1::Worker::NewStub(OpenChannel(address, security))),
        prefix_(std::move(prefix)),
        timeout_(timeout),
        auth_(auth) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    internal::v1::StoreSetRequest req;
    req.set_key(prefix_ + key);
    req.set_value(std::string(data.begin(), data.end()));
    internal::v1::StoreSetResponse resp;
    // Rank 0 may still be starting: wait for it to be ready, within the timeout.
    grpc::ClientContext ctx;
    ctx.set_wait_for_ready(true);
    ctx.set_deadline(std::chrono::system_clock::now() + timeout_);
    auth_->Attach(&ctx);
    grpc::Status s = stub_->StoreSet(&ctx, req, &resp);
    if (!s.ok()) throw std::runtime_error("rendezvous set " + key + ": " + s.error_message());
  }

  std::vector<char> get(const std::string& key) override {
    const auto values = Get({key}, timeout_);
    return std::vector<char>(values[0].begin(), values[0].end());
  }

  void wait(const std::vector<std::string>& keys) override { Get(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    Get(keys, timeout);
  }

 private:
  static std::shared_ptr<grpc::Channel> OpenChannel(const std::string& address, const ChannelSecurity& security) {
    grpc::ChannelArguments args;
    security.Apply(&args);
    return grpc::CreateCustomChannel(address, security.credentials, args);
  }

  std::vector<std::string> Get(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
    internal::v1::StoreGetRequest req;
    for (const auto& k : keys) req.add_keys(prefix_ + k);
    req.set_timeout_ms(static_cast<uint32_t>(timeout.count()));
    internal::v1::StoreGetResponse resp;
    grpc::ClientContext ctx;
    ctx.set_wait_for_ready(true);
    ctx.set_deadline(std::chrono::system_clock::now() + timeout + std::chrono::seconds(5));
    auth_->Attach(&ctx);
    grpc::Status s = stub_->StoreGet(&ctx, req, &resp);
    if (!s.ok()) throw std::runtime_error("rendezvous get: " + s.error_message());
    return std::vector<std::string>(resp.values().begin(), resp.values().end());
  }

  std::unique_ptr<internal::v1::Worker::Stub> stub_;
  std::string prefix_;
  std::chrono::milliseconds timeout_;
  const TokenAuth* auth_;  // the worker's own options: outlives every session
};

// `path` resolved (symbolic links, "..") lies in `root` (already canonical).
// NOT_FOUND when it does not exist, PERMISSION_DENIED when outside.
grpc::Status CheckUnderRoot(const std::string& root, const std::string& path) {
  if (root.empty()) return grpc::Status::OK;
  std::error_code error;
  const std::filesystem::path resolved = std::filesystem::canonical(path, error);
  if (error) return grpc::Status(grpc::StatusCode::NOT_FOUND, "model " + path + " does not exist");
  const std::string r = root == "/" ? root : root + "/";
  if (resolved.string() != root && !absl::StartsWith(resolved.string(), r)) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                   absl::StrCat("model ", path, " is outside this worker's --model_root ", root));
  }
  return grpc::Status::OK;
}

}  // namespace

struct WorkerService::Session {
  std::string id;
  std::string coordinator;
  std::atomic<int> streams{0};  // Execute calls open on this session
  int rank = 0;
  int world_size = 1;
  ModelConfig config;
  ModelWeights weights;  // moved into the model at the first Execute
  ModelOptions model_options;
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<GpuGroup> gpu_group;  // declared before the model: outlives it
  GpuModel* gpu_model = nullptr;        // the model, while its KV pool is unallocated
  int64_t capacity_chunks = 0;
  // This session's KV tiers (empty at Join), driven by the Execute stream
  // under `mu` through its executor; declared before the executor, which
  // borrows it.
  std::unique_ptr<KvTierStore> tiers;
  std::unique_ptr<SharedKvStore> shared;  // the shared tier (JoinRequest.kv_store_url); null: none

  absl::Mutex mu;  // serializes Execute streams on this session
  // On GPU made at Join (the KV capacity depends on what the weights leave);
  // on CPU at the first plan.
  std::unique_ptr<Model> model ABSL_GUARDED_BY(mu);
  std::unique_ptr<PlanExecutor> executor ABSL_GUARDED_BY(mu);
  // Set by a newer Join without `mu`: an Execute holds `mu` for its whole
  // stream (possibly blocked in a collective with a dead peer), and Join
  // must not wait for it.
  std::atomic<bool> broken{false};
};

WorkerService::WorkerService(const WorkerOptions& options)
    : options_(options),
      pool_(options.device.cuda ? 1 : options.threads),
      device_name_(DescribeDevice(options.device)) {}

WorkerService::~WorkerService() = default;

grpc::Status WorkerService::ClaimOwnership(const std::string& coordinator) {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  const bool live = joins_in_flight_ > 0 || now < owner_lease_end_ ||
                    (session_ != nullptr && session_->streams.load() > 0);
  if (!owner_.empty() && owner_ != coordinator && live) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                   "this worker serves another coordinator, which is live (a plan stream open or a "
                   "recent Join); it is free once that coordinator is gone");
  }
  owner_ = coordinator;
  owner_lease_end_ = now + absl::Seconds(kJoinLeaseSeconds);
  ++joins_in_flight_;
  return grpc::Status::OK;
}

grpc::Status WorkerService::Draining() {
  return grpc::Status(grpc::StatusCode::UNAVAILABLE, "this worker is shutting down (SIGTERM)");
}

void WorkerService::BeginDrain() { draining_ = true; }

bool WorkerService::AwaitReleased(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (session_ == nullptr || session_->streams.load() == 0) return true;
    }
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(20));  // once, at shutdown: polling is enough
  }
}

grpc::Status WorkerService::Join(grpc::ServerContext* context, const JoinRequest* req, JoinResponse* resp) {
  if (absl::Status auth = options_.auth.Check(*context); !auth.ok()) return ToGrpcStatus(auth);
  if (draining_) return Draining();
  auto fail = [](const std::string& msg) { return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, msg); };
  if (req->session().empty() || req->session().size() > 256) return fail("session must be 1 to 256 bytes");
  if (req->coordinator().empty() || req->coordinator().size() > 256) {
    return fail("coordinator must be 1 to 256 bytes");
  }
  if (req->world_size() < 1 || req->world_size() > 1024) return fail("world_size must be in [1, 1024]");
  if (req->rank() < 0 || req->rank() >= req->world_size()) {
    return fail(absl::StrFormat("rank %d is outside [0, %d)", req->rank(), req->world_size()));
  }
  const int c = req->chunk_size();
  if (c < 16 || c > 256 || (c & (c - 1)) != 0) {
    return fail(absl::StrFormat("chunk_size must be a power of two in [16, 256], got %d", c));
  }
  if (req->model().empty()) return fail("model is empty");
  const bool auto_kv = req->kv_dtype().empty() || req->kv_dtype() == "auto";
  std::optional<DType> kv_dtype = auto_kv ? DType::kFloat32 : ParseDType(req->kv_dtype());
  if (!kv_dtype) return fail("kv_dtype must be auto, float32, float16 or bfloat16, got " + req->kv_dtype());
  if (options_.device.cuda && *kv_dtype == DType::kFloat32 && !auto_kv) {
    return fail("kv_dtype float32: a GPU worker runs float16 or bfloat16");
  }
  if (req->max_step_tokens() < 0 || req->max_step_tokens() > (1 << 20) || req->max_batch_size() < 0) {
    return fail(absl::StrFormat("max_step_tokens %d / max_batch_size %d out of range", req->max_step_tokens(),
                                req->max_batch_size()));
  }
  const std::string impl = req->decode_impl().empty() ? "tpp" : req->decode_impl();
  if (impl != "tpp" && impl != "seq") return fail("decode_impl must be tpp or seq, got " + impl);
  const std::string format = req->load_format().empty() ? "auto" : req->load_format();
  if (format != "auto" && format != "safetensors" && format != "dummy") {
    return fail("load_format must be auto or dummy, got " + format);
  }
  if (req->world_size() > 1 && req->rendezvous().empty()) return fail("rendezvous is empty");
  std::optional<RedisUrl> kv_store;
  if (!req->kv_store_url().empty()) {
    absl::StatusOr<RedisUrl> url = ParseRedisUrl(req->kv_store_url());  // its errors never quote the password
    if (!url.ok()) return ToGrpcStatus(url.status());
    kv_store = std::move(*url);
  }
  RedisTlsOptions kv_store_tls{req->kv_store_tls_ca_pem(), req->kv_store_tls_cert_pem(), req->kv_store_tls_key_pem()};
  if (kv_store && kv_store->tls) {
    if (absl::Status s = CheckRedisTlsOptions(kv_store_tls); !s.ok()) return ToGrpcStatus(s);  // never quotes the key
  } else if (!kv_store_tls.ca_pem.empty() || !kv_store_tls.cert_pem.empty() || !kv_store_tls.key_pem.empty()) {
    return fail("kv_store_tls_* need a rediss:// kv_store_url");
  }
  if (grpc::Status s = CheckUnderRoot(options_.model_root, req->model()); !s.ok()) return s;
  // Everything that can be checked without the weights is, before the
  // current session is touched: a refused Join changes nothing.
  absl::StatusOr<ModelConfig> config = LoadModelConfig(req->model());
  if (!config.ok()) return ToGrpcStatus(config.status());
  if (grpc::Status s = ClaimOwnership(req->coordinator()); !s.ok()) return s;
  struct JoinDone {  // the claim's Join is over, whatever it returns
    WorkerService* service;
    ~JoinDone() {
      absl::MutexLock lock(&service->mu_);
      --service->joins_in_flight_;
      service->owner_lease_end_ = absl::Now() + absl::Seconds(kJoinLeaseSeconds);
    }
  } join_done{this};

  // A new session ends the old one: drop it first so its memory goes back
  // (outside mu_: tearing a GPU session down may wait on its collectives).
  std::shared_ptr<Session> old;
  {
    absl::MutexLock lock(&mu_);
    if (session_ != nullptr) session_->broken = true;
    old = std::move(session_);
  }
  old.reset();
  if (req->rank() == 0) {
    absl::MutexLock lock(&store_mu_);
    const std::string prefix = req->session() + "/";
    for (auto it = store_.begin(); it != store_.end();) {
      if (absl::StartsWith(it->first, prefix)) {
        ++it;
      } else {
        store_bytes_ -= static_cast<int64_t>(it->first.size() + it->second.size());
        it = store_.erase(it);
      }
    }
  }

  auto session = std::make_shared<Session>();
  session->id = req->session();
  session->coordinator = req->coordinator();
  session->rank = req->rank();
  session->world_size = req->world_size();
  session->config = *config;
  if (options_.device.cuda && auto_kv) {
    kv_dtype = DefaultGpuDType(session->config);
  }
  const ShardSpec shard{req->rank(), req->world_size()};
  absl::StatusOr<ModelWeights> weights = format == "dummy"
                                             ? DummyWeights(session->config, shard, req->dummy_seed(),
                                                            options_.weight_dtype)
                                             : LoadWeights(req->model(), session->config, shard,
                                                           options_.weight_dtype);
  if (!weights.ok()) return ToGrpcStatus(weights.status());
  session->weights = std::move(*weights);
  session->model_options.chunk_size = c;
  session->model_options.kv_dtype = *kv_dtype;
  session->model_options.decode_impl = impl == "tpp" ? DecodeImpl::kTpp : DecodeImpl::kSequence;

  const int64_t chunk_bytes =
      KvShapeOf(session->config, session->weights.layout, session->model_options).BytesPerChunk();
  // Before the weights go to the model (the GPU's at Join): the shared
  // tier's keys sample them.
  const std::string kv_store_prefix =
      kv_store ? SharedKvKeyPrefix(session->config, session->weights, session->model_options,
                                   options_.device.cuda ? "cuda" : "cpu", req->rank(), req->world_size())
               : std::string();
  const uint32_t timeout_ms = req->collective_timeout_ms() > 0 ? req->collective_timeout_ms() : 30000;
  std::shared_ptr<GrpcStore> store;
  if (req->world_size() > 1) {
    store = std::make_shared<GrpcStore>(req->rendezvous(), req->session() + "/",
                                        std::chrono::milliseconds(timeout_ms), &options_.auth,
                                        options_.peer_channel);
  }

  if (options_.device.cuda) {
    if (grpc::Status s = JoinGpu(*req, session.get(), store, timeout_ms, chunk_bytes); !s.ok()) return s;
  } else {
    const int64_t budget = options_.kv_cache_bytes > 0 ? options_.kv_cache_bytes : int64_t{1} << 30;
    session->capacity_chunks = std::min<int64_t>(budget / chunk_bytes, int64_t{1} << 30);
    if (req->world_size() > 1) {
      GlooOptions g;
      g.rank = req->rank();
      g.world_size = req->world_size();
      g.prefix = "gloo";
      g.interface_host = options_.collective_host;
      g.timeout = absl::Milliseconds(timeout_ms);
      absl::StatusOr<std::unique_ptr<Communicator>> comm = ConnectGloo(g, store);
      if (!comm.ok()) return ToGrpcStatus(comm.status());
      session->comm = std::move(*comm);
    }
  }
  if (session->capacity_chunks < 1) {
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        absl::StrFormat("the KV budget of this %s worker holds no %d-byte chunk",
                                        options_.device.ToString(), chunk_bytes));
  }
  resp->set_kv_capacity_chunks(session->capacity_chunks);
  resp->set_kv_chunk_bytes(chunk_bytes);
  resp->set_device(device_name_);
  resp->set_dtype(DTypeName(session->config.dtype));
  resp->set_kv_dtype(DTypeName(*kv_dtype));
  // Made last, so a refused Join makes no tier file; the old session's
  // store (and its file) goes with that session (once no stream holds it).
  // On a GPU the host tier is pinned: chunks move to and from it by DMA.
  absl::StatusOr<std::unique_ptr<KvTierStore>> tiers = KvTierStore::Create(
      options_.kv_tiers, chunk_bytes, options_.device.cuda ? AllocatePinnedHostBytes : AllocateHostBytes);
  if (!tiers.ok()) return ToGrpcStatus(tiers.status());
  session->tiers = std::move(*tiers);
  resp->set_host_kv_slots(session->tiers->slots(KvTier::kHost));
  resp->set_disk_kv_slots(session->tiers->slots(KvTier::kDisk));
  if (kv_store) {
    SharedKvOptions shared;
    shared.url = std::move(*kv_store);
    shared.redis.tls = std::move(kv_store_tls);
    session->shared = std::make_unique<SharedKvStore>(std::move(shared), kv_store_prefix, chunk_bytes);
    resp->set_kv_store_key_prefix(kv_store_prefix);
  }
  absl::MutexLock lock(&mu_);
  session_ = std::move(session);
  return grpc::Status::OK;
}

grpc::Status WorkerService::JoinGpu(const JoinRequest& req, Session* session,
                                     const std::shared_ptr<gloo::rendezvous::Store>& store,
                                     uint32_t timeout_ms, int64_t chunk_bytes) {
  if (req.world_size() > 1) {
    // Rank 0 makes the group's id (NCCL's bootstrap listens in its process)
    // and publishes it in the session's store; the others wait for it.
    std::string id;
    try {
      if (req.rank() == 0) {
        absl::StatusOr<std::string> made = MakeGpuGroupId();
        if (!made.ok()) return ToGrpcStatus(made.status());
        id = *made;
        store->set("nccl-id", std::vector<char>(id.begin(), id.end()));
      } else {
        const std::vector<char> got = store->get("nccl-id");
        id.assign(got.begin(), got.end());
      }
    } catch (const std::exception& e) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, std::string("NCCL id rendezvous: ") + e.what());
    }
    absl::StatusOr<std::unique_ptr<GpuGroup>> group =
        JoinGpuGroup(req.rank(), req.world_size(), id, options_.device.index, absl::Milliseconds(timeout_ms));
    if (!group.ok()) return ToGrpcStatus(group.status());
    session->gpu_group = std::move(*group);
  }
  GpuModelOptions co;
  co.device = options_.device.index;
  if (req.max_step_tokens() > 0) co.max_rows = req.max_step_tokens();
  if (req.max_batch_size() > 0) {
    co.max_batch = req.max_batch_size();
    co.max_graph_batch = std::min(req.max_batch_size(), 512);
  }
  co.cuda_graphs = options_.cuda_graphs;
  absl::StatusOr<std::unique_ptr<GpuModel>> model = CreateGpuModel(
      session->config, std::move(session->weights), session->model_options, co, session->gpu_group.get());
  if (!model.ok()) return ToGrpcStatus(model.status());
  absl::StatusOr<int64_t> capacity = (*model)->KvCapacity(options_.gpu_memory_fraction);
  if (!capacity.ok()) return ToGrpcStatus(capacity.status());
  session->capacity_chunks = *capacity;
  if (options_.kv_cache_bytes > 0) {
    session->capacity_chunks = std::min(session->capacity_chunks, options_.kv_cache_bytes / chunk_bytes);
  }
  session->gpu_model = model->get();
  absl::MutexLock lock(&session->mu);
  session->model = std::move(*model);
  return grpc::Status::OK;
}

grpc::Status WorkerService::Execute(grpc::ServerContext* context,
                                    grpc::ServerReaderWriter<internal::v1::StepResult, internal::v1::StepPlan>* stream) {
  if (absl::Status auth = options_.auth.Check(*context); !auth.ok()) return ToGrpcStatus(auth);
  const auto named = context->client_metadata().find(kSessionMetadata);
  std::shared_ptr<Session> session;
  {
    absl::MutexLock lock(&mu_);
    session = session_;
  }
  if (session == nullptr) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "no session: Join first");
  }
  if (named == context->client_metadata().end() ||
      absl::string_view(named->second.data(), named->second.size()) != session->id) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat("the stream's '", kSessionMetadata, "' metadata does not name this worker's session"));
  }
  // Counted while open: a live stream keeps its coordinator the owner, and
  // ends the Join's lease, so the worker is free as soon as the owner is gone.
  session->streams.fetch_add(1);
  {
    absl::MutexLock lock(&mu_);
    if (owner_ == session->coordinator) owner_lease_end_ = absl::InfinitePast();
  }
  struct StreamDone {
    Session* session;
    ~StreamDone() { session->streams.fetch_sub(1); }
  } stream_done{session.get()};
  absl::MutexLock lock(&session->mu);
  if (session->broken) return grpc::Status(grpc::StatusCode::ABORTED, "the session was replaced");
  // The wire messages, and their C++ forms that the executor runs.
  internal::v1::StepPlan wire_plan, wire_masks;
  internal::v1::StepResult wire_result;
  StepPlan plan;
  StepResult result;
  // A plan's masks that follow it (rank 0), read once its forward pass has run.
  const PlanExecutor::AwaitMasks await_masks = [&](std::vector<std::vector<uint32_t>>* masks) -> absl::Status {
    if (!stream->Read(&wire_masks)) {
      return absl::UnavailableError("the coordinator's stream ended before the step's token masks came");
    }
    return MasksFromProto(wire_masks, plan.step, plan.samples.size(), masks);
  };
  while (stream->Read(&wire_plan)) {
    if (wire_plan.masks_only()) {
      session->broken = true;
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "token masks came with no plan before them");
    }
    if (absl::Status decoded = FromProto(wire_plan, &plan); !decoded.ok()) {
      session->broken = true;
      return ToGrpcStatus(decoded);
    }
    if (session->broken) return grpc::Status(grpc::StatusCode::ABORTED, "the session was replaced");
    if (session->executor == nullptr) {
      // The first plan sizes the pool.
      const int64_t chunks = plan.num_kv_chunks;
      if (chunks < 1 || chunks > session->capacity_chunks) {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            absl::StrFormat("the first plan must size the pool: num_kv_chunks %d is "
                                            "outside [1, %d]",
                                            chunks, session->capacity_chunks));
      }
      absl::Status ready = absl::OkStatus();
      if (session->model == nullptr) {
        session->model_options.num_kv_chunks = chunks;
        absl::StatusOr<std::unique_ptr<LlamaModel>> model =
            LlamaModel::Create(session->config, std::move(session->weights), session->model_options,
                               session->comm.get(), &pool_);
        ready = model.status();
        if (model.ok()) session->model = std::move(*model);
      }
      if (session->gpu_model != nullptr) {
        ready = session->gpu_model->AllocateKvPool(chunks);
        session->gpu_model = nullptr;
      }
      if (!ready.ok()) {
        session->broken = true;
        return ToGrpcStatus(ready);
      }
      session->executor =
          std::make_unique<PlanExecutor>(session->model.get(), session->rank == 0, session->tiers.get(),
                                         session->shared.get());
    }
    absl::Status status = session->executor->Execute(plan, &result, await_masks);
    if (!status.ok()) {
      // The pool and the sampler state may now be behind the coordinator's.
      session->broken = true;
      return ToGrpcStatus(status);
    }
    ToProto(result, &wire_result);
    wire_result.set_draining(draining_);
    if (!stream->Write(wire_result)) break;
  }
  return grpc::Status::OK;
}

grpc::Status WorkerService::StoreSet(grpc::ServerContext* context, const internal::v1::StoreSetRequest* req,
                                     internal::v1::StoreSetResponse*) {
  if (absl::Status auth = options_.auth.Check(*context); !auth.ok()) return ToGrpcStatus(auth);
  if (draining_) return Draining();
  const std::string& key = req->key();
  if (key.empty() || key.size() > kMaxStoreKeyBytes) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                   absl::StrFormat("a store key must be 1 to %d bytes, got %d", kMaxStoreKeyBytes, key.size()));
  }
  if (req->value().size() > kMaxStoreValueBytes) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                   absl::StrFormat("a store value must be at most %d bytes, got %d", kMaxStoreValueBytes,
                                   req->value().size()));
  }
  absl::MutexLock lock(&store_mu_);
  auto it = store_.find(key);
  const int64_t old_bytes = it == store_.end() ? 0 : static_cast<int64_t>(key.size() + it->second.size());
  const int64_t new_bytes = static_cast<int64_t>(key.size() + req->value().size());
  if (it == store_.end() && store_.size() >= kMaxStoreKeys) {
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                   absl::StrFormat("the store is full: %d keys", kMaxStoreKeys));
  }
  if (store_bytes_ - old_bytes + new_bytes > kMaxStoreBytes) {
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                   absl::StrFormat("the store is full: %d of %d bytes held", store_bytes_, kMaxStoreBytes));
  }
  store_bytes_ += new_bytes - old_bytes;
  store_[key] = req->value();
  store_cv_.SignalAll();
  return grpc::Status::OK;
}

grpc::Status WorkerService::StoreGet(grpc::ServerContext* context, const internal::v1::StoreGetRequest* req,
                                     internal::v1::StoreGetResponse* resp) {
  if (absl::Status auth = options_.auth.Check(*context); !auth.ok()) return ToGrpcStatus(auth);
  if (draining_) return Draining();
  if (req->keys_size() > kMaxStoreKeysPerGet) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                   absl::StrFormat("at most %d keys per StoreGet, got %d", kMaxStoreKeysPerGet, req->keys_size()));
  }
  const absl::Duration timeout = absl::Milliseconds(std::min<uint32_t>(req->timeout_ms(), 600000));
  const absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock lock(&store_mu_);
  auto all_present = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(store_mu_) {
    for (const auto& k : req->keys()) {
      if (store_.count(k) == 0) return false;
    }
    return true;
  };
  // Each waiter holds a server thread: bounded, and a cancelled call polls
  // its way out within 100 ms.
  if (!all_present() && store_waiters_ >= kMaxStoreWaiters) {
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                   absl::StrFormat("%d StoreGet calls are already waiting", kMaxStoreWaiters));
  }
  ++store_waiters_;
  struct WaitDone {
    int* waiters;
    ~WaitDone() { --*waiters; }  // runs under store_mu_ (declared after the lock)
  } wait_done{&store_waiters_};
  while (!all_present()) {
    if (context->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
    if (absl::Now() >= deadline) {
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "rendezvous keys did not appear in time");
    }
    store_cv_.WaitWithTimeout(&store_mu_, absl::Milliseconds(100));
  }
  for (const auto& k : req->keys()) resp->add_values(store_.at(k));
  return grpc::Status::OK;
}

}  // namespace chunkattn
