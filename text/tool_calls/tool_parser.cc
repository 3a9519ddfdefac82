#include "text/tool_calls/tool_parser.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "text/tool_calls/json_scanner.h"
#include "text/tool_calls/scan_util.h"

namespace chunkattn::tools {

using internal::JsonObjectScanner;
using internal::kJsonSpace;
using internal::MatchAt;
using internal::MustWait;
using internal::Prefix;
using internal::SkipJsonSpace;

namespace {

using JsonResult = JsonObjectScanner::Result;

constexpr std::string_view kHermesBegin = "<tool_call>";
constexpr std::string_view kHermesEnd = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";
// ｜ is U+FF5C FULLWIDTH VERTICAL LINE and ▁ is U+2581 LOWER ONE EIGHTH
// BLOCK, as DeepSeek V3's and V3.1's special tokens spell them (no plain
// text collides).
constexpr std::string_view kDsCallsBegin = "<｜tool▁calls▁begin｜>";
constexpr std::string_view kDsCallsEnd = "<｜tool▁calls▁end｜>";
constexpr std::string_view kDsCallBegin = "<｜tool▁call▁begin｜>";
constexpr std::string_view kDsCallEnd = "<｜tool▁call▁end｜>";
constexpr std::string_view kDsSep = "<｜tool▁sep｜>";
constexpr std::string_view kDsType = "function";
// A DeepSeek name runs to the end of its line (V3) or to the separator
// (V3.1); past this many bytes without that the block is not a call, rather
// than held back for ever.
constexpr size_t kMaxNameBytes = 256;

struct NamedCall {
  std::string name;
  std::string arguments;
};

// `json` (a complete object) compactly re-serialized with its key order.
std::optional<std::string> CompactObject(std::string_view json) {
  const auto value = nlohmann::ordered_json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (!value.is_object()) return std::nullopt;  // a discarded parse is not an object
  return value.dump();
}

// A {"name": "f", "arguments": {...}} object (Llama writes "parameters");
// missing arguments are {}. Anything else is not a call.
std::optional<NamedCall> CallFromJson(std::string_view json) {
  const auto value = nlohmann::ordered_json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (!value.is_object()) return std::nullopt;
  const auto name = value.find("name");
  if (name == value.end() || !name->is_string() || name->get_ref<const std::string&>().empty()) {
    return std::nullopt;
  }
  auto args = value.find("arguments");
  if (args == value.end()) args = value.find("parameters");
  if (args != value.end() && !args->is_object()) return std::nullopt;
  return NamedCall{name->get<std::string>(), args == value.end() ? "{}" : args->dump()};
}

// Collects the deltas of one Feed() or Finish() and applies the whitespace
// rule of the header: a run of content between calls (or before the first, or
// after the last) that is only whitespace is dropped when it touches a call.
// So the leading whitespace of each run is held until the run shows other
// text (then it goes out) or a call (then it is dropped); at the end of the
// text it goes out only if there was no call at all.
class DeltaOut {
 public:
  explicit DeltaOut(IdSource* ids) : ids_(ids) {}

  void Content(std::string_view text) {
    if (text.empty()) return;
    if (!run_has_text_) {
      if (text.find_first_not_of(kJsonSpace) == std::string_view::npos) {
        held_space_.append(text);
        return;
      }
      run_has_text_ = true;
      Emit(held_space_);
      held_space_.clear();
    }
    Emit(text);
  }

  void Call(NamedCall call) {
    held_space_.clear();
    run_has_text_ = false;
    ToolDelta delta;
    delta.index = num_calls_++;
    delta.id = ids_->Next();
    delta.name = std::move(call.name);
    delta.arguments = std::move(call.arguments);
    out_.push_back(std::move(delta));
  }

  void Finish() {
    if (num_calls_ == 0) Emit(held_space_);
    held_space_.clear();
  }

  std::vector<ToolDelta> Take() { return std::exchange(out_, {}); }
  int num_calls() const { return num_calls_; }

 private:
  void Emit(std::string_view text) {
    if (text.empty()) return;
    if (out_.empty() || out_.back().is_tool_call()) out_.emplace_back();
    out_.back().content.append(text);
  }

