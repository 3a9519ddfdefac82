#include "text/tool_calls/json_scanner.h"

#include "text/tool_calls/scan_util.h"

namespace chunkattn::tools::internal {

void JsonObjectScanner::Reset(size_t begin) {
  *this = JsonObjectScanner();
  begin_ = pos_ = begin;
}

JsonObjectScanner::Result JsonObjectScanner::Scan(std::string_view text) {
  while (pos_ < text.size() && state_ != State::kDone && state_ != State::kInvalid) {
    if (Step(text[pos_])) ++pos_;
  }
  if (state_ == State::kDone) return Result::kComplete;
  if (state_ == State::kInvalid) return Result::kInvalid;
  return Result::kNeedMore;
}

bool JsonObjectScanner::Fail() {
  state_ = State::kInvalid;
  return false;
}

bool JsonObjectScanner::Open(char c) {
  if (stack_.size() >= kMaxDepth) return Fail();
  stack_.push_back(c);
  state_ = c == '{' ? State::kKeyOrClose : State::kValueOrClose;
  return true;
}

bool JsonObjectScanner::Close() {
  stack_.pop_back();
  state_ = stack_.empty() ? State::kDone : State::kAfterValue;
  return true;
}

bool JsonObjectScanner::StartValue(char c) {
  switch (c) {
    case '{':
    case '[':
      return Open(c);
    case '"':
      in_key_ = false;
      state_ = State::kString;
      return true;
    case '-':
      state_ = State::kNumSign;
      return true;
    case '0':
      state_ = State::kNumZero;
      return true;
    case 't':
      literal_ = "true";
      break;
    case 'f':
      literal_ = "false";
      break;
    case 'n':
      literal_ = "null";
      break;
    default:
      if (c >= '1' && c <= '9') {
        state_ = State::kNumInt;
        return true;
      }
      return Fail();
  }
  literal_pos_ = 1;
  state_ = State::kLiteral;
  return true;
}

bool JsonObjectScanner::Step(char c) {
  const bool digit = c >= '0' && c <= '9';
  switch (state_) {
    case State::kStart:
      if (IsJsonSpace(c)) return true;
      return c == '{' ? Open(c) : Fail();
    case State::kKeyOrClose:
    case State::kKey:
      if (IsJsonSpace(c)) return true;
      if (c == '}' && state_ == State::kKeyOrClose) return Close();
      if (c != '"') return Fail();
      in_key_ = true;
      state_ = State::kString;
      return true;
    case State::kColon:
      if (IsJsonSpace(c)) return true;
      if (c != ':') return Fail();
      state_ = State::kValue;
      return true;
    case State::kValue:
      if (IsJsonSpace(c)) return true;
      return StartValue(c);
    case State::kValueOrClose:
      if (IsJsonSpace(c)) return true;
      if (c == ']') return Close();
      return StartValue(c);
    case State::kAfterValue: {
      if (IsJsonSpace(c)) return true;
      const bool in_object = stack_.back() == '{';
      if (c == ',') {
        state_ = in_object ? State::kKey : State::kValue;
        return true;
      }
      return c == (in_object ? '}' : ']') ? Close() : Fail();
    }
    case State::kString:
      if (c == '"') {
        state_ = in_key_ ? State::kColon : State::kAfterValue;
      } else if (c == '\\') {
        state_ = State::kEscape;
      } else if (static_cast<unsigned char>(c) < 0x20) {
        return Fail();  // control characters must be escaped
      }
      return true;
    case State::kEscape:
      if (c == 'u') {
        hex_left_ = 4;
        state_ = State::kUnicode;
        return true;
      }
      if (std::string_view("\"\\/bfnrt").find(c) == std::string_view::npos) return Fail();
      state_ = State::kString;
      return true;
    case State::kUnicode:
      if (!digit && !((c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'))) return Fail();
      if (--hex_left_ == 0) state_ = State::kString;
      return true;
    case State::kLiteral:
      if (c != literal_[literal_pos_]) return Fail();
      if (++literal_pos_ == literal_.size()) state_ = State::kAfterValue;
      return true;
    case State::kNumSign:
      if (c == '0') {
        state_ = State::kNumZero;
        return true;
      }
      if (!digit) return Fail();
      state_ = State::kNumInt;
      return true;
    case State::kNumZero:
    case State::kNumInt:
    case State::kNumFrac:
      if (digit && state_ != State::kNumZero) return true;
      if (c == '.' && state_ != State::kNumFrac) {
        state_ = State::kNumPoint;
        return true;
      }
      if (c == 'e' || c == 'E') {
        state_ = State::kNumE;
        return true;
      }
      state_ = State::kAfterValue;  // the number ended before c
      return false;
    case State::kNumPoint:
      if (!digit) return Fail();
      state_ = State::kNumFrac;
      return true;
    case State::kNumE:
      if (c == '+' || c == '-') {
        state_ = State::kNumExpSign;
        return true;
      }
      if (!digit) return Fail();
      state_ = State::kNumExp;
      return true;
    case State::kNumExpSign:
      if (!digit) return Fail();
      state_ = State::kNumExp;
      return true;
    case State::kNumExp:
      if (digit) return true;
      state_ = State::kAfterValue;
      return false;
    case State::kDone:
    case State::kInvalid:
      break;
  }
  return false;
}

}  // namespace chunkattn::tools::internal
