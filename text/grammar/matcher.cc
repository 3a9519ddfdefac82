#include "text/grammar/matcher.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_format.h"

namespace chunkattn::grammar {

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar)
    : grammar_(std::move(grammar)), machine_(&grammar_->pda()) {
  const Pda& p = grammar_->pda();
  const bool completed = machine_.Close({StackMachine::Element(p.rule_start(p.root_rule()), StackMachine::kBottom)},
                                        &sets_);
  history_.push_back({0, sets_.size(), machine_.num_frames(), completed, false});
}

absl::Status GrammarMatcher::status() const {
  if (machine_.overflowed()) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "grammar too ambiguous: over %d parse stacks at once", StackMachine::kMaxElements));
  }
  return absl::OkStatus();
}

bool GrammarMatcher::Advance(std::string_view bytes) {
  const Checkpoint& cur = history_.back();
  if (cur.terminated) return false;
  if (bytes.empty()) {
    history_.push_back(cur);
    return true;
  }
  scratch_.assign(sets_.begin() + cur.begin, sets_.begin() + cur.end);
  size_t begin = 0, end = scratch_.size();
  bool completed = false;
  for (size_t i = 0; i < bytes.size(); ++i) {
    completed = machine_.Step(&scratch_, begin, end, static_cast<uint8_t>(bytes[i]));
    begin = end;
    end = scratch_.size();
    // Nothing left to extend: only a complete match on the last byte counts.
    if (begin == end && !(completed && i + 1 == bytes.size())) {
      machine_.TruncateFrames(cur.num_frames);
      return false;
    }
  }
  const size_t at = sets_.size();
  sets_.insert(sets_.end(), scratch_.begin() + begin, scratch_.begin() + end);
  history_.push_back({at, sets_.size(), machine_.num_frames(), completed, false});
  return true;
}

bool GrammarMatcher::AcceptBytes(std::string_view bytes) { return Advance(bytes); }

bool GrammarMatcher::AcceptToken(int32_t token_id) {
  const Vocabulary* v = grammar_->vocab();
  if (v == nullptr || token_id < 0 || token_id >= v->vocab_size()) return false;
  if (v->is_stop(token_id)) {
    if (!IsCompleted()) return false;
    Checkpoint next = history_.back();
    next.terminated = true;
    history_.push_back(next);
    return true;
  }
  // Control tokens and empty ones are never part of a constrained output.
  if (!v->is_text(token_id)) return false;
  const std::string& bytes = v->token_bytes(token_id);
  return Advance(bytes);
}

void GrammarMatcher::Rollback(int32_t num_steps) {
  const int32_t n = std::min(num_steps, this->num_steps());
  if (n <= 0) return;
  history_.resize(history_.size() - n);
  sets_.resize(history_.back().end);
  machine_.TruncateFrames(history_.back().num_frames);
}

std::string GrammarMatcher::ShortestCompletion() const {
  const Checkpoint& cur = history_.back();
  if (cur.terminated || cur.completed) return "";
  const Pda& p = grammar_->pda();
  // Cost of an element: finish its rule, then every caller's from its
  // return state.
  int64_t best = std::numeric_limits<int64_t>::max();
  uint64_t best_element = 0;
  for (size_t i = cur.begin; i < cur.end; ++i) {
    const uint64_t e = sets_[i];
    int64_t cost = p.min_bytes(StackMachine::StateOf(e));
    for (uint32_t f = StackMachine::FrameOf(e); f != StackMachine::kBottom && cost < best;
         f = machine_.frame(f).parent) {
      cost += p.min_bytes(machine_.frame(f).ret);
    }
    if (cost < best) {
      best = cost;
      best_element = e;
    }
  }
  std::string out;
  if (best == std::numeric_limits<int64_t>::max()) return out;
  p.AppendShortestFinish(StackMachine::StateOf(best_element), &out);
  for (uint32_t f = StackMachine::FrameOf(best_element); f != StackMachine::kBottom; f = machine_.frame(f).parent) {
    p.AppendShortestFinish(machine_.frame(f).ret, &out);
  }
  return out;
}