  IdSource* ids_;
  std::vector<ToolDelta> out_;
  std::string held_space_;
  bool run_has_text_ = false;
  int num_calls_ = 0;
};

}  // namespace

// The text not yet decided is buf_[pos_, end). Positions held by a subclass
// (scan_, json_) index buf_; buf_ is trimmed only at the points where no
// earlier position can matter again: before a marker and after a call.
class StreamingToolParser::Impl {
 public:
  explicit Impl(IdSource* ids) : out_(ids) {}
  virtual ~Impl() = default;

  std::vector<ToolDelta> Feed(std::string_view text, bool at_end) {
    if (finished_) return {};
    buf_.append(text);
    Run(at_end);
    if (at_end) {
      out_.Finish();
      finished_ = true;
    }
    return out_.Take();
  }

  bool saw_tool_call() const { return out_.num_calls() > 0; }

 protected:
  // Decides all it can of buf_[pos_, end); all of it when at_end.
  virtual void Run(bool at_end) = 0;

  // Emits content from pos_ up to the first of `markers`, and returns true
  // with that marker at buf_[0]. Without one, emits all but an undecided
  // tail (all at the end) and returns false.
  bool ContentUntil(std::initializer_list<std::string_view> markers, bool at_end) {
    const std::string_view rest = std::string_view(buf_).substr(pos_);
    size_t found = std::string_view::npos;
    for (std::string_view m : markers) found = std::min(found, rest.find(m));
    const size_t emit = found != std::string_view::npos ? found
                        : at_end ? rest.size()
                                 : rest.size() - internal::UndecidedTailLength(rest, markers);
    out_.Content(rest.substr(0, emit));
    Consume(pos_ + emit);
    return found != std::string_view::npos;
  }

  // Emits a call that ends at buf_[end].
  void EmitCall(NamedCall call, size_t end) {
    out_.Call(std::move(call));
    Consume(end);
  }

  void Consume(size_t n) {
    buf_.erase(0, n);
    pos_ = scan_ = 0;
  }

  std::string_view Json() const {
    return std::string_view(buf_).substr(json_.begin(), json_.end() - json_.begin());
  }

  std::string buf_;
  size_t pos_ = 0;
  size_t scan_ = 0;  // how far a block has been checked
  JsonObjectScanner json_;
  DeltaOut out_;

 private:
  bool finished_ = false;
};

namespace {

// No tool calls: content only, still whole UTF-8 characters per delta.
class PlainParser final : public StreamingToolParser::Impl {
 public:
  using Impl::Impl;

 private:
  void Run(bool at_end) override { ContentUntil({}, at_end); }
};

class HermesParser final : public StreamingToolParser::Impl {
 public:
  using Impl::Impl;

 private:
  enum class State { kText, kJson, kClose };

  void Run(bool at_end) override {
    for (;;) {
      switch (state_) {
        case State::kText:
          if (!ContentUntil({kHermesBegin}, at_end)) return;
          json_.Reset(kHermesBegin.size());
          state_ = State::kJson;
          break;
        case State::kJson: {
          const JsonResult r = json_.Scan(buf_);
          if (r == JsonResult::kNeedMore && !at_end) return;
          if (r != JsonResult::kComplete) {
            Reject();
            break;
          }
          scan_ = json_.end();
          state_ = State::kClose;
          break;
        }
        case State::kClose: {
          scan_ = SkipJsonSpace(buf_, scan_);
          const Prefix m = MatchAt(buf_, scan_, kHermesEnd);
          if (MustWait(m, at_end)) return;
          std::optional<NamedCall> call;
          if (m == Prefix::kMatch) call = CallFromJson(Json());
          if (!call) {
            Reject();
            break;
          }
          EmitCall(std::move(*call), scan_ + kHermesEnd.size());
          state_ = State::kText;
          break;
        }
      }
    }
  }

  // The block at buf_[0] is not a call: its tag is content, and the text
  // after the tag is read again as text (it may hold the next block).
  void Reject() {
    out_.Content(kHermesBegin);
    pos_ = kHermesBegin.size();
    state_ = State::kText;
  }

  State state_ = State::kText;
};

// The decision "calls or content" is made once, at the start of the output;
// after the calls, anything that is not "; {next call}" ends them and is
// content.
class Llama3JsonParser final : public StreamingToolParser::Impl {
 public:
  using Impl::Impl;

 private:
  enum class State { kStart, kObject, kJson, kAfterCall, kText };

