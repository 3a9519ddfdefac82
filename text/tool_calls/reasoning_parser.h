// Reasoning content (Qwen3, DeepSeek R1, QwQ): the text between <think> and
// </think> is returned as reasoning_content, the rest as content.
//
//  - Only the first <think> ... </think> pair counts; the tags are dropped.
//    Text before <think> is content (vLLM drops it; we never lose text).
//  - starts_in_reasoning: the chat template already wrote <think> into the
//    prompt (Qwen3.5, Qwen3-Thinking-2507, DeepSeek R1-0528), so the output
//    is reasoning up to </think>; a <think> that the model writes anyway at
//    the very start is dropped.
//  - No <think> (and not starts_in_reasoning): everything is content.
//  - No </think> after reasoning started (max_tokens cut it): the rest is
//    reasoning, as vLLM's Qwen3 parser returns with thinking enabled.
//  - Text is otherwise passed on verbatim, as vLLM's Qwen3 and DeepSeek R1
//    parsers do: reasoning keeps the "\n" after <think>, and content keeps
//    the "\n\n" that follows </think> (the tool parsers drop whitespace next
//    to a call; an HTTP layer may strip it from plain answers).
//
// Streaming equals one-shot: for any split of a text into Feed() deltas, the
// concatenated reasoning and content equal Split()'s. A trailing "</thi" or
// an incomplete UTF-8 character is held back until decided.
//
// Thread-compatible: a ReasoningParser is used by one thread at a time.
#ifndef CHUNKATTN_TEXT_TOOL_CALLS_REASONING_PARSER_H_
#define CHUNKATTN_TEXT_TOOL_CALLS_REASONING_PARSER_H_

#include <string>
#include <string_view>

namespace chunkattn::tools {

class ReasoningParser {
 public:
  explicit ReasoningParser(bool starts_in_reasoning = false);

  struct Delta {
    std::string reasoning;
    std::string content;
  };

  // Adds the next piece of generated text; returns what it decides.
  // Empty after Finish().
  Delta Feed(std::string_view text);

  // Ends the text and returns what was held back. Call once.
  Delta Finish();

  // Whether text now goes to reasoning (before </think>, after <think>).
  bool in_reasoning() const;

  // The whole output at once.
  static Delta Split(std::string_view text, bool starts_in_reasoning);

 private:
  enum class State {
    kOpening,    // starts_in_reasoning, before the first bytes are decided
    kBefore,     // content, looking for <think>
    kReasoning,  // looking for </think>
    kAfter,      // content for good
  };

  Delta Run(bool at_end);

  State state_;
  std::string buf_;  // undecided text
  bool finished_ = false;
};

}  // namespace chunkattn::tools

#endif  // CHUNKATTN_TEXT_TOOL_CALLS_REASONING_PARSER_H_
