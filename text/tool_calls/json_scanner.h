// Internal to text/tool_calls/: finds where a JSON object ends in text that
// arrives piece by piece, without parsing it into values.
//
// The parsers must know where a call's JSON ends before they look for the
// closing marker (a "</tool_call>" inside a JSON string is not one), and must
// know as early as possible that a block is not JSON (so its text goes out as
// content). Scan() validates RFC 8259 syntax byte by byte and is resumable:
// each byte is examined once however the text is split, so streaming a block
// costs O(its length). Values are left to nlohmann once the object is
// complete (it also checks the UTF-8 and \u escapes inside strings).
//
// Prefix-stable: kNeedMore exactly when the text so far is a proper prefix of
// some object; kInvalid only when no continuation can make one.
#ifndef CHUNKATTN_TEXT_TOOL_CALLS_JSON_SCANNER_H_
#define CHUNKATTN_TEXT_TOOL_CALLS_JSON_SCANNER_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace chunkattn::tools::internal {

class JsonObjectScanner {
 public:
  enum class Result { kNeedMore, kComplete, kInvalid };

  // Deeper nesting is kInvalid: nlohmann's dump() recurses once per level.
  static constexpr size_t kMaxDepth = 128;

  // Starts a scan at text[begin]: optional JSON whitespace, then '{'.
  void Reset(size_t begin);

  // Scans on from where the last call stopped. `text` is the same text as in
  // earlier calls since Reset(), possibly longer.
  Result Scan(std::string_view text);

  // The object, leading whitespace included, is text[begin(), end()) once
  // Scan() returned kComplete.
  size_t begin() const { return begin_; }
  size_t end() const { return pos_; }

 private:
  enum class State : uint8_t {
    kStart,         // whitespace, then '{'
    kKeyOrClose,    // after '{'
    kKey,           // after ',' in an object
    kColon,         // after a key
    kValue,         // after ':' or ',' in an array
    kValueOrClose,  // after '['
    kAfterValue,    // ',' or the innermost container's close
    kString,
    kEscape,        // after a backslash
    kUnicode,       // inside \uXXXX
    kLiteral,       // inside true / false / null
    kNumSign,       // after '-'
    kNumZero,       // a leading 0
    kNumInt,
    kNumPoint,      // after '.'
    kNumFrac,
    kNumE,          // after 'e' / 'E'
    kNumExpSign,
    kNumExp,
    kDone,
    kInvalid,
  };

  // Consumes text byte `c` unless it returns false: a number ended just
  // before `c`, which must be seen again in the new state.
  bool Step(char c);
  bool StartValue(char c);
  bool Open(char c);
  bool Close();
  bool Fail();

  size_t begin_ = 0;
  size_t pos_ = 0;
  State state_ = State::kStart;
  std::string stack_;  // open containers, '{' or '['
  bool in_key_ = false;
  int hex_left_ = 0;
  std::string_view literal_;
  size_t literal_pos_ = 0;
};

}  // namespace chunkattn::tools::internal

#endif  // CHUNKATTN_TEXT_TOOL_CALLS_JSON_SCANNER_H_