  void Run(bool at_end) override {
    for (;;) {
      switch (state_) {
        case State::kStart: {
          scan_ = SkipJsonSpace(buf_, scan_);
          const Prefix m = MatchAt(buf_, scan_, kPythonTag);
          if (MustWait(m, at_end)) return;
          if (m == Prefix::kMatch) scan_ += kPythonTag.size();
          state_ = State::kObject;
          break;
        }
        case State::kObject:  // at the start, or after a ';'
          scan_ = SkipJsonSpace(buf_, scan_);
          if (scan_ == buf_.size() && !at_end) return;
          if (scan_ < buf_.size() && buf_[scan_] == '{') {
            json_.Reset(scan_);
            state_ = State::kJson;
          } else {
            state_ = State::kText;
          }
          break;
        case State::kJson: {
          const JsonResult r = json_.Scan(buf_);
          if (r == JsonResult::kNeedMore && !at_end) return;
          std::optional<NamedCall> call;
          if (r == JsonResult::kComplete) call = CallFromJson(Json());
          if (!call) {
            state_ = State::kText;
            break;
          }
          EmitCall(std::move(*call), json_.end());
          state_ = State::kAfterCall;
          break;
        }
        case State::kAfterCall:
          scan_ = SkipJsonSpace(buf_, scan_);
          if (scan_ == buf_.size() && !at_end) return;
          if (scan_ < buf_.size() && buf_[scan_] == ';') {
            ++scan_;
            state_ = State::kObject;
          } else {
            state_ = State::kText;
          }
          break;
        case State::kText:  // everything from pos_ on, for good
          ContentUntil({}, at_end);
          return;
      }
    }
  }

  State state_ = State::kStart;
};

// A section <｜tool▁calls▁begin｜> call... <｜tool▁calls▁end｜>. Calls are
// emitted one by one as they complete; the section ends at its end marker or
// at the first thing that is not a call, which is content. A section with no
// call at all is not one: its begin marker is content. The variants differ
// only inside a call:
//   V3:   <｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{...}\n```<｜tool▁call▁end｜>
//   V3.1: <｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>
class DeepSeekParser final : public StreamingToolParser::Impl {
 public:
  enum class Variant { kV3, kV31 };

  DeepSeekParser(IdSource* ids, Variant variant) : Impl(ids), variant_(variant) {}

 private:
  enum class State { kText, kSection, kType, kSep, kName, kFenceOpen, kJson, kFenceClose, kCallEnd };

