// The only translation unit of chunkattn_tokenizer that includes SentencePiece
// headers; it must include no Abseil header (see spm_bridge.h).
#include "text/spm_bridge.h"

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

class ModelImpl final : public Model {
 public:
  ModelImpl() : processor_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {}
  Error Encode(std::string_view text, std::vector<int>* ids) const override;
  Error Decode(const std::vector<int>& ids, std::string* text) const override;
  int piece_size() const override;
  int bos_id() const override;
  int eos_id() const override;
  const std::string& IdToPiece(int id) const override;
  PieceKind Kind(int id) const override;

  std::unique_ptr<sentencepiece::SentencePieceProcessor> processor_;
};

extern "C" Model* chunkattn_spm_bridge_load(const std::string* path_ptr, Error* error) {
  const std::string& path = *path_ptr;
  std::unique_ptr<ModelImpl> model(new ModelImpl());
  try {
    *error = FromStatus(model->processor_->Load(path));
  } catch (const std::exception& e) {
    // The library reads with exceptions enabled on its stream; never let one
    // escape into a server.
    *error = Error{kInternal, e.what()};
  }
  if (!error->ok()) return nullptr;
  return model.release();
}

Error ModelImpl::Encode(std::string_view text, std::vector<int>* ids) const {
  try {
    return FromStatus(processor_->Encode(text, ids));
  } catch (const std::exception& e) {
    return Error{kInternal, e.what()};
  }
}

Error ModelImpl::Decode(const std::vector<int>& ids, std::string* text) const {
  try {
    return FromStatus(processor_->Decode(ids, text));
  } catch (const std::exception& e) {
    return Error{kInternal, e.what()};
  }
}

int ModelImpl::piece_size() const { return processor_->GetPieceSize(); }
int ModelImpl::bos_id() const { return processor_->bos_id(); }
int ModelImpl::eos_id() const { return processor_->eos_id(); }
const std::string& ModelImpl::IdToPiece(int id) const { return processor_->IdToPiece(id); }

PieceKind ModelImpl::Kind(int id) const {
  if (processor_->IsControl(id)) return PieceKind::kControl;
  if (processor_->IsUnknown(id)) return PieceKind::kUnknown;
  if (processor_->IsByte(id)) return PieceKind::kByte;
  if (processor_->IsUnused(id)) return PieceKind::kUnused;
  return PieceKind::kNormal;
}

}  // namespace chunkattn::spm_bridge
