#include "text/train.h"

#include <filesystem>
#include <map>
#include <system_error>

#include "absl/strings/str_format.h"
#include "text/spm_bridge.h"

namespace chunkattn {
namespace {

namespace fs = std::filesystem;

constexpr unsigned int kSeed = 20240101;

}  // namespace

absl::Status TrainSentencePiece(const std::string& corpus_path, int vocab_size,
                                const std::string& model_prefix) {
  if (vocab_size <= 0) {
    return absl::InvalidArgumentError(absl::StrFormat("vocab_size must be positive, got %d", vocab_size));
  }
  std::error_code ec;
  const fs::file_status corpus = fs::status(corpus_path, ec);
  if (corpus.type() == fs::file_type::not_found) {
    return absl::NotFoundError(absl::StrFormat("training corpus %s does not exist", corpus_path));
  }
  if (corpus.type() != fs::file_type::regular) {
    return absl::InvalidArgumentError(absl::StrFormat("training corpus %s is not a regular file", corpus_path));
  }
  if (fs::file_size(corpus_path, ec) == 0 || ec) {
    return absl::InvalidArgumentError(absl::StrFormat("training corpus %s is empty", corpus_path));
  }
  if (model_prefix.empty()) return absl::InvalidArgumentError("model_prefix is empty");
  const fs::path out_dir = fs::path(model_prefix).parent_path();
  if (!out_dir.empty() && !fs::is_directory(out_dir, ec)) {
    return absl::NotFoundError(absl::StrFormat("output folder %s does not exist", out_dir.string()));
  }

  const std::map<std::string, std::string> options = {
      {"input", corpus_path},
      {"model_prefix", model_prefix},
      {"vocab_size", std::to_string(vocab_size)},
      {"model_type", "bpe"},
      {"byte_fallback", "true"},
      {"split_digits", "true"},
      // Llama's settings: no Unicode normalization, keep whitespace runs, add
      // the dummy-prefix space; whitespace-only pieces let runs of spaces
      // (indentation) become single tokens.
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"add_dummy_prefix", "true"},
      {"allow_whitespace_only_pieces", "true"},
      // Every character of the corpus gets a piece; anything else falls back
      // to bytes.
      {"character_coverage", "1.0"},
      {"unk_id", "0"},
      {"bos_id", "1"},
      {"eos_id", "2"},
      {"pad_id", "-1"},
      // Determinism: one thread, and every sentence is used (no sampling).
      {"num_threads", "1"},
      {"input_sentence_size", "0"},
      {"max_sentence_length", "65536"},  // bytes; longer lines are skipped
      {"minloglevel", "1"},              // warnings and errors only
  };
  const spm_bridge::Error error = spm_bridge::Train(options, kSeed);
  if (error.ok()) return absl::OkStatus();
  auto code = static_cast<absl::StatusCode>(error.code);
  // The trainer reports arguments that do not fit the corpus (vocab_size too
  // small or too large) as INTERNAL check failures.
  if (code == absl::StatusCode::kInternal) code = absl::StatusCode::kInvalidArgument;
  return absl::Status(code, absl::StrFormat("training SentencePiece on %s into %s: %s", corpus_path,
                                            model_prefix, error.message));
}

}  // namespace chunkattn
