#include "services/coordinator/grammar_constraint.h"

#include <algorithm>
#include <utility>

namespace chunkattn {

GrammarConstraint::GrammarConstraint(std::shared_ptr<const grammar::CompiledGrammar> grammar, int32_t samples,
                                     bool complete_within_budget)
    : grammar_(grammar),
      mask_words_(grammar->vocab()->bitmask_words()),
      vocab_size_(grammar->vocab()->vocab_size()),
      complete_within_budget_(complete_within_budget) {
  matchers_.reserve(static_cast<size_t>(samples));
  for (int32_t i = 0; i < samples; ++i) matchers_.emplace_back(grammar);
}

std::vector<int32_t> GrammarConstraint::Spell(int32_t sample, const std::string& bytes) {
  grammar::GrammarMatcher& m = matchers_[sample];
  const grammar::Vocabulary& v = *grammar_->vocab();
  const auto& trie = v.trie();
  std::vector<int32_t> out;
  size_t at = 0;
  while (at < bytes.size()) {
    // The tokens spelling a prefix of bytes[at..], shortest first, down the trie.
    std::vector<int32_t> fits;
    int32_t node = 0;
    for (size_t i = at; i < bytes.size(); ++i) {
      int32_t child = node + 1, next = -1;
      while (child < trie[node].subtree_end) {
        if (trie[child].byte == static_cast<uint8_t>(bytes[i])) {
          next = child;
          break;
        }
        child = trie[child].subtree_end;
      }
      if (next < 0) break;
      node = next;
      for (int32_t k = trie[node].token_begin; k < trie[node].token_end; ++k) fits.push_back(v.sorted_ids()[k]);
    }
    bool advanced = false;
    for (auto it = fits.rbegin(); it != fits.rend(); ++it) {
      if (m.AcceptToken(*it)) {
        out.push_back(*it);
        at += v.token_bytes(*it).size();
        advanced = true;
        break;
      }
    }
    if (!advanced) break;
  }
  m.Rollback(static_cast<int32_t>(out.size()));
  return out;
}

bool GrammarConstraint::FillNextTokenMask(int32_t sample, int32_t tokens_left, absl::Span<uint32_t> mask) {
  grammar::GrammarMatcher& m = matchers_[sample];
  if (!m.status().ok()) return false;
  if (complete_within_budget_ && tokens_left > 0) {
    // A token spells at least a byte, so the completion needs at most its
    // length in tokens (and a stop token): nothing to do before that.
    const std::string rest = m.ShortestCompletion();
    if (static_cast<size_t>(tokens_left) <= rest.size() + 1) {
      const std::vector<int32_t> spelled = Spell(sample, rest);  // best effort if it stops short
      if (rest.empty() || (!spelled.empty() && static_cast<size_t>(tokens_left) <= spelled.size() + 1)) {
        std::fill(mask.begin(), mask.end(), 0);
        auto allow = [&](int32_t t) { mask[t / 32] |= uint32_t{1} << (t % 32); };
        if (!spelled.empty()) {
          allow(spelled.front());
        } else {
          for (int32_t t : grammar_->vocab()->stop_ids()) allow(t);  // complete: end now
        }
        return true;
      }
    }
  }
  if (!m.FillNextTokenBitmask(mask).ok()) return false;
  return std::any_of(mask.begin(), mask.end(), [](uint32_t w) { return w != 0; });
}

bool GrammarConstraint::Accept(int32_t sample, int32_t token) {
  grammar::GrammarMatcher& m = matchers_[sample];
  // A token outside the tokenizer's vocabulary (the model's may be larger)
  // or one the mask did not allow breaks the constraint: the output ends.
  if (token < 0 || token >= vocab_size_ || !m.AcceptToken(token)) return true;
  return m.IsTerminated() || !m.CanContinue();
}

}  // namespace chunkattn
