// Internal to text/: a thin wrapper around the SentencePiece
// library that uses only std types.
//
// Why it exists: SentencePiece 0.1.97's public headers declare
// `namespace absl { using std::string_view; }`, while Debian's Abseil defines
// its own absl::string_view class; a translation unit that includes both does
// not compile. So only spm_bridge.cc and spm_train_bridge.cc include
// SentencePiece headers, and they include no Abseil header. Everything else
// talks to SentencePiece through this file.
#ifndef CHUNKATTN_TEXT_SPM_BRIDGE_H_
#define CHUNKATTN_TEXT_SPM_BRIDGE_H_

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>


namespace chunkattn::spm_bridge {

// An error from SentencePiece. `code` is a gRPC/absl status code number
// (SentencePiece's util::StatusCode uses the same numbering); 0 means OK.
struct Error {
  int code = 0;
  std::string message;
  bool ok() const { return code == 0; }
};

// Kind of one vocabulary entry (user-defined symbols count as kNormal).
enum class PieceKind { kNormal, kControl, kUnknown, kByte, kUnused };

// A loaded tokenizer.model. Immutable after Load(); const methods are safe to
// call concurrently (SentencePieceProcessor's encode/decode paths are const and
// keep no per-call state in the object).
class Model {
 public:
  // Loads a serialized ModelProto from `path`. REQUIRES: `path` names a regular
  // file (SentencePiece throws std::ios_failure on a directory). Never throws.
  //
  // SentencePiece 0.1.97 embeds its own protobuf-lite and exports its
  // symbols, which clash with libprotobuf in the gRPC binaries (libprotobuf's
  // static initializers resolve into SentencePiece's copy and crash). So the
  // implementation lives in a module (libchunkattn_spm.so) loaded with
  // RTLD_LOCAL | RTLD_DEEPBIND: each side keeps its own protobuf. Found at
  // $CHUNKATTN_SPM_MODULE, else next to the executable's ../lib, else the
  // build tree's path.
  static std::unique_ptr<Model> Load(const std::string& path, Error* error);
  virtual ~Model() = default;

  virtual Error Encode(std::string_view text, std::vector<int>* ids) const = 0;
  // REQUIRES: every id in [0, piece_size()).
  virtual Error Decode(const std::vector<int>& ids, std::string* text) const = 0;
  virtual int piece_size() const = 0;
  virtual int bos_id() const = 0;  // -1 when the model has none
  virtual int eos_id() const = 0;  // -1 when the model has none
  // REQUIRES: 0 <= id < piece_size().
  virtual const std::string& IdToPiece(int id) const = 0;
  virtual PieceKind Kind(int id) const = 0;
};

// The module's entry point: a new Model, or null with *error set.
extern "C" Model* chunkattn_spm_bridge_load(const std::string* path, Error* error);

// Runs SentencePieceTrainer::Train with `options` (flag name -> value, as
// spm_train takes them), after fixing the library's global random seed to
// `seed`. Implemented in spm_train_bridge.cc (library chunkattn_tokenizer_train).
Error Train(const std::map<std::string, std::string>& options, unsigned int seed);

}  // namespace chunkattn::spm_bridge

#endif  // CHUNKATTN_TEXT_SPM_BRIDGE_H_
