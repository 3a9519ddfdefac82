// Hugging Face `tokenizer.json`, read natively: what Llama 3.x, Qwen2/2.5/3,
// DeepSeek V3 (byte-level BPE) and Llama 2, Mistral, TinyLlama, Gemma
// (SentencePiece-style BPE with byte fallback) ship.
//
// The pipeline is the tokenizers library's:
//   added tokens split out of the raw text (those not `normalized`)
//   -> normalizer (NFC, NFKC, Prepend, Replace, Sequence)
//   -> added tokens split out of the normalized text (those `normalized`)
//   -> pre-tokenizer (Split with PCRE2 regexes, ByteLevel, Metaspace,
//      Digits, Sequence) -> BPE per word (merges, byte_fallback,
//      ignore_merges, fuse_unk) -> post-processor (TemplateProcessing,
//      ByteLevel, Sequence) when special tokens are asked for.
// Decoding runs the decoder chain (ByteLevel, Metaspace, ByteFallback, Fuse,
// Strip, Replace, Sequence) over the tokens' strings.
//
// A component type it does not know is UNIMPLEMENTED at load, naming the
// type and the file: never a silent wrong tokenization.
//
// Immutable once loaded and safe for concurrent use (the BPE word cache is
// internally synchronized).
#ifndef CHUNKATTN_TEXT_HF_TOKENIZER_H_
#define CHUNKATTN_TEXT_HF_TOKENIZER_H_

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "text/tokenizer.h"

namespace chunkattn {

// Loads a tokenizer.json. NOT_FOUND if `path` does not exist; INVALID_ARGUMENT
// for JSON that is not a tokenizer (naming the field); UNIMPLEMENTED for a
// component type not supported. Tokenizer::Encode's `add_bos` applies the
// post-processor's special tokens (add_special_tokens in transformers).
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadHfTokenizer(const std::string& path);

// The same from the file's content; `name` stands for the file in errors.
absl::StatusOr<std::unique_ptr<Tokenizer>> ParseHfTokenizer(std::string_view json_text, const std::string& name);

}  // namespace chunkattn

#endif  // CHUNKATTN_TEXT_HF_TOKENIZER_H_
