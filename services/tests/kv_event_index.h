// A router's index of the KV-event stream, and the forest's blocks to
// compare it with: for the KV-event tests (services/kv_events) and the
// prefix forest's fuzzer, which check after every operation of a walk that
// a router applying every event holds exactly the forest's blocks.
#ifndef CHUNKATTN_SERVICES_TESTS_KV_EVENT_INDEX_H_
#define CHUNKATTN_SERVICES_TESTS_KV_EVENT_INDEX_H_

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "services/core/prefix_forest.h"
#include "services/kv_events/kv_events.h"

namespace chunkattn {
namespace testing {

// What a router builds from the stream: every stored block's namespace
// (from block 0's salt, then its parent's) and how many times it is stored.
class RouterIndex {
 public:
  // Applies `events`; an event naming an unknown parent or removing an
  // unknown block is a test failure.
  void Apply(const std::vector<KvEvent>& events, int block_size) {
    for (const KvEvent& e : events) {
      switch (e.kind) {
        case KvEvent::Kind::kAllBlocksCleared:
          blocks_.clear();
          break;
        case KvEvent::Kind::kBlockRemoved:
          for (uint64_t h : e.block_hashes) {
            auto it = blocks_.find(h);
            ASSERT_NE(it, blocks_.end()) << "removed an unknown block " << h;
            if (--it->second.count == 0) blocks_.erase(it);
          }
          break;
        case KvEvent::Kind::kBlockStored: {
          ASSERT_EQ(e.token_ids.size(), e.block_hashes.size() * block_size);
          ASSERT_EQ(e.block_size, block_size);
          std::string ns = e.cache_salt;
          if (e.parent_block_hash.has_value()) {
            auto it = blocks_.find(*e.parent_block_hash);
            ASSERT_NE(it, blocks_.end()) << "a block stored before its parent " << *e.parent_block_hash;
            ASSERT_TRUE(e.cache_salt.empty());
            ns = it->second.ns;
          }
          for (uint64_t h : e.block_hashes) {
            ASSERT_NE(h, 0u);
            Entry& entry = blocks_[h];
            if (entry.count > 0) ASSERT_EQ(entry.ns, ns) << "one hash in two namespaces";
            entry.ns = ns;
            ++entry.count;
          }
          break;
        }
      }
    }
  }

  // namespace -> sorted hashes, with multiplicity.
  std::map<std::string, std::vector<uint64_t>> ByNamespace() const {
    std::map<std::string, std::vector<uint64_t>> out;
    for (const auto& [h, e] : blocks_) out[e.ns].insert(out[e.ns].end(), e.count, h);
    for (auto& [ns, v] : out) std::sort(v.begin(), v.end());
    return out;
  }

 private:
  struct Entry {
    std::string ns;
    int count = 0;
  };
  std::map<uint64_t, Entry> blocks_;
};

inline std::map<std::string, std::vector<uint64_t>> ForestBlocks(const PrefixForest& forest, const std::string& seed) {
  std::map<std::string, std::vector<uint64_t>> out;
  for (const KvBlockInfo& b : ListBlocks(forest, seed)) out[b.ns].push_back(b.hash);
  for (auto& [ns, v] : out) std::sort(v.begin(), v.end());
  return out;
}

}  // namespace testing
}  // namespace chunkattn

#endif  // CHUNKATTN_SERVICES_TESTS_KV_EVENT_INDEX_H_
