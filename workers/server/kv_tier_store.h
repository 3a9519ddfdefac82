// A worker's KV tiers below its pool (issue 41): a host tier (an array of
// slots in this process's RAM, --host_kv_cache_mib) and a disk tier (one
// file of slots in --disk_kv_cache_dir, --disk_kv_cache_mib). A slot holds
// one chunk of this rank's KV shard (Model::ReadChunk's bytes) behind its
// seal (kv_chunk_seal.h: 32 bytes of magic, key, checksum and length), so a
// slot is kHeaderBytes + chunk_bytes, in memory and in the file alike.
//
// The coordinator owns the map of which slot holds what (services/core);
// this store only keeps the bytes and refuses to hand back anything but
// what was stored under the key asked for: a Load checks the seal's magic,
// key, length and checksum, so a slot never written, overwritten, corrupted
// on disk or cut short by a truncated file fails (NOT_FOUND or DATA_LOSS,
// naming what did not match), and the
// coordinator recomputes the chunk instead.
//
// Lifetime: one store per worker session (made at Join, so a new session
// starts with empty tiers). The disk tier's file is created fresh (mode
// 0600, O_EXCL, a name of its own) and removed when the store is destroyed
// (the session replaced, the worker exiting); it holds prompts' KV
// (SECURITY.md). The host tier's memory comes from the worker's allocator:
// plain memory on a CPU worker, reserved up front but touched only as slots
// are written; pinned memory on a GPU worker (gpu_model.h), which the
// device reads and writes in place (StoreFrom, LoadTo: no bounce buffer).
//
// Thread-compatible: the worker's one thread (its Execute stream, through
// PlanExecutor) drives it.
#ifndef CHUNKATTN_WORKERS_SERVER_KV_TIER_STORE_H_
#define CHUNKATTN_WORKERS_SERVER_KV_TIER_STORE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/functional/function_ref.h"
#include "absl/types/span.h"
#include "base/host_memory.h"
#include "proto/plan/step_plan.h"
#include "workers/server/kv_chunk_seal.h"

namespace chunkattn {

struct KvTierOptions {
  int64_t host_bytes = 0;  // the host tier's budget; 0 = no host tier
  std::string disk_dir;    // where the disk tier's file goes; empty = no disk tier
  int64_t disk_bytes = 0;  // the disk tier's budget (> 0 with disk_dir)
};

// The worker's flags as options: INVALID_ARGUMENT, naming the flag, for a
// negative or absurd budget (over 2^30 MiB), a disk budget without a
// directory or a directory without a budget, or a directory that is not an
// existing, writable directory.
absl::StatusOr<KvTierOptions> KvTierOptionsFromFlags(int64_t host_kv_cache_mib, const std::string& disk_kv_cache_dir,
                                                     int64_t disk_kv_cache_mib);

class KvTierStore {
 public:
  // Bytes of a slot's header, before its chunk: the chunk's seal.
  static constexpr int64_t kHeaderBytes = KvChunkSeal::kBytes;

  // The tiers of `options` for chunks of `chunk_bytes`: each holds
  // budget / (kHeaderBytes + chunk_bytes) slots (a budget smaller than a slot
  // holds none: the tier is off). The host tier's slots, and the one chunk
  // a disk move passes through, come from `allocate`. RESOURCE_EXHAUSTED
  // when the host memory cannot be had, UNAVAILABLE when the disk file
  // cannot be made.
  static absl::StatusOr<std::unique_ptr<KvTierStore>> Create(const KvTierOptions& options, int64_t chunk_bytes,
                                                             const HostAllocator& allocate = AllocateHostBytes);
  ~KvTierStore();
  KvTierStore(const KvTierStore&) = delete;
  KvTierStore& operator=(const KvTierStore&) = delete;

