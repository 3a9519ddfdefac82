#include "services/core/kv_tiers.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace chunkattn {

KvTierMap::KvTierMap(KvTierMapOptions options)
    : shared_(options.shared),
      shared_known_max_(std::max<int64_t>(options.shared_known_max, 1)),
      record_events_(options.record_events),
      clock_(options.clock != nullptr ? options.clock : Clock::Real()) {
  for (auto [tier, id, capacity] : {std::tuple<Tier*, KvTier, int64_t>{&host_, KvTier::kHost, options.host_slots},
                                    {&disk_, KvTier::kDisk, options.disk_slots}}) {
    tier->id = id;
    tier->capacity = std::max<int64_t>(capacity, 0);
    tier->key.assign(tier->capacity, 0);
    tier->ns.assign(tier->capacity, std::string());
    tier->held.assign(tier->capacity, false);
    tier->pins.assign(tier->capacity, 0);
    tier->lru = std::make_unique<LruEviction>(tier->capacity, clock_);
    // Popped from the back: slot 0 first.
    for (int64_t s = tier->capacity - 1; s >= 0; --s) tier->free.push_back(s);
  }
}

std::optional<KvTierMap::Location> KvTierMap::Find(uint64_t key) const {
  auto it = where_.find(key);
  if (it != where_.end()) return it->second;
  if (shared_known_.contains(key)) return Location{KvTier::kShared, 0};
  return std::nullopt;
}

void KvTierMap::RememberShared(uint64_t key) {
  if (!shared_known_.insert(key).second) return;
  Note(KvTier::kShared, true, key);
  shared_order_.push_back(key);
  while (static_cast<int64_t>(shared_order_.size()) > shared_known_max_) {
    ForgetShared(shared_order_.front());
    shared_order_.pop_front();
  }
  stats_.shared_known = static_cast<int64_t>(shared_known_.size());
}

void KvTierMap::ForgetShared(uint64_t key) {
  if (shared_known_.erase(key) > 0) Note(KvTier::kShared, false, key);
  stats_.shared_known = static_cast<int64_t>(shared_known_.size());
}

void KvTierMap::NoteShared(absl::Span<const uint64_t> keys) {
  if (!shared_) return;
  for (uint64_t key : keys) {
    if (!shared_known_.contains(key)) ++stats_.shared_hits_total;
    RememberShared(key);
  }
}

void KvTierMap::Touch(Tier& tier, int64_t slot) {
  tier.lru->Uncached(slot);
  tier.lru->Cached(slot);
}

void KvTierMap::Expire() {
  const absl::Time now = clock_->Now();
  for (Tier* t : {&host_, &disk_}) t->lru->Expire(now, [](int64_t, int32_t, int32_t) {});
}

int32_t KvTierMap::Priority(uint64_t key) const {
  auto it = where_.find(key);
  if (it == where_.end()) return kDefaultRetentionPriority;
  return TierOf(it->second.tier).lru->grants(it->second.slot).PriorityAt(clock_->Now());
}

void KvTierMap::Drop(int32_t priority) {
  ++stats_.drops_total;
  ++stats_.drops_by_band_total[static_cast<int>(BandOf(priority))];
}

void KvTierMap::Hold(Tier& tier, int64_t slot, uint64_t key, const RetentionGrants* grants, std::string ns) {
  tier.held[slot] = true;
  tier.key[slot] = key;
  tier.ns[slot] = std::move(ns);
  if (grants != nullptr && !grants->empty()) tier.lru->Merge(slot, *grants, clock_->Now());
  tier.lru->Cached(slot);
  where_[key] = {tier.id, slot};
  ++(tier.id == KvTier::kHost ? stats_.host_blocks : stats_.disk_blocks);
  ++(tier.id == KvTier::kHost ? stats_.host_written_total : stats_.disk_written_total);
  Note(tier.id, true, key);
}

void KvTierMap::Forget(uint64_t key) {
  auto it = where_.find(key);
  if (it == where_.end()) return;
  Tier& tier = TierOf(it->second.tier);
  const int64_t slot = it->second.slot;
  where_.erase(it);
  tier.lru->Uncached(slot);
  tier.lru->ClearGrants(slot);
  tier.held[slot] = false;
  tier.ns[slot].clear();
  tier.free.push_back(slot);
  --(tier.id == KvTier::kHost ? stats_.host_blocks : stats_.disk_blocks);
  Note(tier.id, false, key);
}

