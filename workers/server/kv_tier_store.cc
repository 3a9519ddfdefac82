#include "workers/server/kv_tier_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"

namespace chunkattn {
namespace {

// Flags above this many MiB are typos, and their bytes would overflow.
constexpr int64_t kMaxTierMib = int64_t{1} << 30;

const char* TierName(KvTier tier) { return tier == KvTier::kHost ? "host" : "disk"; }

}  // namespace

absl::StatusOr<KvTierOptions> KvTierOptionsFromFlags(int64_t host_kv_cache_mib, const std::string& disk_kv_cache_dir,
                                                     int64_t disk_kv_cache_mib) {
  if (host_kv_cache_mib < 0 || host_kv_cache_mib > kMaxTierMib) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--host_kv_cache_mib must be in [0, %d] (0 = no host KV tier), got %d", kMaxTierMib, host_kv_cache_mib));
  }
  if (disk_kv_cache_mib < 0 || disk_kv_cache_mib > kMaxTierMib) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--disk_kv_cache_mib must be in [0, %d], got %d", kMaxTierMib, disk_kv_cache_mib));
  }
  KvTierOptions options;
  options.host_bytes = host_kv_cache_mib << 20;
  if (disk_kv_cache_dir.empty()) {
    if (disk_kv_cache_mib > 0) {
      return absl::InvalidArgumentError(
          "--disk_kv_cache_mib needs --disk_kv_cache_dir (the directory the disk KV tier's file goes in)");
    }
    return options;
  }
  if (disk_kv_cache_mib == 0) {
    return absl::InvalidArgumentError("--disk_kv_cache_dir needs --disk_kv_cache_mib > 0 (the disk KV tier's budget)");
  }
  struct stat st;
  if (::stat(disk_kv_cache_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--disk_kv_cache_dir %s is not an existing directory", disk_kv_cache_dir));
  }
  if (::access(disk_kv_cache_dir.c_str(), W_OK | X_OK) != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--disk_kv_cache_dir %s is not writable by this process", disk_kv_cache_dir));
  }
  options.disk_dir = disk_kv_cache_dir;
  options.disk_bytes = disk_kv_cache_mib << 20;
  return options;
}

KvTierStore::Fd& KvTierStore::Fd::operator=(Fd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.release();
  }
  return *this;
}

KvTierStore::Fd::~Fd() {
  if (fd_ >= 0) ::close(fd_);
}

absl::StatusOr<std::unique_ptr<KvTierStore>> KvTierStore::Create(const KvTierOptions& options, int64_t chunk_bytes,
                                                                 const HostAllocator& allocate) {
  if (chunk_bytes < 1 || chunk_bytes > (int64_t{1} << 40)) {
    return absl::InvalidArgumentError(absl::StrFormat("KV tiers: a chunk of %d bytes", chunk_bytes));
  }
  if (options.host_bytes < 0 || options.disk_bytes < 0) {
    return absl::InvalidArgumentError("KV tiers: a negative budget");
  }
  std::unique_ptr<KvTierStore> store(new KvTierStore(chunk_bytes));
  const int64_t slot_bytes = store->SlotBytes();
  const int64_t host_slots = options.host_bytes / slot_bytes;
  if (host_slots > 0) {
    // Zeroed: blank seals, slots never written.
    absl::StatusOr<HostBytes> host = allocate(host_slots * slot_bytes);
    if (!host.ok()) {
      return absl::ResourceExhaustedError(absl::StrFormat("host KV tier: %d slots of %d bytes: %s", host_slots,
                                                          slot_bytes, host.status().message()));
    }
    store->host_ = std::move(*host);
    store->host_slots_ = host_slots;
  }
  const int64_t disk_slots = options.disk_dir.empty() ? 0 : options.disk_bytes / slot_bytes;
  if (disk_slots > 0) {
    // A name of its own per store (several sessions and workers may share
    // the directory); O_EXCL and 0600 through mkostemp.
    static std::atomic<uint64_t> made{0};
    std::string name = absl::StrFormat("%s/chunkattn-kv-%d-%d-XXXXXX", options.disk_dir, ::getpid(), made++);
    std::vector<char> path(name.begin(), name.end());
    path.push_back('\0');
    const int fd = ::mkostemp(path.data(), O_CLOEXEC);
    if (fd < 0) {
      return absl::UnavailableError(
          absl::StrFormat("disk KV tier: cannot create a file in %s: %s", options.disk_dir, std::strerror(errno)));
    }
    store->disk_ = Fd(fd);
    store->disk_path_ = path.data();
    // Sparse: unwritten slots read as zeros (a blank seal: never written), and
    // the budget is not taken from the disk until slots are written.
    if (::ftruncate(fd, disk_slots * slot_bytes) != 0) {
      const int error = errno;
      ::unlink(store->disk_path_.c_str());
      return absl::UnavailableError(absl::StrFormat("disk KV tier: cannot size %s to %d bytes: %s",
                                                    store->disk_path_, disk_slots * slot_bytes, std::strerror(error)));
    }
    store->disk_slots_ = disk_slots;
    absl::StatusOr<HostBytes> staging = allocate(chunk_bytes);
    if (!staging.ok()) {
      return absl::ResourceExhaustedError(
          absl::StrCat("disk KV tier's staging chunk: ", staging.status().message()));
    }
    store->staging_ = std::move(*staging);
  }
  return store;
}