absl::Status GrammarMatcher::FillNextTokenBitmask(absl::Span<uint32_t> bitmask) {
  const Vocabulary* v = grammar_->vocab();
  if (v == nullptr) return absl::InvalidArgumentError("FillNextTokenBitmask: compiled without a vocabulary");
  const size_t words = static_cast<size_t>(v->bitmask_words());
  if (bitmask.size() < words) {
    return absl::InvalidArgumentError(
        absl::StrFormat("FillNextTokenBitmask: bitmask has %d words, needs %d", bitmask.size(), words));
  }
  std::fill(bitmask.begin(), bitmask.end(), 0u);
  const Checkpoint& cur = history_.back();
  if (cur.terminated) return absl::OkStatus();
  // Distinct classifications of the current positions.
  const CompiledGrammar::TokenClasses* classes[64];
  size_t num_classes = 0;
  bool many = false;
  for (size_t i = cur.begin; i < cur.end; ++i) {
    const CompiledGrammar::TokenClasses* tc = grammar_->classes_of(StackMachine::StateOf(sets_[i]));
    if (tc == nullptr || std::find(classes, classes + num_classes, tc) != classes + num_classes) continue;
    if (num_classes == 64) {
      many = true;
      break;
    }
    classes[num_classes++] = tc;
  }
  if (many) {
    // Pathologically many positions at once: check every token directly.
    merged_.resize(v->sorted_ids().size());
    for (size_t r = 0; r < merged_.size(); ++r) merged_[r] = static_cast<int32_t>(r);
    CheckUncertain(merged_, bitmask);
  } else {
    size_t uncertain_lists = 0;
    const std::vector<int32_t>* only = nullptr;
    for (size_t k = 0; k < num_classes; ++k) {
      const CompiledGrammar::TokenClasses& tc = *classes[k];
      if (!tc.accepted_bits.empty()) {
        for (size_t w = 0; w < words; ++w) bitmask[w] |= tc.accepted_bits[w];
      } else {
        for (int32_t id : tc.accepted_ids) bitmask[id >> 5] |= 1u << (id & 31);
      }
      if (!tc.uncertain_ranks.empty()) {
        ++uncertain_lists;
        only = &tc.uncertain_ranks;
      }
    }
    if (uncertain_lists == 1) {
      CheckUncertain(*only, bitmask);
    } else if (uncertain_lists > 1) {
      merged_.clear();
      for (size_t k = 0; k < num_classes; ++k) {
        merged_.insert(merged_.end(), classes[k]->uncertain_ranks.begin(), classes[k]->uncertain_ranks.end());
      }
      std::sort(merged_.begin(), merged_.end());
      merged_.erase(std::unique(merged_.begin(), merged_.end()), merged_.end());
      CheckUncertain(merged_, bitmask);
    }
  }
  if (cur.completed) {
    for (int32_t id : v->stop_ids()) bitmask[id >> 5] |= 1u << (id & 31);
  }
  return absl::OkStatus();
}

// Walks the tokens of `ranks` (ascending, so neighbours share prefixes) from
// the current set, keeping the set after each prefix byte so that a token
// restarts from its common prefix with the previous one.
void GrammarMatcher::CheckUncertain(const std::vector<int32_t>& ranks, absl::Span<uint32_t> bitmask) {
  const Vocabulary& v = *grammar_->vocab();
  const Checkpoint& cur = history_.back();
  walk_.assign(sets_.begin() + cur.begin, sets_.begin() + cur.end);
  walk_begin_.assign(1, 0);
  walk_end_.assign(1, walk_.size());
  walk_frames_.assign(1, cur.num_frames);
  walk_completed_.assign(1, cur.completed);
  const std::string* prev = nullptr;
  size_t valid = 0;           // depths [0, valid] of walk_* hold prev's prefixes
  size_t dead = SIZE_MAX;     // prev's prefix of this length has no continuation
  for (int32_t rank : ranks) {
    const int32_t id = v.sorted_ids()[rank];
    if (bitmask[id >> 5] & (1u << (id & 31))) continue;
    const std::string& t = v.token_bytes(id);
    size_t lcp = 0;
    if (prev != nullptr) {
      const size_t limit = std::min({prev->size(), t.size(), std::max(valid, dead == SIZE_MAX ? 0 : dead)});
      while (lcp < limit && (*prev)[lcp] == t[lcp]) ++lcp;
    }
    if (dead != SIZE_MAX && lcp >= dead) continue;  // shares a prefix that died
    size_t d = std::min(lcp, valid);
    walk_.resize(walk_end_[d]);
    machine_.TruncateFrames(walk_frames_[d]);
    prev = &t;
    dead = SIZE_MAX;
    bool ok = true;
    for (; d < t.size(); ++d) {
      const bool completed = machine_.Step(&walk_, walk_begin_[d], walk_end_[d], static_cast<uint8_t>(t[d]));
      if (walk_begin_.size() <= d + 1) {
        walk_begin_.resize(d + 2);
        walk_end_.resize(d + 2);
        walk_frames_.resize(d + 2);
        walk_completed_.resize(d + 2);
      }
      walk_begin_[d + 1] = walk_end_[d];
      walk_end_[d + 1] = walk_.size();
      walk_frames_[d + 1] = machine_.num_frames();
      walk_completed_[d + 1] = completed;
      if (walk_end_[d + 1] == walk_begin_[d + 1]) {
        ok = completed && d + 1 == t.size();
        if (!ok) dead = d + 1;
        valid = d + 1;
        break;
      }
    }
    if (ok) {
      valid = t.size();
      bitmask[id >> 5] |= 1u << (id & 31);
    }
  }
  walk_.clear();
  machine_.TruncateFrames(cur.num_frames);
}

}  // namespace chunkattn::grammar
