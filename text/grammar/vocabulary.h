// A tokenizer's vocabulary as the grammar engine sees it: each token's bytes
// (Tokenizer::TokenBytes), the stop tokens allowed exactly when a constraint
// is complete, and a byte trie over the tokens in sorted order, so that a
// walk shares work among tokens with a common prefix and skips every token
// below a rejected prefix at once.
//
// Control tokens (Tokenizer::IsControl) and tokens with no bytes are never
// allowed inside a constraint; of them, only the stop tokens are allowed,
// and only at its end.
//
// Thread ownership: immutable after Create; build once per tokenizer and
// share between threads.
#ifndef CHUNKATTN_TEXT_GRAMMAR_VOCABULARY_H_
#define CHUNKATTN_TEXT_GRAMMAR_VOCABULARY_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "text/tokenizer.h"

namespace chunkattn::grammar {

class Vocabulary {
 public:
  struct TrieNode {
    int32_t subtree_end;  // nodes [this, subtree_end) are this node's subtree (preorder)
    int32_t token_begin;  // sorted_ids()[token_begin, token_end): tokens spelled by the path here
    int32_t token_end;
    int32_t first_rank;   // the smallest rank in the subtree (its tokens are ranks
                          // [first_rank, next preorder subtree's first_rank))
    uint16_t depth;       // bytes from the root
    uint8_t byte;         // the byte on the edge into this node
  };

  // `stop_ids`: tokens that end a constrained output; tokenizer.eos_id() when
  // empty. INVALID_ARGUMENT for a stop id outside the vocabulary, or when
  // there is none.
  static absl::StatusOr<std::shared_ptr<const Vocabulary>> Create(const Tokenizer& tokenizer,
                                                                 std::vector<int32_t> stop_ids = {});
  // The same from raw token bytes (tests); `control[i]` marks control tokens.
  static absl::StatusOr<std::shared_ptr<const Vocabulary>> FromTokens(std::vector<std::string> token_bytes,
                                                                     std::vector<bool> control,
                                                                     std::vector<int32_t> stop_ids);

  int32_t vocab_size() const { return static_cast<int32_t>(bytes_.size()); }
  // Words of a token bitmask: ceil(vocab_size / 32).
  int32_t bitmask_words() const { return (vocab_size() + 31) / 32; }
  const std::string& token_bytes(int32_t id) const { return bytes_[id]; }
  bool is_stop(int32_t id) const { return id >= 0 && id < vocab_size() && is_stop_[id]; }
  // Whether `id` may appear inside a constraint (not control, stop or empty).
  bool is_text(int32_t id) const { return id >= 0 && id < vocab_size() && is_text_[id]; }
  const std::vector<int32_t>& stop_ids() const { return stop_ids_; }
  // Tokens that may appear inside a constraint, sorted by bytes.
  const std::vector<int32_t>& sorted_ids() const { return sorted_ids_; }
  // Node 0 is the root (no byte); a preorder layout.
  const std::vector<TrieNode>& trie() const { return trie_; }
  // The trie node whose path spells sorted_ids()[rank].
  int32_t node_of_rank(int32_t rank) const { return node_of_rank_[rank]; }
  // Identifies the vocabulary's content (bytes, controls, stops) for caches.
  uint64_t fingerprint() const { return fingerprint_; }

 private:
  Vocabulary() = default;

  std::vector<std::string> bytes_;
  std::vector<uint8_t> is_stop_;
  std::vector<uint8_t> is_text_;
  std::vector<int32_t> stop_ids_;
  std::vector<int32_t> sorted_ids_;
  std::vector<TrieNode> trie_;
  std::vector<int32_t> node_of_rank_;
  uint64_t fingerprint_ = 0;
};

}  // namespace chunkattn::grammar

#endif  // CHUNKATTN_TEXT_GRAMMAR_VOCABULARY_H_
