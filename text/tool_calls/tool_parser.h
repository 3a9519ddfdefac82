// Tool calls in a model's generated text, turned into OpenAI chat-completions
// tool calls: one-shot (ParseToolCalls) and streamed (StreamingToolParser).
// Reasoning (<think>...</think>) is split off first, by ReasoningParser in
// text/tool_calls/reasoning_parser.h; its content is what these parse.
//
// Formats, as the models emit them:
//  - hermes (Qwen2.5, Qwen3, Hermes 2/3): any text, then blocks
//      <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>
//  - llama3_json (Llama 3.1+ with JSON tools): the whole output, after
//    optional whitespace and an optional <|python_tag|>, is
//      {"name": "f", "parameters": {...}}          ("arguments" accepted too)
//    or several such objects separated by ';'. Any other output is content.
//  - deepseek_v3: content, then
//      <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f
//      ```json\n{...}\n```<｜tool▁call▁end｜> ... <｜tool▁calls▁end｜>
//    (｜ is U+FF5C, ▁ is U+2581, as in DeepSeek V3's tokenizer).
//  - deepseek_v31 (DeepSeek V3.1): the same section, but each call is the
//    name, the separator and the bare arguments object:
//      <｜tool▁call▁begin｜>f<｜tool▁sep｜>{...}<｜tool▁call▁end｜>
//
// Contract (all formats):
//  - Arguments are the JSON object re-serialized compactly by nlohmann with
//    the keys in the order written: {"a": 1} -> {"a":1}. A block that is not
//    exactly a call (JSON that does not parse, no string "name", arguments
//    that are not an object, no closing tag) is not a call: its text stays in
//    content. No text is lost except the markers of real calls and
//    whitespace-only runs of content next to a call (the newlines between
//    blocks; the "\n\n" between </think> and the first block).
//    Equivalently: when at least one call is found, each maximal run of
//    non-call text that is only whitespace (" \t\r\n") is dropped; other runs
//    are kept verbatim. With no call, content is the text verbatim.
//  - Streaming equals one-shot: for any split of a text into Feed() deltas,
//    the content deltas concatenate to ParseToolCalls().content, and the calls
//    assembled from the tool deltas equal ParseToolCalls().calls (ids too,
//    given IdSources that return the same sequence).
//  - A streamed delta is never retracted, so text that may still become part
//    of a call (a trailing "<tool", a whole block until its closing tag, or
//    for llama3_json an output that starts with '{') is held back until it is
//    decided. An incomplete UTF-8 character at the end of the input is held
//    back too, so content deltas of well-formed text are well-formed.
//
// Thread-compatible: a StreamingToolParser (and an IdSource) is used by one
// thread at a time; the free functions are thread-safe.
#ifndef CHUNKATTN_TEXT_TOOL_CALLS_TOOL_PARSER_H_
#define CHUNKATTN_TEXT_TOOL_CALLS_TOOL_PARSER_H_

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace chunkattn::tools {

enum class ToolCallFormat { kNone, kHermes, kLlama3Json, kDeepSeekV3, kDeepSeekV31 };

// "none", "hermes", "llama3_json", "deepseek_v3", "deepseek_v31" (vLLM's
// --tool-call-parser names).
const char* ToolCallFormatName(ToolCallFormat format);

// The inverse of ToolCallFormatName; INVALID_ARGUMENT for any other name.
absl::StatusOr<ToolCallFormat> ParseToolCallFormat(std::string_view name);

// The format a model emits, read off its Jinja chat template: the template
// mentions the markers it asks the model to write (<tool_call>,
// <｜tool▁calls▁begin｜>, Llama 3.1's <|python_tag|> or its
// "parameters" JSON instruction). A DeepSeek template is V3.1's when it
// renders past calls with the arguments right after <｜tool▁sep｜> (V3
// writes the name there). kNone when nothing matches.
ToolCallFormat DetectToolCallFormat(std::string_view chat_template);

// Makes tool call ids. The default is "call_" + 24 characters [A-Za-z0-9]
// from a std::mt19937_64, so a fixed seed gives a fixed sequence (tests);
// override Next() for another scheme. Thread-compatible.
class IdSource {
 public:
  IdSource();  // seeded from std::random_device
  explicit IdSource(uint64_t seed);
  virtual ~IdSource() = default;

  virtual std::string Next();

 private:
  std::mt19937_64 rng_;
};

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // a compact JSON object

  friend bool operator==(const ToolCall& a, const ToolCall& b) {
    return a.id == b.id && a.name == b.name && a.arguments == b.arguments;
  }
};

struct ParsedOutput {
  std::string content;
  std::vector<ToolCall> calls;
};

// The calls in `text` (the whole generated output) and the content around
// them. kNone returns `text` as content. Draws one id from `ids` per call, in
// order. REQUIRES: ids != nullptr.
ParsedOutput ParseToolCalls(ToolCallFormat format, std::string_view text, IdSource* ids);

// One streamed piece: content (index == -1), or a piece of call `index`. A
// call's first delta carries its id and name (and here always its whole
// arguments, since a call is known to be one only once its closing marker
// arrives); later deltas of the same index would carry only argument text.
struct ToolDelta {
  std::string content;
  int index = -1;
  std::string id;
  std::string name;
  std::string arguments;

  bool is_tool_call() const { return index >= 0; }
};

class StreamingToolParser {
 public:
  // `ids` is borrowed and must outlive this parser. REQUIRES: ids != nullptr.
  StreamingToolParser(ToolCallFormat format, IdSource* ids);
  ~StreamingToolParser();
  // A moved-from parser may only be destroyed or assigned to.
  StreamingToolParser(StreamingToolParser&&) noexcept;
  StreamingToolParser& operator=(StreamingToolParser&&) noexcept;

  // Adds the next piece of generated text (any split, even inside a UTF-8
  // character or a marker) and returns what it decides, in order; adjacent
  // content is merged into one delta. Empty after Finish().
  std::vector<ToolDelta> Feed(std::string_view text_delta);

  // Ends the text: everything still held back is decided (an unterminated
  // block is content). Call once; later calls return nothing.
  std::vector<ToolDelta> Finish();

  // Whether any call has been emitted (finish_reason "tool_calls").
  bool saw_tool_call() const;

  // Implementation detail (one subclass per format); public only so the
  // .cc's subclasses can name it.
  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace chunkattn::tools

#endif  // CHUNKATTN_TEXT_TOOL_CALLS_TOOL_PARSER_H_
