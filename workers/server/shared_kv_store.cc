#include "workers/server/shared_kv_store.h"

#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/hash.h"
#include "base/status_macros.h"

namespace chunkattn {
namespace {

// Folds a sample of `n` bytes at `p` into `h`: up to 16 pieces of 256 bytes
// at equal strides, and the size, so a changed matrix almost surely changes
// the hash without the whole model being read at every Join.
uint64_t Sample(uint64_t h, const void* p, size_t n) {
  constexpr size_t kPieces = 16, kPiece = 256;
  h = Mix64(h ^ n);
  const auto* bytes = static_cast<const uint8_t*>(p);
  if (n <= kPieces * kPiece) return HashBytes(bytes, n, h);
  const size_t stride = (n - kPiece) / (kPieces - 1);
  for (size_t i = 0; i < kPieces; ++i) h = HashBytes(bytes + i * stride, kPiece, h);
  return h;
}

template <typename T>
uint64_t SampleVector(uint64_t h, const std::vector<T>& v) {
  return Sample(h, v.data(), v.size() * sizeof(T));
}

uint64_t SampleMatrix(uint64_t h, const WeightMatrix& m) {
  h = Mix64(h ^ (static_cast<uint64_t>(m.dtype) << 56) ^ static_cast<uint64_t>(m.rows * 131 + m.cols));
  h = SampleVector(h, m.f32);
  h = SampleVector(h, m.half);
  h = SampleVector(h, m.q);
  return SampleVector(h, m.scales);
}

}  // namespace

std::string SharedKvKeyPrefix(const ModelConfig& config, const ModelWeights& weights, const ModelOptions& model,
                              std::string_view device, int rank, int world_size) {
  const std::string shape = absl::StrCat(ModelConfigToJson(config), "|kv:", DTypeName(model.kv_dtype),
                                         "|chunk:", model.chunk_size, "|decode:", static_cast<int>(model.decode_impl),
                                         "|device:", std::string(device));
  uint64_t h = HashBytes(shape.data(), shape.size(), 0x6b762d736861726dull);
  h = SampleMatrix(h, weights.embed);
  h = SampleVector(h, weights.final_norm);
  h = SampleMatrix(h, weights.lm_head);
  for (const LayerWeights& l : weights.layers) {
    for (const WeightMatrix* m : {&l.qkv, &l.o, &l.gate_up, &l.down}) h = SampleMatrix(h, *m);
    for (const std::vector<float>* v : {&l.input_norm, &l.qkv_bias, &l.q_norm, &l.k_norm, &l.post_norm}) {
      h = SampleVector(h, *v);
    }
  }
  return absl::StrFormat("chunkattn:kv:v2:%016x:r%dof%d:", h, rank, world_size);
}

SharedKvStore::SharedKvStore(SharedKvOptions options, std::string key_prefix, int64_t chunk_bytes)
    : options_(std::move(options)),
      key_prefix_(std::move(key_prefix)),
      chunk_bytes_(chunk_bytes),
      reader_(options_.url, options_.redis),
      writer_([this] { WriterLoop(); }) {}

SharedKvStore::~SharedKvStore() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  writer_.join();
}

std::string SharedKvStore::RedisKey(uint64_t key) const { return absl::StrFormat("%s%016x", key_prefix_, key); }

absl::Status SharedKvStore::Store(uint64_t key, absl::Span<const uint8_t> bytes) {
  ASSIGN_OR_RETURN(const KvChunkSeal seal, SealKvChunk(key, bytes, chunk_bytes_));
  Pending p;
  p.key = RedisKey(key);
  p.value.resize(kHeaderBytes + bytes.size());
  std::memcpy(p.value.data(), &seal, kHeaderBytes);
  std::memcpy(p.value.data() + kHeaderBytes, bytes.data(), bytes.size());
  absl::MutexLock lock(&mu_);
  const int64_t size = static_cast<int64_t>(p.value.size());
  if (queued_bytes_ + size > options_.max_queued_bytes) {
    ++stats_.store_failed;
    return absl::ResourceExhaustedError("shared KV tier: the store queue is full (Redis slower than the evictions)");
  }
  queued_bytes_ += size;
  queue_.push_back(std::move(p));
  return absl::OkStatus();
}

void SharedKvStore::WriterLoop() {
  RedisClient client(options_.url, options_.redis);
  while (true) {
    Pending p;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &SharedKvStore::WriterHasWork));
      if (stop_) return;
      p = std::move(queue_.front());
      queue_.pop_front();
      queued_bytes_ -= static_cast<int64_t>(p.value.size());
      writing_ = true;
    }
    const absl::Status s = client.Set(p.key, p.value, options_.ttl);
    absl::MutexLock lock(&mu_);
    writing_ = false;
    ++(s.ok() ? stats_.stored : stats_.store_failed);
  }
}

void SharedKvStore::Flush() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(this, &SharedKvStore::Flushed));
}

SharedKvStore::Stats SharedKvStore::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

absl::Status SharedKvStore::Load(uint64_t key, absl::Span<uint8_t> out) {
  RETURN_IF_ERROR(CheckKvChunkBuffer(static_cast<int64_t>(out.size()), chunk_bytes_, "to load into"));
  const std::string redis_key = RedisKey(key);
  absl::StatusOr<std::optional<std::string>> got = reader_.Get(redis_key, kHeaderBytes + chunk_bytes_);
  if (!got.ok()) return got.status();
  if (!got->has_value()) return absl::NotFoundError(absl::StrCat("shared KV tier: no ", redis_key));
  const std::string& value = **got;
  if (static_cast<int64_t>(value.size()) != kHeaderBytes + chunk_bytes_) {
    return absl::DataLossError(absl::StrFormat("shared KV tier: %s holds %d bytes, a chunk's value %d", redis_key,
                                               value.size(), kHeaderBytes + chunk_bytes_));
  }
  const std::string where = absl::StrCat("shared KV tier: ", redis_key);
  KvChunkSeal seal;
  std::memcpy(&seal, value.data(), kHeaderBytes);
  if (absl::Status s = CheckKvChunkSeal(seal, key, chunk_bytes_, where); !s.ok()) {
    // A value sits under its own key's name, so a blank seal or another key's
    // is damage (or a foreign writer), not a miss as in a reused tier slot.
    return absl::IsNotFound(s) ? absl::DataLossError(s.message()) : s;
  }
  const auto bytes = absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(value.data()) + kHeaderBytes, out.size());
  RETURN_IF_ERROR(CheckKvChunkBytes(seal, bytes, where));
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return absl::OkStatus();
}

}  // namespace chunkattn
