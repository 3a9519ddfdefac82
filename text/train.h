// Trains a SentencePiece tokenizer the way Llama 2's was made, for the demo
// model (which has no downloadable tokenizer): BPE, byte fallback (any text
// encodes without <unk>), digits split into single tokens, no normalization
// and whitespace kept as is (so Decode(Encode(t)) == t), ids unk 0 / bos 1 /
// eos 2 and no pad.
//
// Deterministic: one trainer thread and a fixed seed, so the same corpus and
// vocab_size give the same pieces and scores. The .model file also records
// the corpus path and model_prefix, so it is byte-identical across runs only
// when those are the same too; the .vocab file does not record them.
//
// Takes about 0.2 s for vocab_size 2000 on the ~160 KB demo corpus.
#ifndef CHUNKATTN_TEXT_TRAIN_H_
#define CHUNKATTN_TEXT_TRAIN_H_

#include <string>

#include "absl/status/status.h"

namespace chunkattn {

// Trains on `corpus_path` (UTF-8 text; each line is a sentence) and writes
// `model_prefix`.model (what LoadSentencePieceTokenizer reads; pass
// "<model_dir>/tokenizer" to get the tokenizer.model LoadTokenizer looks for)
// and `model_prefix`.vocab (piece<TAB>score per line, for people).
//
// Errors: NOT_FOUND if the corpus or the output folder does not exist;
// INVALID_ARGUMENT if vocab_size <= 0, the corpus is empty or not a regular
// file, or vocab_size does not fit the corpus (below 259 + the number of
// distinct characters, or above what BPE can merge; the message gives the
// bound).
//
// Not thread-safe with other SentencePiece use in the process: it sets the
// library's global random seed and log level (warnings and errors only).
absl::Status TrainSentencePiece(const std::string& corpus_path, int vocab_size,
                                const std::string& model_prefix);

}  // namespace chunkattn

#endif  // CHUNKATTN_TEXT_TRAIN_H_