KvTierStore::~KvTierStore() {
  if (!disk_path_.empty()) ::unlink(disk_path_.c_str());  // disk_ closes after
}

absl::Status KvTierStore::CheckSlot(KvTier tier, int64_t slot) const {
  if (tier != KvTier::kHost && tier != KvTier::kDisk) {
    return absl::InvalidArgumentError(absl::StrFormat("unknown KV tier %d", static_cast<int>(tier)));
  }
  const int64_t n = slots(tier);
  if (slot < 0 || slot >= n) {
    return absl::OutOfRangeError(absl::StrFormat("slot %d of the %s KV tier's %d", slot, TierName(tier), n));
  }
  return absl::OkStatus();
}

absl::Status KvTierStore::ReadDisk(int64_t offset, void* to, int64_t n) {
  uint8_t* p = static_cast<uint8_t*>(to);
  while (n > 0) {
    const ssize_t got = ::pread(disk_.get(), p, static_cast<size_t>(n), static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return absl::ErrnoToStatus(errno, absl::StrFormat("disk KV tier: read of %s", disk_path_));
    if (got == 0) {
      return absl::DataLossError(
          absl::StrFormat("disk KV tier: %s ends at byte %d, before its slot does", disk_path_, offset));
    }
    p += got;
    offset += got;
    n -= got;
  }
  return absl::OkStatus();
}

absl::Status KvTierStore::WriteDisk(int64_t offset, const void* from, int64_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(from);
  while (n > 0) {
    const ssize_t put = ::pwrite(disk_.get(), p, static_cast<size_t>(n), static_cast<off_t>(offset));
    if (put < 0 && errno == EINTR) continue;
    // ENOSPC maps to RESOURCE_EXHAUSTED.
    if (put < 0) return absl::ErrnoToStatus(errno, absl::StrFormat("disk KV tier: write of %s", disk_path_));
    p += put;
    offset += put;
    n -= put;
  }
  return absl::OkStatus();
}

absl::Status KvTierStore::Store(KvTier tier, int64_t slot, uint64_t key, absl::Span<const uint8_t> bytes) {
  RETURN_IF_ERROR(CheckKvChunkBuffer(static_cast<int64_t>(bytes.size()), chunk_bytes_, "to store"));
  return StoreFrom(tier, slot, key, [&](absl::Span<uint8_t> chunk) {
    std::memcpy(chunk.data(), bytes.data(), chunk.size());
    return absl::OkStatus();
  });
}

absl::Status KvTierStore::Load(KvTier tier, int64_t slot, uint64_t key, absl::Span<uint8_t> out) {
  RETURN_IF_ERROR(CheckKvChunkBuffer(static_cast<int64_t>(out.size()), chunk_bytes_, "to load into"));
  return LoadTo(tier, slot, key, [&](absl::Span<const uint8_t> chunk) {
    std::memcpy(out.data(), chunk.data(), chunk.size());
    return absl::OkStatus();
  });
}

absl::Status KvTierStore::StoreFrom(KvTier tier, int64_t slot, uint64_t key, FillChunk fill) {
  RETURN_IF_ERROR(CheckSlot(tier, slot));
  if (tier == KvTier::kHost) {
    uint8_t* s = HostSlot(slot);
    // Blank while it is filled: a fill that fails leaves no slot that passes.
    std::memset(s, 0, kHeaderBytes);
    const absl::Span<uint8_t> chunk(s + kHeaderBytes, static_cast<size_t>(chunk_bytes_));
    RETURN_IF_ERROR(fill(chunk));
    ASSIGN_OR_RETURN(const KvChunkSeal seal, SealKvChunk(key, chunk, chunk_bytes_));
    std::memcpy(s, &seal, kHeaderBytes);
    return absl::OkStatus();
  }
  const absl::Span<uint8_t> chunk(staging_.get(), static_cast<size_t>(chunk_bytes_));
  RETURN_IF_ERROR(fill(chunk));
  ASSIGN_OR_RETURN(const KvChunkSeal seal, SealKvChunk(key, chunk, chunk_bytes_));
  // The bytes first, then the seal: a store cut short leaves a slot whose
  // checksum fails, never one that passes with a mix of two chunks.
  const int64_t offset = slot * SlotBytes();
  RETURN_IF_ERROR(WriteDisk(offset + kHeaderBytes, chunk.data(), chunk_bytes_));
  return WriteDisk(offset, &seal, kHeaderBytes);
}

absl::Status KvTierStore::LoadTo(KvTier tier, int64_t slot, uint64_t key, ConsumeChunk consume) {
  RETURN_IF_ERROR(CheckSlot(tier, slot));
  const std::string where = absl::StrFormat("%s KV tier slot %d", TierName(tier), slot);
  KvChunkSeal seal;
  absl::Span<const uint8_t> chunk;
  if (tier == KvTier::kHost) {
    const uint8_t* s = HostSlot(slot);
    std::memcpy(&seal, s, kHeaderBytes);
    RETURN_IF_ERROR(CheckKvChunkSeal(seal, key, chunk_bytes_, where));
    chunk = absl::MakeConstSpan(s + kHeaderBytes, static_cast<size_t>(chunk_bytes_));  // checked in place
  } else {
    const int64_t offset = slot * SlotBytes();
    RETURN_IF_ERROR(ReadDisk(offset, &seal, kHeaderBytes));
    RETURN_IF_ERROR(CheckKvChunkSeal(seal, key, chunk_bytes_, where));
    RETURN_IF_ERROR(ReadDisk(offset + kHeaderBytes, staging_.get(), chunk_bytes_));
    chunk = absl::MakeConstSpan(staging_.get(), static_cast<size_t>(chunk_bytes_));
  }
  // Checked whole before the consumer sees a byte: a bad slot leaves the pool as it was.
  RETURN_IF_ERROR(CheckKvChunkBytes(seal, chunk, where));
  return consume(chunk);
}

absl::Status KvTierStore::Demote(int64_t host_slot, int64_t disk_slot) {
  RETURN_IF_ERROR(CheckSlot(KvTier::kHost, host_slot));
  RETURN_IF_ERROR(CheckSlot(KvTier::kDisk, disk_slot));
  const uint8_t* s = HostSlot(host_slot);
  KvChunkSeal seal;
  std::memcpy(&seal, s, kHeaderBytes);
  if (seal.blank()) {
    return absl::NotFoundError(absl::StrFormat("host KV tier slot %d was never written", host_slot));
  }
  const int64_t offset = disk_slot * SlotBytes();
  RETURN_IF_ERROR(WriteDisk(offset + kHeaderBytes, s + kHeaderBytes, chunk_bytes_));
  return WriteDisk(offset, &seal, kHeaderBytes);
}

}  // namespace chunkattn
