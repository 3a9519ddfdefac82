// chunkattn-hf-encode --tokenizer tokenizer.json [--add_special_tokens]:
// reads JSON lines {"text": ...} on stdin and writes {"ids": [...],
// "decoded": ...} per line, the format of tests/text/hf_reference/encode.mjs,
// so the two can be compared line by line; prints encode MB/s to stderr.
// --check_streaming also streams each line's ids through the
// IncrementalDetokenizer (the first third as the prompt) and adds
// "stream_error" to the line where its contract breaks: a piece that is not
// valid UTF-8, or pieces that do not add up to Decode(all) after
// Decode(prompt).
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "nlohmann/json.hpp"
#include "text/detokenizer.h"
#include "text/hf_tokenizer.h"
#include "text/utf8.h"

ABSL_FLAG(std::string, tokenizer, "", "tokenizer.json");
ABSL_FLAG(bool, add_special_tokens, false, "apply the post-processor's special tokens");
ABSL_FLAG(bool, check_streaming, false, "check the streaming detokenizer on every line");

namespace {

// "" when streaming `ids` after a prompt of about their first third gives
// exactly the rest of the decoded text, in valid UTF-8 pieces; else what went
// wrong. The prompt ends where a real one does: on a whole character (a split
// inside one, which Encode never makes, moves left to the character's start).
std::string CheckStreaming(const chunkattn::Tokenizer& t, const std::vector<int32_t>& ids) {
  auto whole = t.Decode(ids);
  if (!whole.ok()) return "Decode failed";
  size_t split = ids.size() / 3;
  size_t head_size = 0;  // Decode(prompt)'s length: a prefix of the whole decode
  for (; split > 0; --split) {
    auto head = t.Decode(absl::MakeConstSpan(ids.data(), split));
    if (head.ok() && whole->compare(0, head->size(), *head) == 0) {
      head_size = head->size();
      break;
    }
  }
  const absl::Span<const int32_t> prompt(ids.data(), split);
  chunkattn::IncrementalDetokenizer detok(&t, prompt);
  std::string streamed;
  for (size_t i = split; i < ids.size(); ++i) {
    auto piece = detok.Append(ids[i]);
    if (!piece.ok()) return "Append: " + piece.status().ToString();
    if (!chunkattn::IsValidUtf8(*piece)) return "a piece is not valid UTF-8";
    streamed += *piece;
  }
  auto rest = detok.Flush();
  if (!rest.ok()) return "Flush: " + rest.status().ToString();
  streamed += *rest;
  const std::string want = whole->substr(head_size);
  if (want != streamed) {
    return "the streamed pieces differ from Decode(all) after the prompt (" + std::to_string(split) +
           " prompt tokens): streamed \"" + streamed.substr(0, 120) + "\", want \"" + want.substr(0, 120) + "\"";
  }
  return "";
}

}  // namespace

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
      if (absl::GetFlag(FLAGS_check_streaming)) {
        const std::string error = CheckStreaming(**tokenizer, *ids);
        if (!error.empty()) out["stream_error"] = error;
      }
    }
    std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
  }
  std::fprintf(stderr, "encode: %.1f MB in %.3f s = %.2f MB/s\n", bytes / 1e6, seconds,
               seconds > 0 ? bytes / 1e6 / seconds : 0.0);
  return 0;
}