  int64_t chunk_bytes() const { return chunk_bytes_; }
  int64_t slots(KvTier tier) const { return tier == KvTier::kHost ? host_slots_ : disk_slots_; }
  // The disk tier's file (empty without one), for tests and the log.
  const std::string& disk_path() const { return disk_path_; }

  // `bytes` (chunk_bytes() of them) into `slot` of `tier`, tagged `key`,
  // replacing what the slot held. OUT_OF_RANGE for a slot the tier does not
  // have, INVALID_ARGUMENT for a buffer of another size, an I/O error's code
  // (UNAVAILABLE, RESOURCE_EXHAUSTED when the disk is full) otherwise.
  absl::Status Store(KvTier tier, int64_t slot, uint64_t key, absl::Span<const uint8_t> bytes);
  // The bytes stored in `slot` of `tier` under `key` into `out` (chunk_bytes()
  // of them). NOT_FOUND for a slot never written or holding another key,
  // DATA_LOSS when its magic, length or checksum does not match (corrupt, or
  // a truncated file); `out` is then unspecified. Codes of Store otherwise.
  absl::Status Load(KvTier tier, int64_t slot, uint64_t key, absl::Span<uint8_t> out);
  // Store and Load without a caller's buffer: `fill` writes the chunk into
  // the span it is given (the host slot itself, or the staging chunk a disk
  // store then writes out), `consume` reads it from the checked slot or
  // staging chunk. A host slot whose fill failed is blank (NOT_FOUND
  // after); a disk slot keeps what it held (the fill never reached the
  // file). Errors as Store and Load, or the callback's.
  using FillChunk = absl::FunctionRef<absl::Status(absl::Span<uint8_t> chunk)>;
  using ConsumeChunk = absl::FunctionRef<absl::Status(absl::Span<const uint8_t> chunk)>;
  absl::Status StoreFrom(KvTier tier, int64_t slot, uint64_t key, FillChunk fill);
  absl::Status LoadTo(KvTier tier, int64_t slot, uint64_t key, ConsumeChunk consume);
  // Host `host_slot` -> disk `disk_slot`, header and bytes as they are (the
  // checksum is checked by the Load that reads them back). NOT_FOUND for a
  // host slot never written.
  absl::Status Demote(int64_t host_slot, int64_t disk_slot);

 private:
  // Owns a file descriptor: closed on destruction.
  class Fd {
   public:
    Fd() = default;
    explicit Fd(int fd) : fd_(fd) {}
    Fd(Fd&& other) noexcept : fd_(other.release()) {}
    Fd& operator=(Fd&& other) noexcept;
    ~Fd();
    int get() const { return fd_; }
    int release() {
      const int fd = fd_;
      fd_ = -1;
      return fd;
    }

   private:
    int fd_ = -1;
  };

  explicit KvTierStore(int64_t chunk_bytes) : chunk_bytes_(chunk_bytes) {}

  int64_t SlotBytes() const { return kHeaderBytes + chunk_bytes_; }
  absl::Status CheckSlot(KvTier tier, int64_t slot) const;
  uint8_t* HostSlot(int64_t slot) { return host_.get() + slot * SlotBytes(); }
  // The whole of `n` bytes at `offset` of the disk file, through EINTR and
  // short transfers; DATA_LOSS when the file ends first (a read).
  absl::Status ReadDisk(int64_t offset, void* to, int64_t n);
  absl::Status WriteDisk(int64_t offset, const void* from, int64_t n);

  int64_t chunk_bytes_;
  int64_t host_slots_ = 0;
  int64_t disk_slots_ = 0;
  HostBytes host_{nullptr, [](uint8_t*) {}};     // host_slots_ slots: seal, then the chunk
  HostBytes staging_{nullptr, [](uint8_t*) {}};  // one chunk, with a disk tier
  std::string disk_path_;
  Fd disk_;  // disk_slots_ slots, laid out as the host's
};

}  // namespace chunkattn

#endif  // CHUNKATTN_WORKERS_SERVER_KV_TIER_STORE_H_
