#include "workers/collectives/gloo_communicator.h"

#include <chrono>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <string>
#include <system_error>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "gloo/allreduce.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/common/error.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gloo/rendezvous/store.h"
#include "gloo/transport/tcp/device.h"
#include "workers/collectives/internal.h"

namespace chunkattn {
namespace {

std::chrono::milliseconds ToMillis(absl::Duration d) {
  return std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
}

// Gloo reports every failure as an exception whose type says little
// (IoException for both timeouts and closed sockets, EnforceNotMet for
// store errors), so the message decides the code.
absl::Status FromGlooError(absl::string_view what, absl::string_view message) {
  const std::string text = absl::StrCat("gloo ", what, ": ", message);
  if (absl::StrContains(message, "imed out") || absl::StrContains(message, "imeout")) {
    return absl::DeadlineExceededError(text);
  }
  if (absl::StrContains(message, "already exists")) {
    // FileStore keys are write-once: a group reusing a prefix in the same
    // store directory.
    return absl::FailedPreconditionError(
        absl::StrCat(text, " (use a fresh prefix or store directory per group)"));
  }
  return absl::UnavailableError(text);
}

// Runs `f`, turning anything Gloo throws into a status.
template <typename F>
absl::Status CatchGloo(absl::string_view what, F&& f) {
  try {
    f();
    return absl::OkStatus();
  } catch (const std::exception& e) {
    // gloo::Exception, gloo::IoException, gloo::EnforceNotMet, std::system_error.
    return FromGlooError(what, e.what());
  } catch (...) {
    return absl::UnavailableError(absl::StrCat("gloo ", what, ": unknown exception"));
  }
}

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(std::shared_ptr<gloo::rendezvous::Context> context, absl::Duration timeout)
      : context_(std::move(context)), timeout_(ToMillis(timeout)) {}

  int rank() const override { return context_->rank; }
  int world_size() const override { return context_->size; }

  absl::Status AllReduceSum(float* data, int64_t n) override {
    RETURN_IF_ERROR(collectives_internal::CheckAllReduceArgs(data, n));
    if (n == 0) return absl::OkStatus();
    return Collective("AllReduceSum", [&](uint32_t tag) {
      gloo::AllreduceOptions opts(context_);
      opts.setOutput(data, static_cast<size_t>(n));
      opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
      void (*sum)(void*, const void*, const void*, size_t) = &gloo::sum<float>;
      opts.setReduceFunction(sum);
      opts.setTag(tag);
      opts.setTimeout(timeout_);
      gloo::allreduce(opts);
    });
  }

  absl::Status Broadcast(void* data, int64_t bytes, int root) override {
    RETURN_IF_ERROR(
        collectives_internal::CheckBroadcastArgs(data, bytes, root, world_size()));
    if (bytes == 0) return absl::OkStatus();
    return Collective("Broadcast", [&](uint32_t tag) {
      gloo::BroadcastOptions opts(context_);
      opts.setOutput(static_cast<uint8_t*>(data), static_cast<size_t>(bytes));
      opts.setRoot(root);
      opts.setTag(tag);
      opts.setTimeout(timeout_);
      gloo::broadcast(opts);
    });
  }

  absl::Status Barrier() override {
    return Collective("Barrier", [&](uint32_t tag) {
      gloo::BarrierOptions opts(context_);
      opts.setTag(tag);
      opts.setTimeout(timeout_);
      gloo::barrier(opts);
    });
  }

 private:
  // Every rank numbers its collectives the same way, so the tag (which
  // selects Gloo's message slot) matches across ranks and a late message of
  // one collective can never be taken for the next one's.
  template <typename F>
  absl::Status Collective(absl::string_view what, F&& f) {
    if (!broken_.ok()) return broken_;
    const uint32_t tag = next_tag_++;
    absl::Status status = CatchGloo(what, [&] { f(tag); });
    if (!status.ok()) {
      broken_ = absl::UnavailableError(
          absl::StrCat("gloo communicator broken by an earlier failure: ", status.message()));
    }
    return status;
  }

  const std::shared_ptr<gloo::rendezvous::Context> context_;
  const std::chrono::milliseconds timeout_;
  uint32_t next_tag_ = 0;
  absl::Status broken_;
};

absl::Status ValidateOptions(const GlooOptions& options) {
  if (options.world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("ConnectGloo: world_size %d < 1", options.world_size));
  }
  if (options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "ConnectGloo: rank %d outside [0, %d)", options.rank, options.world_size));
  }
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("ConnectGloo: timeout must be positive");
  }
  if (options.interface_host.empty()) {
    return absl::InvalidArgumentError("ConnectGloo: interface_host is empty");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Communicator>> Connect(const GlooOptions& options,
                                                      gloo::rendezvous::Store& store) {
  if (options.world_size == 1) return MakeSingleRankCommunicator();
  std::shared_ptr<gloo::rendezvous::Context> context;
  RETURN_IF_ERROR(CatchGloo("rendezvous", [&] {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.interface_host;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    context = std::make_shared<gloo::rendezvous::Context>(options.rank, options.world_size);
    context->setTimeout(ToMillis(options.timeout));
    gloo::rendezvous::PrefixStore prefixed(options.prefix, store);
    context->connectFullMesh(prefixed, device);
  }));
  return std::unique_ptr<Communicator>(
      std::make_unique<GlooCommunicator>(std::move(context), options.timeout));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> ConnectGloo(const GlooOptions& options) {
  RETURN_IF_ERROR(ValidateOptions(options));
  std::error_code ec;
  if (options.store_path.empty() || !std::filesystem::is_directory(options.store_path, ec)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "ConnectGloo: store_path '%s' is not an existing directory", options.store_path));
  }
  std::unique_ptr<gloo::rendezvous::FileStore> store;
  RETURN_IF_ERROR(CatchGloo("FileStore", [&] {
    store = std::make_unique<gloo::rendezvous::FileStore>(options.store_path);
  }));
  return Connect(options, *store);
}

absl::StatusOr<std::unique_ptr<Communicator>> ConnectGloo(
    const GlooOptions& options, std::shared_ptr<gloo::rendezvous::Store> store) {
  RETURN_IF_ERROR(ValidateOptions(options));
  if (store == nullptr) return absl::InvalidArgumentError("ConnectGloo: store is null");
  return Connect(options, *store);
}

}  // namespace chunkattn
