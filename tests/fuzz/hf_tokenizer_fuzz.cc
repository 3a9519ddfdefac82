// tokenizer.json from arbitrary bytes (a file from outside): ParseHfTokenizer
// accepts it or refuses it with a status naming the file, never crashes; what
// it accepts encodes a few fixed texts to ids inside its vocabulary, and
// decodes them to valid UTF-8.
#include <cstdint>
#include <string>
#include <string_view>

#include "tests/fuzz/fuzz_util.h"
#include "text/hf_tokenizer.h"
#include "text/utf8.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using chunkattn::fuzz::Fail;
  const std::string_view json(reinterpret_cast<const char*>(data), size);
  auto tokenizer = chunkattn::ParseHfTokenizer(json, "fuzz/tokenizer.json");
  if (!tokenizer.ok()) {
    if (tokenizer.status().message().find("fuzz/tokenizer.json") == std::string_view::npos) {
      Fail("hf_tokenizer_fuzz", "an error that does not name the file");
    }
    return 0;
  }
  const chunkattn::Tokenizer& t = **tokenizer;
  for (const char* text : {"Hello world", "  spaces\tand\nnewlines  ", "é漢字😀 123456", "<s>a</s>b", ""}) {
    for (bool special : {false, true}) {
      auto ids = t.Encode(text, special);
      if (!ids.ok()) continue;  // e.g. no BOS for add_special_tokens
      for (int32_t id : *ids) {
        if (id < 0 || id >= t.vocab_size()) Fail("hf_tokenizer_fuzz", "an id outside the vocabulary");
      }
      auto decoded = t.Decode(*ids);
      if (decoded.ok() && !chunkattn::IsValidUtf8(*decoded)) Fail("hf_tokenizer_fuzz", "decoded invalid UTF-8");
    }
  }
  return 0;
}
