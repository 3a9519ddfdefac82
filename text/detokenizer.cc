#include "text/detokenizer.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "text/utf8.h"

namespace chunkattn {
namespace {

// Prompt tokens kept as context for the first generated token. One text-bearing
// token is enough for SentencePiece (only the very first piece of a decode
// loses its leading space); a few more cost nothing.
constexpr size_t kPromptContextTokens = 4;
// A UTF-8 character is at most 4 bytes, so at most 3 trailing byte tokens can
// be an unfinished character.
constexpr size_t kMaxPendingTokens = 3;

}  // namespace

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer* tokenizer,
                                               absl::Span<const int32_t> prompt_ids)
    : tokenizer_(tokenizer) {
  const int32_t vocab_size = tokenizer_->vocab_size();
  for (size_t i = prompt_ids.size(); i > 0 && window_.size() < kPromptContextTokens + kMaxPendingTokens;
       --i) {
    const int32_t id = prompt_ids[i - 1];
    if (id < 0 || id >= vocab_size) {
      status_ = absl::InvalidArgumentError(absl::StrFormat(
          "prompt token id %d at position %d is outside the vocabulary [0, %d)", id, i - 1, vocab_size));
      window_.clear();
      return;
    }
    if (!tokenizer_->IsControl(id)) window_.push_back(id);
  }
  std::reverse(window_.begin(), window_.end());
  // A prompt that ends inside a character (only possible for prompts not made
  // by Encode) leaves those bytes pending, so the character is emitted whole if
  // generation completes it.
  absl::StatusOr<size_t> pending = PendingTailTokens();
  if (!pending.ok()) {
    status_ = pending.status();
    return;
  }
  read_ = window_.size() - *pending;
  size_t excess = read_ - std::min(read_, kPromptContextTokens);
  // The context starts on a whole character: Hugging Face's ByteFallback
  // decodes a run of byte tokens that is not valid UTF-8 as one U+FFFD per
  // byte, the valid characters in it too, so a context that began inside a
  // character would garble the next one.
  for (; excess < read_; ++excess) {
    absl::StatusOr<std::string> b = tokenizer_->TokenBytes(window_[excess]);
    if (!b.ok()) {
      status_ = b.status();
      return;
    }
    if (!b->empty() && (static_cast<unsigned char>((*b)[0]) & 0xC0) != 0x80) break;
  }
  window_.erase(window_.begin(), window_.begin() + excess);
  read_ -= excess;
  absl::StatusOr<std::string> prefix =
      tokenizer_->Decode(absl::MakeConstSpan(window_.data(), read_));
  if (!prefix.ok()) {
    status_ = prefix.status();
    return;
  }
  prefix_text_ = *std::move(prefix);
}

absl::StatusOr<size_t> IncrementalDetokenizer::PendingTailTokens() const {
  // The fewest trailing unread tokens to hold back so that the bytes before
  // them end on a whole character. Not just the tokens of the unfinished
  // character: a byte-level token can end one character and start the next,
  // and holding it back leaves the previous token's character unfinished.
  std::vector<std::string> bytes;
  for (size_t i = read_; i < window_.size(); ++i) {
    ASSIGN_OR_RETURN(std::string b, tokenizer_->TokenBytes(window_[i]));
    bytes.push_back(std::move(b));
  }
  std::string stable;
  for (const std::string& b : bytes) stable += b;
  for (size_t held = 0; held < bytes.size(); ++held) {
    if (IncompleteUtf8SuffixLength(stable) == 0) return held;
    stable.resize(stable.size() - bytes[bytes.size() - 1 - held].size());
  }
  return bytes.size();
}

absl::StatusOr<std::string> IncrementalDetokenizer::Append(int32_t id) {
  RETURN_IF_ERROR(status_);
  if (flushed_) return absl::FailedPreconditionError("Append() after Flush()");
  if (id < 0 || id >= tokenizer_->vocab_size()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("token id %d is outside the vocabulary [0, %d)", id, tokenizer_->vocab_size()));
  }
  if (tokenizer_->IsControl(id)) return std::string();
  window_.push_back(id);
  absl::StatusOr<size_t> pending = PendingTailTokens();
  if (!pending.ok()) {
    window_.pop_back();
    return pending.status();
  }
  const size_t stable = window_.size() - *pending;
  if (stable <= read_) return std::string();  // only an unfinished character so far

  absl::StatusOr<std::string> text = tokenizer_->Decode(absl::MakeConstSpan(window_.data(), stable));
  if (!text.ok()) {
    status_ = text.status();  // ids were checked, so the tokenizer is broken
    return status_;
  }
  std::string out;
  if (text->compare(0, prefix_text_.size(), prefix_text_) == 0) {
    out = text->substr(prefix_text_.size());
  } else {
    // Not expected for SentencePiece (see the contract in the header); resync
    // without splitting a character.
    out = text->substr(CommonUtf8PrefixLength(prefix_text_, *text));
  }
  // Slide: the tokens just emitted become the context of the next decode.
  window_.erase(window_.begin(), window_.begin() + read_);
  read_ = stable - read_;
  absl::StatusOr<std::string> prefix = tokenizer_->Decode(absl::MakeConstSpan(window_.data(), read_));
  if (!prefix.ok()) {
    status_ = prefix.status();
    return status_;
  }
  prefix_text_ = *std::move(prefix);
  return out;
}

absl::StatusOr<std::string> IncrementalDetokenizer::Flush() {
  RETURN_IF_ERROR(status_);
  if (flushed_) return absl::FailedPreconditionError("Flush() called twice");
  flushed_ = true;
  if (read_ == window_.size()) return std::string();
  ASSIGN_OR_RETURN(std::string text, tokenizer_->Decode(window_));
  if (text.compare(0, prefix_text_.size(), prefix_text_) == 0) return text.substr(prefix_text_.size());
  return text.substr(CommonUtf8PrefixLength(prefix_text_, text));
}

}  // namespace chunkattn
