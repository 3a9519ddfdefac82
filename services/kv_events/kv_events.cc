#include "services/kv_events/kv_events.h"

#include <msgpack.hpp>

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace chunkattn {

absl::StatusOr<KvEventFormat> ParseKvEventFormat(std::string_view name) {
  if (name == "map") return KvEventFormat::kMap;
  if (name == "array") return KvEventFormat::kArray;
  return absl::InvalidArgumentError(
      absl::StrCat("KV-event format \"", std::string(name), "\" is not map (vLLM >= 0.26) or array (older vLLM)"));
}

std::string_view KvTierMedium(int tier, std::string_view pool_medium) {
  switch (tier) {
    case kKvPoolTier: return pool_medium;
    case 1: return "CPU";
    case 2: return "STORAGE";
    case 3: return "SHARED";
    default: return "";
  }
}

namespace {

using Packer = msgpack::packer<msgpack::sbuffer>;

void Str(Packer& pk, std::string_view s) {
  pk.pack_str(static_cast<uint32_t>(s.size()));
  pk.pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
}

void Hashes(Packer& pk, const std::vector<uint64_t>& hashes) {
  pk.pack_array(static_cast<uint32_t>(hashes.size()));
  for (uint64_t h : hashes) pk.pack_uint64(h);
}

// extra_keys: one entry per block, [salt] for block 0 of a namespace.
void ExtraKeys(Packer& pk, const KvEvent& e) {
  pk.pack_array(static_cast<uint32_t>(e.block_hashes.size()));
  for (size_t i = 0; i < e.block_hashes.size(); ++i) {
    if (i == 0) {
      pk.pack_array(1);
      Str(pk, e.cache_salt);
    } else {
      pk.pack_nil();
    }
  }
}

// vLLM's field order (msgspec declaration order); in the map form, fields
// with a default that are at it (extra_keys None) are left out, and required
// ones are sent even when nil.
void PackStored(Packer& pk, const KvEvent& e, KvEventFormat format, std::string_view medium) {
  // The salt goes with block 0 only (vLLM's extra_keys): a run that starts
  // deeper carries none.
  const bool salted = !e.cache_salt.empty() && !e.parent_block_hash.has_value();
  const bool map = format == KvEventFormat::kMap;
  if (map) {
    pk.pack_map(salted ? 9 : 8);
    Str(pk, "type");
  } else {
    pk.pack_array(salted ? 9 : 8);
  }
  Str(pk, "BlockStored");
  if (map) Str(pk, "block_hashes");
  Hashes(pk, e.block_hashes);
  if (map) Str(pk, "parent_block_hash");
  if (e.parent_block_hash.has_value()) {
    pk.pack_uint64(*e.parent_block_hash);
  } else {
    pk.pack_nil();
  }
  if (map) Str(pk, "token_ids");
  pk.pack_array(static_cast<uint32_t>(e.token_ids.size()));
  for (int32_t t : e.token_ids) pk.pack_int32(t);
  if (map) Str(pk, "block_size");
  pk.pack_int32(e.block_size);
  if (map) Str(pk, "lora_id");
  pk.pack_nil();
  if (map) Str(pk, "medium");
  Str(pk, medium);
  if (map) Str(pk, "lora_name");
  pk.pack_nil();
  if (salted) {
    if (map) Str(pk, "extra_keys");
    ExtraKeys(pk, e);
  }
}

void PackRemoved(Packer& pk, const KvEvent& e, KvEventFormat format, std::string_view medium) {
  const bool map = format == KvEventFormat::kMap;
  if (map) {
    pk.pack_map(3);
    Str(pk, "type");
  } else {
    pk.pack_array(3);
  }
  Str(pk, "BlockRemoved");
  if (map) Str(pk, "block_hashes");
  Hashes(pk, e.block_hashes);
  if (map) Str(pk, "medium");
  Str(pk, medium);
}

void PackCleared(Packer& pk, KvEventFormat format) {
  if (format == KvEventFormat::kMap) {
    pk.pack_map(1);
    Str(pk, "type");
  } else {
    pk.pack_array(1);
  }
  Str(pk, "AllBlocksCleared");
}

}  // namespace

std::string EncodeKvEventBatch(const KvEventBatch& batch, KvEventFormat format, std::string_view medium) {
  msgpack::sbuffer buffer;
  Packer pk(&buffer);
  pk.pack_array(3);
  pk.pack_double(batch.ts);
  pk.pack_array(static_cast<uint32_t>(batch.events.size()));
  for (const KvEvent& e : batch.events) {
    switch (e.kind) {
      case KvEvent::Kind::kBlockStored:
        PackStored(pk, e, format, KvTierMedium(e.tier, medium));
        break;
      case KvEvent::Kind::kBlockRemoved:
        PackRemoved(pk, e, format, KvTierMedium(e.tier, medium));
        break;
      case KvEvent::Kind::kAllBlocksCleared:
        PackCleared(pk, format);
        break;
    }
  }
  pk.pack_int32(0);  // data_parallel_rank: one coordinator publishes its whole replica
  return std::string(buffer.data(), buffer.size());
}

KvEventTracker::KvEventTracker(int block_size, std::string hash_seed)
    : block_size_(block_size), none_(NoneDigest(hash_seed)) {}

void KvEventTracker::Convert(std::vector<BlockEvent> blocks, std::vector<KvEvent>* out) {
  ChunkId run_tail = -1;  // the last block of the BlockStored being built
  bool removing = false;  // out->back() is a BlockRemoved being built
  for (BlockEvent& b : blocks) {
    if (b.kind == BlockEvent::Kind::kRemoved) {
      auto it = blocks_.find(b.chunk);
      if (it == blocks_.end()) continue;
      if (!removing) {
        out->push_back(KvEvent{KvEvent::Kind::kBlockRemoved, kKvPoolTier, {}, std::nullopt, {}, 0, {}});
        removing = true;
      }
      out->back().block_hashes.push_back(it->second.hash);
      blocks_.erase(it);
      run_tail = -1;
      continue;
    }
    removing = false;
    const BlockDigest* parent = &none_;
    if (b.parent >= 0) {
      auto it = blocks_.find(b.parent);
      if (it == blocks_.end()) continue;
      parent = &it->second.digest;
    }
    const std::string_view salt = b.parent < 0 ? std::string_view(b.ns) : std::string_view();
    Entry entry;
    entry.digest = ChainDigest(*parent, b.tokens, salt);
    entry.hash = PublishedHash(entry.digest);
    if (run_tail < 0 || b.parent != run_tail) {
      KvEvent e;
      e.kind = KvEvent::Kind::kBlockStored;
      e.block_size = block_size_;
      if (b.parent >= 0) {
        e.parent_block_hash = blocks_.at(b.parent).hash;
      } else {
        e.cache_salt = b.ns;
      }
      out->push_back(std::move(e));
    }
    KvEvent& e = out->back();
    e.block_hashes.push_back(entry.hash);
    e.token_ids.insert(e.token_ids.end(), b.tokens.begin(), b.tokens.end());
    blocks_[b.chunk] = entry;
    run_tail = b.chunk;
  }
}

void KvEventTracker::Clear(std::vector<KvEvent>* out) {
  blocks_.clear();
  out->push_back(KvEvent{KvEvent::Kind::kAllBlocksCleared, kKvPoolTier, {}, std::nullopt, {}, 0, {}});
}

std::vector<KvBlockInfo> ListBlocks(const PrefixForest& forest, std::string_view hash_seed) {
  const BlockDigest none = NoneDigest(hash_seed);
  // Digests by chunk, filled parent first by walking up from each block.
  absl::flat_hash_map<ChunkId, BlockDigest> digests;
  std::vector<ChunkId> path;
  std::vector<KvBlockInfo> out;
  for (ChunkId c = 0; c < forest.capacity(); ++c) {
    if (!forest.IsBlock(c)) continue;
    path.clear();
    for (ChunkId p = c; p >= 0 && !digests.contains(p); p = forest.ChunkParent(p)) path.push_back(p);
    for (auto it = path.rbegin(); it != path.rend(); ++it) {
      const ChunkId parent = forest.ChunkParent(*it);
      const BlockDigest& pd = parent < 0 ? none : digests.at(parent);
      digests[*it] = ChainDigest(pd, forest.ChunkTokens(*it), parent < 0 ? forest.ChunkNamespace(*it) : "");
    }
    out.push_back(KvBlockInfo{std::string(forest.ChunkNamespace(c)), PublishedHash(digests.at(c)), c});
  }
  return out;
}

}  // namespace chunkattn
