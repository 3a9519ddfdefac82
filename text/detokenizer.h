// Streaming detokenization: turns generated token ids into text one token at
// a time, for server-sent events.
//
// Two things make this harder than decoding each token alone:
//  - SentencePiece drops the leading space of the first piece it decodes, so
//    "▁world" alone decodes to "world" though it means " world" after a
//    prompt. The detokenizer therefore decodes a short window that starts
//    with already-emitted tokens and returns only the new part.
//  - Byte-fallback tokens spell one character over several tokens ("€" is
//    <0xE2><0x82><0xAC>). The detokenizer holds such bytes back until the
//    character is complete, so no output ever splits a character: every
//    string it returns is well-formed UTF-8.
//
// Contract. Let prompt' be the prompt without a trailing incomplete
// character (the prompt itself when it ends on a complete character, as every
// prompt that Encode() produced does). Then the concatenation of all Append()
// results and the final Flush() equals
//   Decode(prompt + generated) with the prefix Decode(prompt') removed,
// and Decode(prompt') is always such a prefix. Control tokens (EOS, BOS) add
// nothing, exactly as in Decode().
//
// Cost: each Append() decodes (twice) a window of at most 8 tokens: up to 4 of
// context (the last prompt tokens, then the tokens the previous non-empty
// Append emitted), up to 3 held-back bytes and the new token. O(1) in the
// length of the sequence.
//
// Thread-compatible: one IncrementalDetokenizer per sequence; calls on one
// object must not overlap.
#ifndef CHUNKATTN_TEXT_DETOKENIZER_H_
#define CHUNKATTN_TEXT_DETOKENIZER_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "text/tokenizer.h"

namespace chunkattn {

class IncrementalDetokenizer {
 public:
  // `tokenizer` is borrowed and must outlive this object. `prompt_ids` gives
  // the context the first generated token is decoded in; only its last few
  // non-control tokens are kept (and checked): an id among them outside the
  // vocabulary makes every later call return INVALID_ARGUMENT.
  IncrementalDetokenizer(const Tokenizer* tokenizer, absl::Span<const int32_t> prompt_ids);

  // Adds one generated token and returns the text it completes: possibly
  // empty (a control token, or bytes of a character still incomplete),
  // possibly more than the token's own text (a character finished by this
  // byte). INVALID_ARGUMENT for an id outside the vocabulary (the state is
  // left as before the call); FAILED_PRECONDITION after Flush().
  absl::StatusOr<std::string> Append(int32_t id);

  // Returns what is still held back (an incomplete character at the end of
  // the sequence, as U+FFFD per byte, like Decode()). Call once, at the end;
  // Append() fails afterwards.
  absl::StatusOr<std::string> Flush();

  // For tests: tokens currently held in the decode window.
  size_t window_size() const { return window_.size(); }

 private:
  // Number of tokens at the end of window_[read_, end) whose bytes form an
  // incomplete character, so their text may still change.
  absl::StatusOr<size_t> PendingTailTokens() const;

  const Tokenizer* tokenizer_;
  absl::Status status_;          // sticky error from the prompt; OK otherwise
  bool flushed_ = false;
  // window_[0, read_) is context whose text has been emitted (or belongs to
  // the prompt) and decodes to prefix_text_; window_[read_, end) is not yet
  // emitted. Control tokens are never stored: they decode to nothing
  // anywhere, and leaving them out keeps every window token text-bearing.
  std::vector<int32_t> window_;
  size_t read_ = 0;
  std::string prefix_text_;
};

}  // namespace chunkattn

#endif  // CHUNKATTN_TEXT_DETOKENIZER_H_
