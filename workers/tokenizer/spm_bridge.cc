// The only translation unit of chunkattn_tokenizer that includes SentencePiece
// headers; it must include no Abseil header (see spm_bridge.h).
#include "workers/tokenizer/spm_bridge.h"

#include <exception>
#include <sentencepiece_processor.h>

namespace chunkattn::spm_bridge {
namespace {

Error FromStatus(const sentencepiece::util::Status& status) {
  if (status.ok()) return {};
  return Error{static_cast<int>(status.code()), status.ToString()};
}

constexpr int kInternal = 13;

}  // namespace

Model::Model() : processor_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {}
Model::~Model() = default;

std::unique_ptr<Model> Model::Load(const std::string& path, Error* error) {
  std::unique_ptr<Model> model(new Model());
  try {
    *error = FromStatus(model->processor_->Load(path));
  } catch (const std::exception& e) {
    // The library reads with exceptions enabled on its stream; never let one
    // escape into a server.
    *error = Error{kInternal, e.what()};
  }
  if (!error->ok()) return nullptr;
  return model;
}

Error Model::Encode(std::string_view text, std::vector<int>* ids) const {
  try {
    return FromStatus(processor_->Encode(text, ids));
  } catch (const std::exception& e) {
    return Error{kInternal, e.what()};
  }
}

Error Model::Decode(const std::vector<int>& ids, std::string* text) const {
  try {
    return FromStatus(processor_->Decode(ids, text));
  } catch (const std::exception& e) {
    return Error{kInternal, e.what()};
  }
}

int Model::piece_size() const { return processor_->GetPieceSize(); }
int Model::bos_id() const { return processor_->bos_id(); }
int Model::eos_id() const { return processor_->eos_id(); }
const std::string& Model::IdToPiece(int id) const { return processor_->IdToPiece(id); }

PieceKind Model::Kind(int id) const {
  if (processor_->IsControl(id)) return PieceKind::kControl;
  if (processor_->IsUnknown(id)) return PieceKind::kUnknown;
  if (processor_->IsByte(id)) return PieceKind::kByte;
  if (processor_->IsUnused(id)) return PieceKind::kUnused;
  return PieceKind::kNormal;
}

}  // namespace chunkattn::spm_bridge
