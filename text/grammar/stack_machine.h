// Internal to the grammar engine: the nondeterministic run of a Pda over
// bytes. A configuration is a set of *elements* (state, frame): the state of
// the innermost rule and its stack of return states, a frame being a
// hash-consed (return state, parent frame) pair, so equal stacks share one
// frame index and sets of elements compare exactly. Sets are kept closed:
// calls are entered and finished rules popped until every element sits on a
// state with a byte transition.
//
// Thread ownership: one StackMachine per thread (the matcher, or one
// precomputation); the Pda it reads is shared and immutable.
#ifndef CHUNKATTN_TEXT_GRAMMAR_STACK_MACHINE_H_
#define CHUNKATTN_TEXT_GRAMMAR_STACK_MACHINE_H_

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "text/grammar/pda.h"

namespace chunkattn::grammar {

class StackMachine {
 public:
  // The empty stack: popping to it means the outermost rule finished.
  static constexpr uint32_t kBottom = 0xFFFFFFFFu;
  // An ambiguous grammar can make sets grow; past this many elements a step
  // fails (and overflowed() says so) rather than slow every later step.
  static constexpr size_t kMaxElements = 4096;

  struct Frame {
    int32_t ret;
    uint32_t parent;
  };

  explicit StackMachine(const Pda* pda) : pda_(pda) {}

  static uint64_t Element(int32_t state, uint32_t frame) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(state)) << 32) | frame;
  }
  static int32_t StateOf(uint64_t e) { return static_cast<int32_t>(e >> 32); }
  static uint32_t FrameOf(uint64_t e) { return static_cast<uint32_t>(e); }

  // Appends to `buf` the closure of `seeds` (sorted, without duplicates);
  // returns whether some path popped past the bottom frame.
  bool Close(const std::vector<uint64_t>& seeds, std::vector<uint64_t>* buf);

  // Appends to `buf` the closed set after `byte` from the closed set
  // buf[begin, end); returns whether some path popped past the bottom.
  bool Step(std::vector<uint64_t>* buf, size_t begin, size_t end, uint8_t byte);

  uint32_t Cons(int32_t ret, uint32_t parent);
  const Frame& frame(uint32_t f) const { return frames_[f]; }
  size_t num_frames() const { return frames_.size(); }
  // Forgets frames created after num_frames() was `n` (none may be in use).
  void TruncateFrames(size_t n);

  bool overflowed() const { return overflowed_; }
  const Pda& pda() const { return *pda_; }

 private:
  bool Mark(uint64_t e);

  const Pda* pda_;
  std::vector<Frame> frames_;
  absl::flat_hash_map<uint64_t, uint32_t> frame_ids_;
  std::vector<uint64_t> raw_;
  std::vector<uint64_t> work_;
  std::vector<uint64_t> seen_small_;
  absl::flat_hash_set<uint64_t> seen_large_;
  bool overflowed_ = false;
};

}  // namespace chunkattn::grammar

#endif  // CHUNKATTN_TEXT_GRAMMAR_STACK_MACHINE_H_