  void Run(bool at_end) override {
    for (;;) {
      switch (state_) {
        case State::kText:
          if (!ContentUntil({kDsCallsBegin}, at_end)) return;
          scan_ = kDsCallsBegin.size();
          section_calls_ = 0;
          state_ = State::kSection;
          break;
        case State::kSection: {
          scan_ = SkipJsonSpace(buf_, scan_);
          const Prefix call = MatchAt(buf_, scan_, kDsCallBegin);
          const Prefix end = MatchAt(buf_, scan_, kDsCallsEnd);
          if (call == Prefix::kMatch) {
            scan_ += kDsCallBegin.size();
            name_begin_ = scan_;
            state_ = variant_ == Variant::kV3 ? State::kType : State::kName;
          } else if (end == Prefix::kMatch && section_calls_ > 0) {
            Consume(scan_ + kDsCallsEnd.size());
            state_ = State::kText;
          } else if (MustWait(call, at_end) || MustWait(end, at_end)) {
            return;
          } else {
            LeaveSection();
          }
          break;
        }
        case State::kType:
        case State::kSep: {
          const std::string_view literal = state_ == State::kType ? kDsType : kDsSep;
          const Prefix m = MatchAt(buf_, scan_, literal);
          if (MustWait(m, at_end)) return;
          if (m != Prefix::kMatch) {
            LeaveSection();
            break;
          }
          scan_ += literal.size();
          name_begin_ = scan_;
          state_ = state_ == State::kType ? State::kSep : State::kName;
          break;
        }
        case State::kName: {
          // V3's name is the rest of the line, V3.1's runs to the separator;
          // either way a name is one line and holds no marker, so the first
          // '\n' or '<' ends it.
          const size_t stop = buf_.find_first_of("\n<", scan_);
          if (stop == std::string::npos) {
            scan_ = buf_.size();
            if (!at_end && scan_ - name_begin_ <= kMaxNameBytes) return;
            LeaveSection();
            break;
          }
          scan_ = stop;
          const std::string_view terminator = variant_ == Variant::kV3 ? "\n" : kDsSep;
          const Prefix m = MatchAt(buf_, stop, terminator);
          const std::string_view line(buf_.data() + name_begin_, stop - name_begin_);
          const size_t first = line.find_first_not_of(kJsonSpace);
          // The length test repeats the one above so that the decision does
          // not depend on where the text was split.
          const bool bad = first == std::string_view::npos || line.size() > kMaxNameBytes;
          if (!bad && MustWait(m, at_end)) return;
          if (bad || m != Prefix::kMatch) {
            LeaveSection();
            break;
          }
          name_ = std::string(line.substr(first, line.find_last_not_of(kJsonSpace) + 1 - first));
          scan_ = stop + terminator.size();
          if (variant_ == Variant::kV3) {
            state_ = State::kFenceOpen;
          } else {
            json_.Reset(scan_);
            state_ = State::kJson;
          }
          break;
        }
        case State::kFenceOpen: {  // "```json", tolerating a bare "```" or none
          scan_ = SkipJsonSpace(buf_, scan_);
          const Prefix m = MatchAt(buf_, scan_, "```json");
          if (MustWait(m, at_end)) return;
          if (m == Prefix::kMatch) {
            scan_ += 7;
          } else if (MatchAt(buf_, scan_, "```") == Prefix::kMatch) {
            scan_ += 3;
          }
          json_.Reset(scan_);
          state_ = State::kJson;
          break;
        }
        case State::kJson: {
          const JsonResult r = json_.Scan(buf_);
          if (r == JsonResult::kNeedMore && !at_end) return;
          if (r != JsonResult::kComplete) {
            LeaveSection();
            break;
          }
          scan_ = json_.end();
          state_ = variant_ == Variant::kV3 ? State::kFenceClose : State::kCallEnd;
          break;
        }
        case State::kFenceClose: {
          scan_ = SkipJsonSpace(buf_, scan_);
          const Prefix m = MatchAt(buf_, scan_, "```");
          if (MustWait(m, at_end)) return;
          if (m == Prefix::kMatch) scan_ += 3;
          state_ = State::kCallEnd;
          break;
        }
        case State::kCallEnd: {
          scan_ = SkipJsonSpace(buf_, scan_);
          const Prefix m = MatchAt(buf_, scan_, kDsCallEnd);
          if (MustWait(m, at_end)) return;
          std::optional<std::string> args;
          if (m == Prefix::kMatch) args = CompactObject(Json());
          if (!args) {
            LeaveSection();
            break;
          }
          EmitCall({std::move(name_), std::move(*args)}, scan_ + kDsCallEnd.size());
          ++section_calls_;
          state_ = State::kSection;
          break;
        }
      }
    }
  }

  // What follows is not a call. After a call it is content from the end of
  // that call (buf_[0]); with none, the section's begin marker (at buf_[0])
  // is content and the text after it is read again.
  void LeaveSection() {
    if (section_calls_ == 0) {
      out_.Content(kDsCallsBegin);
      pos_ = kDsCallsBegin.size();
    } else {
      pos_ = 0;
    }
    state_ = State::kText;
  }

  const Variant variant_;
  State state_ = State::kText;
  int section_calls_ = 0;
  size_t name_begin_ = 0;
  std::string name_;
};

// Whether a DeepSeek template renders a past call as V3.1 does, name +
// separator + arguments, rather than V3's type + separator + name + fenced
// arguments: what it writes after a separator up to the call's end marker
// names the arguments but neither the name nor a fence.
bool WritesArgumentsAfterSep(std::string_view chat_template) {
  for (size_t sep = chat_template.find(kDsSep); sep != std::string_view::npos;
       sep = chat_template.find(kDsSep, sep + 1)) {
    std::string_view after = chat_template.substr(sep + kDsSep.size());
    after = after.substr(0, after.find(kDsCallEnd));
    const auto has = [&](std::string_view s) { return after.find(s) != std::string_view::npos; };
    if (has("arguments") && !has("name") && !has("```")) return true;
  }
  return false;
}

}  // namespace

const char* ToolCallFormatName(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kNone:
      return "none";
    case ToolCallFormat::kHermes:
      return "hermes";
    case ToolCallFormat::kLlama3Json:
      return "llama3_json";
    case ToolCallFormat::kDeepSeekV3:
      return "deepseek_v3";
    case ToolCallFormat::kDeepSeekV31:
      return "deepseek_v31";
  }
  return "none";
}