int64_t KvTierMap::Allocate(Tier& tier, int32_t priority, std::vector<KvMove>* moves) {
  if (!tier.free.empty()) {
    const int64_t slot = tier.free.back();
    tier.free.pop_back();
    return slot;
  }
  // The first unpinned slot in eviction order, if it is of no higher priority than the newcomer.
  int64_t slot = tier.lru->Victim();
  while (slot != LruEviction::kNone && tier.pins[slot] != 0) slot = tier.lru->Next(slot);
  if (slot == LruEviction::kNone || tier.lru->Priority(slot) > priority) return -1;
  const uint64_t key = tier.key[slot];
  const int32_t victim_priority = tier.lru->Priority(slot);
  if (tier.id == KvTier::kHost && disk_.capacity > 0) {
    // Demoted before the caller's store overwrites the slot (moves run in order).
    const int64_t to = Allocate(disk_, victim_priority, moves);
    if (to >= 0) {
      const RetentionGrants grants = tier.lru->grants(slot);
      tier.lru->Uncached(slot);
      tier.lru->ClearGrants(slot);
      tier.held[slot] = false;
      --stats_.host_blocks;
      where_.erase(key);
      Note(KvTier::kHost, false, key);
      moves->push_back(KvMove::Demote(slot, to, key));
      Hold(disk_, to, key, &grants, std::move(tier.ns[slot]));
      tier.ns[slot].clear();
      ++stats_.demotions_total;
      return slot;
    }
  }
  Forget(key);
  Drop(victim_priority);
  if (tier.id == KvTier::kHost) ++stats_.host_drops_total;
  tier.free.pop_back();  // the slot Forget just freed
  return slot;
}

void KvTierMap::Keep(uint64_t key, int32_t chunk, std::vector<KvMove>* moves, const RetentionGrants* grants,
                     std::string_view ns) {
  Expire();
  if (auto it = where_.find(key); it != where_.end()) {
    Tier& tier = TierOf(it->second.tier);
    if (grants != nullptr && !grants->empty()) tier.lru->Merge(it->second.slot, *grants, clock_->Now());
    Touch(tier, it->second.slot);
    return;
  }
  if (shared_ && !shared_known_.contains(key)) {
    moves->push_back(KvMove::Store(KvTier::kShared, 0, chunk, key));
    RememberShared(key);
    ++stats_.shared_stores_total;
  }
  const int32_t priority = grants != nullptr ? grants->PriorityAt(clock_->Now()) : kDefaultRetentionPriority;
  // The host tier, else the disk tier (none, or the host's slots all pinned or of higher priority).
  for (Tier* tier : {&host_, &disk_}) {
    if (tier->capacity == 0) continue;
    const int64_t slot = Allocate(*tier, priority, moves);
    if (slot < 0) continue;
    moves->push_back(KvMove::Store(tier->id, slot, chunk, key));
    Hold(*tier, slot, key, grants, std::string(ns));
    ++stats_.stores_total;
    return;
  }
}

RetentionGrants KvTierMap::Load(uint64_t key, int32_t chunk, std::vector<KvMove>* moves) {
  if (!where_.contains(key)) {  // REQUIRES: the shared tier is believed to hold it
    moves->push_back(KvMove::Load(KvTier::kShared, 0, chunk, key));
    ++stats_.shared_loads_total;
    return {};
  }
  const Location at = where_.at(key);
  Tier& tier = TierOf(at.tier);
  RetentionGrants grants = tier.lru->grants(at.slot);
  // Re-cached at the default priority: the touch a load is.
  tier.lru->Uncached(at.slot);
  tier.lru->ClearGrants(at.slot);
  tier.lru->Cached(at.slot);
  ++tier.pins[at.slot];
  moves->push_back(KvMove::Load(at.tier, at.slot, chunk, key));
  ++(at.tier == KvTier::kHost ? stats_.host_loads_total : stats_.disk_loads_total);
  return grants;
}

std::vector<std::pair<std::string, int64_t>> KvTierMap::RaisedPerNamespace() const {
  // The LRU's priorities are as of the last Expire: a grant may have ended since.
  const absl::Time now = clock_->Now();
  absl::flat_hash_map<std::string_view, int64_t> raised;
  for (const Tier* t : {&host_, &disk_}) {
    t->lru->ForEachAbove(kDefaultRetentionPriority, [&](int64_t slot) {
      if (t->lru->grants(slot).PriorityAt(now) > kDefaultRetentionPriority) ++raised[t->ns[slot]];
    });
  }
  return {raised.begin(), raised.end()};
}

