#include "services/core/shared_kv_probe.h"

#include <utility>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/types/span.h"
#include "services/core/kv_tiers.h"

namespace chunkattn {

SharedKvProbe::SharedKvProbe(SharedKvProbeOptions options, Done done)
    : options_(std::move(options)), done_(std::move(done)), thread_([this] { Loop(); }) {}

SharedKvProbe::~SharedKvProbe() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void SharedKvProbe::SetKeyPrefixes(std::vector<std::string> prefixes) {
  absl::MutexLock lock(&mu_);
  prefixes_ = std::move(prefixes);
}

void SharedKvProbe::Probe(int64_t id, std::vector<int32_t> prompt, std::string ns) {
  absl::MutexLock lock(&mu_);
  queue_.push_back({id, std::move(prompt), std::move(ns), absl::Now()});
}

SharedKvProbeStats SharedKvProbe::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void SharedKvProbe::Loop() {
  RedisClient client(options_.url, options_.redis);
  while (true) {
    std::vector<Pending> batch;
    std::vector<std::string> prefixes;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &SharedKvProbe::HasWork));
      if (stop_) return;
      while (!queue_.empty()) {
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
      prefixes = prefixes_;
    }
    Round(std::move(batch), prefixes, &client);
  }
}

void SharedKvProbe::Round(std::vector<Pending> batch, const std::vector<std::string>& prefixes, RedisClient* client) {
  const int c = options_.chunk_size;
  const absl::Time now = absl::Now();
  // Per probe, its blocks' keys; per block, one EXISTS over every rank's key.
  std::vector<std::vector<uint64_t>> keys(batch.size());
  std::vector<std::vector<std::string>> groups;
  for (size_t i = 0; i < batch.size(); ++i) {
    const Pending& p = batch[i];
    if (prefixes.empty() || c <= 0 || now - p.queued > options_.max_wait) continue;
    const size_t blocks = p.prompt.empty() ? 0 : (p.prompt.size() - 1) / static_cast<size_t>(c);
    if (groups.size() + blocks > static_cast<size_t>(options_.max_blocks_per_round)) continue;
    keys[i] = BlockKeys(absl::MakeConstSpan(p.prompt).first(blocks * c), c, p.ns, options_.block_hash_seed);
    for (uint64_t key : keys[i]) {
      std::vector<std::string>& g = groups.emplace_back();
      for (const std::string& prefix : prefixes) g.push_back(absl::StrFormat("%s%016x", prefix, key));
    }
  }
  absl::StatusOr<std::vector<int64_t>> found = client->ExistsEach(groups);
  const bool ok = found.ok() && found->size() == groups.size();
  int64_t blocks_found = 0;
  size_t g = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    std::vector<uint64_t> hits;
    if (ok) {
      // Leading blocks only: a load fills the prompt from its first block the
      // pool lacks, so a hole ends what the store can give.
      for (size_t b = 0; b < keys[i].size() && (*found)[g + b] == static_cast<int64_t>(prefixes.size()); ++b) {
        hits.push_back(keys[i][b]);
      }
    }
    g += keys[i].size();
    blocks_found += static_cast<int64_t>(hits.size());
    done_(batch[i].id, std::move(hits));
  }
  absl::MutexLock lock(&mu_);
  stats_.probes_total += static_cast<int64_t>(batch.size());
  stats_.blocks_found_total += blocks_found;
  if (!ok && !groups.empty()) stats_.failed_total += static_cast<int64_t>(batch.size());
}

}  // namespace chunkattn