absl::StatusOr<ToolCallFormat> ParseToolCallFormat(std::string_view name) {
  for (ToolCallFormat f : {ToolCallFormat::kNone, ToolCallFormat::kHermes, ToolCallFormat::kLlama3Json,
                           ToolCallFormat::kDeepSeekV3, ToolCallFormat::kDeepSeekV31}) {
    if (name == ToolCallFormatName(f)) return f;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown tool call format \"", absl::string_view(name.data(), name.size()),
                   "\" (want none, hermes, llama3_json, deepseek_v3 or deepseek_v31)"));
}

ToolCallFormat DetectToolCallFormat(std::string_view chat_template) {
  const auto has = [&](std::string_view s) {
    return chat_template.find(s) != std::string_view::npos;
  };
  if (has(kDsCallsBegin)) {
    return WritesArgumentsAfterSep(chat_template) ? ToolCallFormat::kDeepSeekV31
                                                  : ToolCallFormat::kDeepSeekV3;
  }
  if (has(kHermesBegin)) return ToolCallFormat::kHermes;
  // Llama 3.1-3.3 name <|python_tag|> (built-in tools) and ask for
  // {"name": ..., "parameters": ...}; 3.2's template lacks the tag.
  const bool llama3 = has("<|eot_id|>") || has("<|start_header_id|>");
  if (has(kPythonTag) || (llama3 && has("\"parameters\""))) return ToolCallFormat::kLlama3Json;
  return ToolCallFormat::kNone;
}

IdSource::IdSource() : rng_(std::random_device{}()) {}
IdSource::IdSource(uint64_t seed) : rng_(seed) {}

std::string IdSource::Next() {
  static constexpr std::string_view kAlphabet =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  std::string id = "call_";
  // The modulo's bias (2^64 mod 62 of 2^64) is far below anything visible.
  for (int i = 0; i < 24; ++i) id.push_back(kAlphabet[rng_() % kAlphabet.size()]);
  return id;
}

StreamingToolParser::StreamingToolParser(ToolCallFormat format, IdSource* ids) {
  switch (format) {
    case ToolCallFormat::kHermes:
      impl_ = std::make_unique<HermesParser>(ids);
      return;
    case ToolCallFormat::kLlama3Json:
      impl_ = std::make_unique<Llama3JsonParser>(ids);
      return;
    case ToolCallFormat::kDeepSeekV3:
      impl_ = std::make_unique<DeepSeekParser>(ids, DeepSeekParser::Variant::kV3);
      return;
    case ToolCallFormat::kDeepSeekV31:
      impl_ = std::make_unique<DeepSeekParser>(ids, DeepSeekParser::Variant::kV31);
      return;
    case ToolCallFormat::kNone:
      break;
  }
  impl_ = std::make_unique<PlainParser>(ids);  // kNone, or a value outside the enum
}

StreamingToolParser::~StreamingToolParser() = default;
StreamingToolParser::StreamingToolParser(StreamingToolParser&&) noexcept = default;
StreamingToolParser& StreamingToolParser::operator=(StreamingToolParser&&) noexcept = default;

std::vector<ToolDelta> StreamingToolParser::Feed(std::string_view text_delta) {
  return impl_->Feed(text_delta, /*at_end=*/false);
}

std::vector<ToolDelta> StreamingToolParser::Finish() { return impl_->Feed({}, /*at_end=*/true); }

bool StreamingToolParser::saw_tool_call() const { return impl_->saw_tool_call(); }

ParsedOutput ParseToolCalls(ToolCallFormat format, std::string_view text, IdSource* ids) {
  // The streaming parser fed everything at once: it decides nothing before
  // it has seen the text it depends on, so this is the same decision.
  StreamingToolParser parser(format, ids);
  std::vector<ToolDelta> deltas = parser.Feed(text);
  for (ToolDelta& d : parser.Finish()) deltas.push_back(std::move(d));
  ParsedOutput out;
  for (ToolDelta& d : deltas) {
    if (!d.is_tool_call()) {
      out.content += d.content;
    } else if (static_cast<size_t>(d.index) == out.calls.size()) {
      out.calls.push_back({std::move(d.id), std::move(d.name), std::move(d.arguments)});
    } else {
      out.calls[d.index].arguments += d.arguments;
    }
  }
  return out;
}

}  // namespace chunkattn::tools
