// The only translation unit of chunkattn_tokenizer_train that includes
// SentencePiece headers; it must include no Abseil header (see spm_bridge.h).
#include <exception>
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>
#include <unordered_map>

#include "text/spm_bridge.h"

namespace chunkattn::spm_bridge {

Error Train(const std::map<std::string, std::string>& options, unsigned int seed) {
  sentencepiece::SetRandomGeneratorSeed(seed);
  const std::unordered_map<std::string, std::string> kwargs(options.begin(), options.end());
  try {
    const sentencepiece::util::Status status = sentencepiece::SentencePieceTrainer::Train(kwargs);
    if (status.ok()) return {};
    return Error{static_cast<int>(status.code()), status.ToString()};
  } catch (const std::exception& e) {
    return Error{13, e.what()};  // INTERNAL
  }
}

}  // namespace chunkattn::spm_bridge
