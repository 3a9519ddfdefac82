#include "text/grammar/vocabulary.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"

namespace chunkattn::grammar {
namespace {

// FNV-1a, 64-bit: stable across runs (cache keys may be logged and compared).
uint64_t Fnv(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const Vocabulary>> Vocabulary::Create(const Tokenizer& tokenizer,
                                                                     std::vector<int32_t> stop_ids) {
  const int32_t n = tokenizer.vocab_size();
  std::vector<std::string> bytes(n);
  std::vector<bool> control(n);
  for (int32_t id = 0; id < n; ++id) {
    control[id] = tokenizer.IsControl(id);
    if (control[id]) continue;
    auto b = tokenizer.TokenBytes(id);
    if (!b.ok()) return b.status();
    bytes[id] = std::move(*b);
  }
  if (stop_ids.empty() && tokenizer.eos_id() >= 0) stop_ids.push_back(tokenizer.eos_id());
  return FromTokens(std::move(bytes), std::move(control), std::move(stop_ids));
}

absl::StatusOr<std::shared_ptr<const Vocabulary>> Vocabulary::FromTokens(std::vector<std::string> token_bytes,
                                                                         std::vector<bool> control,
                                                                         std::vector<int32_t> stop_ids) {
  const int32_t n = static_cast<int32_t>(token_bytes.size());
  if (static_cast<int32_t>(control.size()) != n) return absl::InvalidArgumentError("control flags size mismatch");
  if (stop_ids.empty()) return absl::InvalidArgumentError("vocabulary has no stop (EOS) token");
  auto v = std::shared_ptr<Vocabulary>(new Vocabulary());
  v->is_stop_.assign(n, 0);
  v->is_text_.assign(n, 0);
  for (int32_t id : stop_ids) {
    if (id < 0 || id >= n) return absl::InvalidArgumentError(absl::StrFormat("stop token %d outside the vocabulary", id));
    v->is_stop_[id] = 1;
  }
  std::sort(stop_ids.begin(), stop_ids.end());
  stop_ids.erase(std::unique(stop_ids.begin(), stop_ids.end()), stop_ids.end());
  v->stop_ids_ = stop_ids;
  uint64_t h = 0xcbf29ce484222325ull;
  for (int32_t id = 0; id < n; ++id) {
    const uint32_t len = static_cast<uint32_t>(token_bytes[id].size());
    const uint8_t flags = (control[id] ? 1 : 0) | (v->is_stop_[id] ? 2 : 0);
    h = Fnv(h, &len, sizeof(len));
    h = Fnv(h, token_bytes[id].data(), len);
    h = Fnv(h, &flags, 1);
    // Inside a constraint: not control, not a stop, not empty.
    if (!control[id] && !v->is_stop_[id] && !token_bytes[id].empty()) {
      v->sorted_ids_.push_back(id);
      v->is_text_[id] = 1;
    }
  }
  v->fingerprint_ = h;
  std::sort(v->sorted_ids_.begin(), v->sorted_ids_.end(), [&](int32_t a, int32_t b) {
    return token_bytes[a] != token_bytes[b] ? token_bytes[a] < token_bytes[b] : a < b;
  });
  // Preorder trie from the sorted tokens: each token adds the nodes past its
  // common prefix with the previous one.
  std::vector<TrieNode>& trie = v->trie_;
  trie.push_back({0, 0, 0, 0, 0, 0});
  std::vector<int32_t> path = {0};  // node at each depth of the previous token
  v->node_of_rank_.resize(v->sorted_ids_.size());
  const std::string* prev = nullptr;
  for (size_t rank = 0; rank < v->sorted_ids_.size(); ++rank) {
    const std::string& cur = token_bytes[v->sorted_ids_[rank]];
    if (cur.size() > 0xFFFF) return absl::InvalidArgumentError("a token is longer than 65535 bytes");
    size_t lcp = 0;
    if (prev) {
      while (lcp < prev->size() && lcp < cur.size() && (*prev)[lcp] == cur[lcp]) ++lcp;
    }
    while (path.size() > lcp + 1) {
      trie[path.back()].subtree_end = static_cast<int32_t>(trie.size());
      path.pop_back();
    }
    for (size_t d = lcp; d < cur.size(); ++d) {
      trie.push_back({0, static_cast<int32_t>(rank), static_cast<int32_t>(rank), static_cast<int32_t>(rank),
                      static_cast<uint16_t>(d + 1), static_cast<uint8_t>(cur[d])});
      path.push_back(static_cast<int32_t>(trie.size() - 1));
    }
    TrieNode& node = trie[path.back()];
    if (node.token_end == node.token_begin) node.token_begin = static_cast<int32_t>(rank);
    node.token_end = static_cast<int32_t>(rank) + 1;
    v->node_of_rank_[rank] = path.back();
    prev = &cur;
  }
  while (!path.empty()) {
    trie[path.back()].subtree_end = static_cast<int32_t>(trie.size());
    path.pop_back();
  }
  v->bytes_ = std::move(token_bytes);
  return std::shared_ptr<const Vocabulary>(std::move(v));
}

}  // namespace chunkattn::grammar
