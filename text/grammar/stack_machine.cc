#include "text/grammar/stack_machine.h"

#include <algorithm>

namespace chunkattn::grammar {

uint32_t StackMachine::Cons(int32_t ret, uint32_t parent) {
  const uint64_t key = Element(ret, parent);
  auto [it, inserted] = frame_ids_.try_emplace(key, static_cast<uint32_t>(frames_.size()));
  if (inserted) frames_.push_back({ret, parent});
  return it->second;
}

void StackMachine::TruncateFrames(size_t n) {
  while (frames_.size() > n) {
    const Frame& f = frames_.back();
    frame_ids_.erase(Element(f.ret, f.parent));
    frames_.pop_back();
  }
}

// Whether `e` is new to the current closure (and marks it). Few elements is
// the common case: a linear scan beats hashing there.
bool StackMachine::Mark(uint64_t e) {
  if (seen_large_.empty()) {
    for (uint64_t x : seen_small_) {
      if (x == e) return false;
    }
    seen_small_.push_back(e);
    if (seen_small_.size() > 32) seen_large_.insert(seen_small_.begin(), seen_small_.end());
    return true;
  }
  return seen_large_.insert(e).second;
}

bool StackMachine::Close(const std::vector<uint64_t>& seeds, std::vector<uint64_t>* buf) {
  const Pda& p = *pda_;
  const size_t out_begin = buf->size();
  bool completed = false;
  seen_small_.clear();
  if (!seen_large_.empty()) seen_large_.clear();
  work_.clear();
  for (uint64_t e : seeds) {
    if (Mark(e)) work_.push_back(e);
  }
  while (!work_.empty()) {
    const uint64_t e = work_.back();
    work_.pop_back();
    const int32_t s = StateOf(e);
    const uint32_t f = FrameOf(e);
    if (p.has_bytes(s)) buf->push_back(e);
    for (const Pda::Call& c : p.calls(s)) {
      const uint64_t pushed = Element(p.rule_start(c.rule), Cons(c.ret, f));
      if (Mark(pushed)) work_.push_back(pushed);
    }
    if (p.is_final(s)) {
      if (f == kBottom) {
        completed = true;
      } else {
        const Frame& fr = frames_[f];
        const uint64_t popped = Element(fr.ret, fr.parent);
        if (Mark(popped)) work_.push_back(popped);
      }
    }
    if (buf->size() - out_begin > kMaxElements) {
      overflowed_ = true;
      buf->resize(out_begin);
      return false;
    }
  }
  std::sort(buf->begin() + out_begin, buf->end());
  return completed;
}

bool StackMachine::Step(std::vector<uint64_t>* buf, size_t begin, size_t end, uint8_t byte) {
  const Pda& p = *pda_;
  raw_.clear();
  for (size_t i = begin; i < end; ++i) {
    const uint64_t e = (*buf)[i];
    const int32_t t = p.Next(StateOf(e), byte);
    if (t >= 0) raw_.push_back(Element(t, FrameOf(e)));
  }
  if (raw_.empty()) return false;
  // Fast path: one plain successor (inside a literal or a string body).
  if (raw_.size() == 1) {
    const int32_t t = StateOf(raw_[0]);
    if (!p.is_final(t) && p.calls(t).empty()) {
      buf->push_back(raw_[0]);
      return false;
    }
  }
  return Close(raw_, buf);
}

}  // namespace chunkattn::grammar
