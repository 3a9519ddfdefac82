// chunkattn-hf-encode --tokenizer tokenizer.json [--add_special_tokens]:
// reads JSON lines {"text": ...} on stdin and writes {"ids": [...],
// "decoded": ...} per line, the format of tests/text/hf_reference/encode.mjs,
// so the two can be compared line by line; prints encode MB/s to stderr.
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "nlohmann/json.hpp"
#include "text/hf_tokenizer.h"

ABSL_FLAG(std::string, tokenizer, "", "tokenizer.json");
ABSL_FLAG(bool, add_special_tokens, false, "apply the post-processor's special tokens");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  auto tokenizer = chunkattn::LoadHfTokenizer(absl::GetFlag(FLAGS_tokenizer));
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "error: %s\n", tokenizer.status().ToString().c_str());
    return 2;
  }
  const bool special = absl::GetFlag(FLAGS_add_special_tokens);
  std::string line;
  double seconds = 0;
  size_t bytes = 0;
  while (std::getline(std::cin, line)) {
    const nlohmann::json in = nlohmann::json::parse(line);
    const std::string text = in.at("text").get<std::string>();
    const auto start = std::chrono::steady_clock::now();
    auto ids = (*tokenizer)->Encode(text, special);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    bytes += text.size();
    nlohmann::json out;
    if (!ids.ok()) {
      out["error"] = ids.status().ToString();
    } else {
      out["ids"] = *ids;
      auto decoded = (*tokenizer)->Decode(*ids);
      out["decoded_skip_special"] = decoded.ok() ? *decoded : decoded.status().ToString();
    }
    std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
  }
  std::fprintf(stderr, "encode: %.1f MB in %.3f s = %.2f MB/s\n", bytes / 1e6, seconds,
               seconds > 0 ? bytes / 1e6 / seconds : 0.0);
  return 0;
}
