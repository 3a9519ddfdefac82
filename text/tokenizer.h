// Text <-> token ids for one model's vocabulary. The implementation reads a
// SentencePiece tokenizer.model, the format Llama 2 and Mistral ship (BPE with
// byte fallback: text the vocabulary cannot spell becomes one token per UTF-8
// byte, "<0xE2>", so every string encodes without <unk>).
//
// A Tokenizer is immutable once loaded and safe for concurrent use: any number
// of threads may call its const methods at the same time.
#ifndef CHUNKATTN_TEXT_TOKENIZER_H_
#define CHUNKATTN_TEXT_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace chunkattn {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Token ids for `text`, with bos_id() first when `add_bos`.
  // INVALID_ARGUMENT if `text` is not well-formed UTF-8; FAILED_PRECONDITION if
  // `add_bos` and the vocabulary has no BOS.
  virtual absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text,
                                                      bool add_bos) const = 0;

  // Text for `ids`; always well-formed UTF-8. Control tokens (BOS, EOS) decode
  // to nothing. Byte-fallback tokens that do not form a complete character
  // decode to U+FFFD, one per byte. SentencePiece drops the leading space of
  // the first piece (the one Encode's dummy prefix added), so
  // Decode(Encode(t)) == t, except that a literal U+2581 "▁" in t comes back
  // as a space (SentencePiece's own whitespace escape; Llama's tokenizer does
  // the same). INVALID_ARGUMENT naming the first id outside [0, vocab_size()).
  virtual absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids) const = 0;

  // Number of ids; valid ids are [0, vocab_size()).
  virtual int32_t vocab_size() const = 0;
  // Beginning- and end-of-sequence ids, -1 when the vocabulary has none.
  virtual int32_t bos_id() const = 0;
  virtual int32_t eos_id() const = 0;

  // The vocabulary entry for `id` as stored: "▁the", "<0xE2>", "<s>".
  // INVALID_ARGUMENT outside [0, vocab_size()).
  virtual absl::StatusOr<std::string> IdToPiece(int32_t id) const = 0;

  // The bytes `id` adds to a decoded text when it is not the first piece:
  // "▁the" -> " the", "<0xE2>" -> "\xE2" (one byte: not UTF-8 on its own),
  // control tokens -> "". Concatenated over Encode(t) this gives " " + t (the
  // dummy-prefix space; t without U+2581). What OpenAI-style logprobs report
  // as a token's bytes.
  // INVALID_ARGUMENT outside [0, vocab_size()).
  virtual absl::StatusOr<std::string> TokenBytes(int32_t id) const = 0;

  // Whether `id` is a control token (BOS, EOS, ...), which decodes to nothing.
  // False outside [0, vocab_size()).
  virtual bool IsControl(int32_t id) const = 0;
};

// Loads a SentencePiece model file (tokenizer.model). NOT_FOUND if `path` does
// not exist, INVALID_ARGUMENT if it is not a regular file or not a valid
// model (truncated, corrupt, another format); messages name the file.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadSentencePieceTokenizer(const std::string& path);

// Loads a model folder's tokenizer: tokenizer.json when present (as
// transformers does; LoadHfTokenizer in hf_tokenizer.h), else tokenizer.model.
// NOT_FOUND with a message saying so when the folder does not exist or holds
// neither (callers then accept token ids only); other errors as the loaders'.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& model_dir);

}  // namespace chunkattn

#endif  // CHUNKATTN_TEXT_TOKENIZER_H_