void KvTierMap::Complete(absl::Span<const KvMove> moves, absl::Span<const int32_t> failed) {
  for (const KvMove& m : moves) {
    if (m.kind == KvMove::Kind::kLoad && m.tier != KvTier::kShared) --TierOf(m.tier).pins[m.slot];
  }
  for (int32_t i : failed) {
    if (i < 0 || static_cast<size_t>(i) >= moves.size()) continue;
    const KvMove& m = moves[i];
    if (m.tier == KvTier::kShared) {
      ++(m.kind == KvMove::Kind::kLoad ? stats_.shared_fallbacks_total : stats_.shared_failed_stores_total);
      ForgetShared(m.key);  // its entry in shared_order_ goes when it comes up
      continue;
    }
    ++stats_.failed_moves_total;
    if (m.tier == KvTier::kHost && m.kind != KvMove::Kind::kDemote) ++stats_.host_failed_moves_total;
    Forget(m.key);
  }
}

absl::Status KvTierMap::CheckInvariants() const {
  int64_t held_total = 0;
  for (const Tier* t : {&host_, &disk_}) {
    const char* name = t->id == KvTier::kHost ? "host" : "disk";
    int64_t held = 0;
    for (int64_t s = 0; s < t->capacity; ++s) {
      if (t->pins[s] != 0) return absl::InternalError(absl::StrFormat("%s slot %d pinned between steps", name, s));
      if (!t->held[s]) continue;
      ++held;
      auto it = where_.find(t->key[s]);
      if (it == where_.end() || it->second.tier != t->id || it->second.slot != s) {
        return absl::InternalError(absl::StrFormat("%s slot %d holds a block the map places elsewhere", name, s));
      }
    }
    if (held != t->lru->size() ||
        held + static_cast<int64_t>(t->free.size()) != t->capacity) {
      return absl::InternalError(absl::StrFormat("%s tier: %d held, %d in its LRU, %d free of %d", name, held,
                                                 t->lru->size(), t->free.size(), t->capacity));
    }
    for (int64_t s : t->free) {
      if (t->held[s]) return absl::InternalError(absl::StrFormat("%s slot %d both free and held", name, s));
    }
    if (held != (t->id == KvTier::kHost ? stats_.host_blocks : stats_.disk_blocks)) {
      return absl::InternalError(absl::StrFormat("%s tier: %d held, the gauge says otherwise", name, held));
    }
    held_total += held;
  }
  if (held_total != static_cast<int64_t>(where_.size())) {
    return absl::InternalError(absl::StrFormat("%d blocks held, %d in the map", held_total, where_.size()));
  }
  if (static_cast<int64_t>(shared_known_.size()) > shared_known_max_ ||
      shared_known_.size() > shared_order_.size() || stats_.shared_known != static_cast<int64_t>(shared_known_.size()) ||
      (!shared_ && !shared_known_.empty())) {
    return absl::InternalError(absl::StrFormat("shared tier: %d keys believed, %d in order, bound %d",
                                               shared_known_.size(), shared_order_.size(), shared_known_max_));
  }
  return absl::OkStatus();
}

std::string_view KvTierName(KvTier tier) {
  switch (tier) {
    case KvTier::kHost: return "host";
    case KvTier::kDisk: return "disk";
    case KvTier::kShared: return "shared";
  }
  return "?";
}

absl::StatusOr<bool> ParseKvTierWritePolicy(std::string_view policy) {
  if (policy != "write_back" && policy != "write_through") {
    return absl::InvalidArgumentError("--kv_tier_write_policy must be write_back or write_through");
  }
  return policy == "write_through";
}

BlockKeyChain::BlockKeyChain(std::string_view ns, std::string_view seed) : ns_(ns), digest_(NoneDigest(seed)) {}

void BlockKeyChain::Extend(absl::Span<const int32_t> tokens, int chunk_size) {
  for (size_t b = keys_.size(); (b + 1) * chunk_size <= tokens.size(); ++b) {
    digest_ = ChainDigest(digest_, tokens.subspan(b * chunk_size, chunk_size), b == 0 ? ns_ : std::string_view());
    keys_.push_back(PublishedHash(digest_));
  }
}

std::vector<uint64_t> BlockKeys(absl::Span<const int32_t> tokens, int chunk_size, std::string_view ns,
                                std::string_view seed) {
  BlockKeyChain chain(ns, seed);
  chain.Extend(tokens, chunk_size);
  return chain.keys();
}

}  // namespace chunkattn
