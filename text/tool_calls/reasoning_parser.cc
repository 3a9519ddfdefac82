#include "text/tool_calls/reasoning_parser.h"

#include "text/tool_calls/scan_util.h"

namespace chunkattn::tools {
namespace {

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";

}  // namespace

ReasoningParser::ReasoningParser(bool starts_in_reasoning)
    : state_(starts_in_reasoning ? State::kOpening : State::kBefore) {}

bool ReasoningParser::in_reasoning() const {
  return state_ == State::kOpening || state_ == State::kReasoning;
}

ReasoningParser::Delta ReasoningParser::Feed(std::string_view text) {
  if (finished_) return {};
  buf_.append(text);
  return Run(/*at_end=*/false);
}

ReasoningParser::Delta ReasoningParser::Finish() {
  if (finished_) return {};
  Delta d = Run(/*at_end=*/true);
  finished_ = true;
  return d;
}

ReasoningParser::Delta ReasoningParser::Split(std::string_view text, bool starts_in_reasoning) {
  ReasoningParser parser(starts_in_reasoning);
  Delta d = parser.Feed(text);
  Delta rest = parser.Finish();
  d.reasoning += rest.reasoning;
  d.content += rest.content;
  return d;
}

ReasoningParser::Delta ReasoningParser::Run(bool at_end) {
  Delta d;
  // Moves buf_ up to `tag` (or all but an undecided tail) into `out`; true
  // when the tag was found and dropped.
  const auto pass_until = [&](std::string_view tag, std::string* out) {
    const size_t found = buf_.find(tag);
    const size_t n = found != std::string::npos ? found
                     : at_end ? buf_.size()
                              : buf_.size() - internal::UndecidedTailLength(buf_, {tag});
    out->append(buf_, 0, n);
    buf_.erase(0, found != std::string::npos ? n + tag.size() : n);
    return found != std::string::npos;
  };
  for (;;) {
    switch (state_) {
      case State::kOpening: {
        const internal::Prefix m = internal::MatchAt(buf_, 0, kThinkOpen);
        if (internal::MustWait(m, at_end)) return d;
        if (m == internal::Prefix::kMatch) buf_.erase(0, kThinkOpen.size());
        state_ = State::kReasoning;
        break;
      }
      case State::kBefore:
        if (!pass_until(kThinkOpen, &d.content)) return d;
        state_ = State::kReasoning;
        break;
      case State::kReasoning:
        if (!pass_until(kThinkClose, &d.reasoning)) return d;
        state_ = State::kAfter;
        break;
      case State::kAfter: {
        // No tag can follow; hold back only an incomplete character.
        const size_t n = at_end ? buf_.size() : buf_.size() - IncompleteUtf8SuffixLength(buf_);
        d.content.append(buf_, 0, n);
        buf_.erase(0, n);
        return d;
      }
    }
  }
}

}  // namespace chunkattn::tools
