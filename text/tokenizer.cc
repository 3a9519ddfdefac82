#include "text/tokenizer.h"

#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "text/hf_tokenizer.h"
#include "text/spm_bridge.h"
#include "text/utf8.h"

namespace chunkattn {
namespace {

namespace fs = std::filesystem;

constexpr char kTokenizerFileName[] = "tokenizer.model";
constexpr char kSpaceSymbol[] = "\xE2\x96\x81";  // U+2581 "▁", SentencePiece's space

// Parses a byte-fallback piece "<0xAB>" into its byte; -1 if malformed.
int ParseBytePiece(const std::string& piece) {
  if (piece.size() != 6 || piece.compare(0, 3, "<0x") != 0 || piece[5] != '>') return -1;
  int value = 0;
  for (int k = 3; k < 5; ++k) {
    const char c = piece[k];
    int digit;
    if (c >= '0' && c <= '9') {
      digit = c - '0';
    } else if (c >= 'A' && c <= 'F') {
      digit = c - 'A' + 10;
    } else if (c >= 'a' && c <= 'f') {
      digit = c - 'a' + 10;
    } else {
      return -1;
    }
    value = value * 16 + digit;
  }
  return value;
}

class SentencePieceTokenizer final : public Tokenizer {
 public:
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Create(const std::string& path,
                                                           std::unique_ptr<spm_bridge::Model> model) {
    auto tokenizer = std::unique_ptr<SentencePieceTokenizer>(new SentencePieceTokenizer(std::move(model)));
    const int n = tokenizer->model_->piece_size();
    if (n <= 0) {
      return absl::InvalidArgumentError(absl::StrFormat("%s: SentencePiece model has no pieces", path));
    }
    // Per-id tables so the per-token calls the detokenizer makes are lookups.
    tokenizer->token_bytes_.resize(n);
    tokenizer->is_control_.resize(n);
    for (int id = 0; id < n; ++id) {
      const std::string& piece = tokenizer->model_->IdToPiece(id);
      std::string bytes;
      switch (tokenizer->model_->Kind(id)) {
        case spm_bridge::PieceKind::kControl:
          tokenizer->is_control_[id] = true;
          break;
        case spm_bridge::PieceKind::kByte: {
          const int value = ParseBytePiece(piece);
          if (value < 0) {
            return absl::InvalidArgumentError(
                absl::StrFormat("%s: byte piece %d is \"%s\", not <0xAB>", path, id, piece));
          }
          bytes.assign(1, static_cast<char>(value));
          break;
        }
        case spm_bridge::PieceKind::kUnknown: {
          // Decodes to the model's unk_surface (" ⁇ " by default).
          spm_bridge::Error error = tokenizer->model_->Decode({id}, &bytes);
          if (!error.ok()) return absl::Status(static_cast<absl::StatusCode>(error.code), error.message);
          break;
        }
        case spm_bridge::PieceKind::kNormal:
        case spm_bridge::PieceKind::kUnused:
          bytes = absl::StrReplaceAll(piece, {{kSpaceSymbol, " "}});
          break;
      }
      tokenizer->token_bytes_[id] = std::move(bytes);
    }
    return std::unique_ptr<Tokenizer>(std::move(tokenizer));
  }

  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool add_bos) const override {
    if (!IsValidUtf8(text)) return absl::InvalidArgumentError("text to encode is not valid UTF-8");
    if (add_bos && bos_id() < 0) {
      return absl::FailedPreconditionError("add_bos requested but the tokenizer has no BOS token");
    }
    std::vector<int> pieces;
    const spm_bridge::Error error = model_->Encode(text, &pieces);
    if (!error.ok()) {
      return absl::Status(static_cast<absl::StatusCode>(error.code),
                          absl::StrFormat("SentencePiece encode: %s", error.message));
    }
    std::vector<int32_t> ids;
    ids.reserve(pieces.size() + (add_bos ? 1 : 0));
    if (add_bos) ids.push_back(bos_id());
    ids.insert(ids.end(), pieces.begin(), pieces.end());
    return ids;
  }

  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids) const override {
    std::vector<int> pieces(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      if (!InRange(ids[i])) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "token id %d at position %d is outside the vocabulary [0, %d)", ids[i], i, vocab_size()));
      }
      pieces[i] = ids[i];
    }
    std::string text;
    const spm_bridge::Error error = model_->Decode(pieces, &text);
    if (!error.ok()) {
      return absl::Status(static_cast<absl::StatusCode>(error.code),
                          absl::StrFormat("SentencePiece decode: %s", error.message));
    }
    return text;
  }

  int32_t vocab_size() const override { return static_cast<int32_t>(token_bytes_.size()); }
  int32_t bos_id() const override { return model_->bos_id(); }
  int32_t eos_id() const override { return model_->eos_id(); }

  absl::StatusOr<std::string> IdToPiece(int32_t id) const override {
    if (!InRange(id)) return OutOfRange(id);
    return model_->IdToPiece(id);
  }

  absl::StatusOr<std::string> TokenBytes(int32_t id) const override {
    if (!InRange(id)) return OutOfRange(id);
    return token_bytes_[id];
  }

  bool IsControl(int32_t id) const override { return InRange(id) && is_control_[id]; }

 private:
  explicit SentencePieceTokenizer(std::unique_ptr<spm_bridge::Model> model) : model_(std::move(model)) {}

  bool InRange(int32_t id) const { return id >= 0 && id < vocab_size(); }
  absl::Status OutOfRange(int32_t id) const {
    return absl::InvalidArgumentError(
        absl::StrFormat("token id %d is outside the vocabulary [0, %d)", id, vocab_size()));
  }

  std::unique_ptr<spm_bridge::Model> model_;
  std::vector<std::string> token_bytes_;  // by id: TokenBytes()
  std::vector<bool> is_control_;          // by id
};

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadSentencePieceTokenizer(const std::string& path) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (status.type() == fs::file_type::not_found) {
    return absl::NotFoundError(absl::StrFormat("tokenizer model %s does not exist", path));
  }
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrFormat("cannot stat tokenizer model %s: %s", path, ec.message()));
  }
  if (status.type() != fs::file_type::regular) {
    return absl::InvalidArgumentError(absl::StrFormat("tokenizer model %s is not a regular file", path));
  }
  spm_bridge::Error error;
  std::unique_ptr<spm_bridge::Model> model = spm_bridge::Model::Load(path, &error);
  if (model == nullptr) {
    if (error.code == static_cast<int>(absl::StatusCode::kNotFound)) {
      return absl::NotFoundError(absl::StrFormat("tokenizer model %s: %s", path, error.message));
    }
    // SentencePiece reports an unparsable file as INTERNAL; to the caller it is
    // a bad input file.
    return absl::InvalidArgumentError(
        absl::StrFormat("%s is not a valid SentencePiece model: %s", path, error.message));
  }
  return SentencePieceTokenizer::Create(path, std::move(model));
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& model_dir) {
  std::error_code ec;
  if (!fs::is_directory(model_dir, ec)) {
    return absl::NotFoundError(absl::StrFormat("model folder %s does not exist", model_dir));
  }
  // tokenizer.json wins over tokenizer.model, as in transformers (the fast
  // tokenizer is its default).
  const fs::path json = fs::path(model_dir) / "tokenizer.json";
  if (fs::exists(json, ec)) return LoadHfTokenizer(json.string());
  const fs::path path = fs::path(model_dir) / kTokenizerFileName;
  if (!fs::exists(path, ec)) {
    return absl::NotFoundError(absl::StrFormat(
        "no tokenizer.json or %s in model folder %s; only token ids can be used with this model",
        kTokenizerFileName, model_dir));
  }
  return LoadSentencePieceTokenizer(path.string());
}

}  // namespace chunkattn
