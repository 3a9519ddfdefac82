// Shared by the tokenizer tests: a tokenizer trained on the demo corpus, and
// temporary folders.
#ifndef CHUNKATTN_TEXT_TESTS_TEST_MODEL_H_
#define CHUNKATTN_TEXT_TESTS_TEST_MODEL_H_

#include <cstdint>
#include <string>

#include "text/tokenizer.h"

namespace chunkattn::tokenizer_test {

constexpr int32_t kDemoVocabSize = 2000;

// `relative` under the repository root.
std::string SourcePath(const std::string& relative);

// The bytes of the file at `path` (empty if it cannot be read).
std::string ReadFile(const std::string& path);

// A new empty folder, removed when the test process exits.
std::string MakeTempDir();

// Path of a kDemoVocabSize-piece model trained (once per process) on
// data/demo/shakespeare.txt with TrainSentencePiece.
const std::string& DemoModelPath();

// DemoModelPath(), loaded once per process. Aborts if training or loading fails.
const Tokenizer& DemoTokenizer();

// The id of the byte-fallback token for `byte` (SentencePiece puts the 256 byte
// pieces right after <unk>, <s>, </s>).
int32_t ByteId(uint8_t byte);

}  // namespace chunkattn::tokenizer_test

#endif  // CHUNKATTN_TEXT_TESTS_TEST_MODEL_H_
