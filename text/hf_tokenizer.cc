#include "text/hf_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <queue>
#include <tuple>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "base/file.h"
#include "base/status_macros.h"
#include "nlohmann/json.hpp"
#include "text/utf8.h"

namespace chunkattn {
namespace {

using json = nlohmann::json;

// Unicode White_Space: what \s means in the tokenizers library's regexes
// (Oniguruma) and in Hugging Face's JavaScript port, which emulates it.
bool IsWhiteSpace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}
const char kWhiteSpaceClass[] =
    "\\t\\n\\x{0b}\\f\\r \\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}";

// ---------------------------------------------------------------------------
// GPT-2's byte-level alphabet: each byte is a printable character.

struct ByteAlphabet {
  std::array<std::string, 256> to_char;
  absl::flat_hash_map<char32_t, uint8_t> to_byte;
  ByteAlphabet() {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const char32_t cp = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
      AppendUtf8(cp, &to_char[b]);
      to_byte[cp] = static_cast<uint8_t>(b);
    }
  }
};
const ByteAlphabet& Bytes() {
  static const ByteAlphabet* alphabet = new ByteAlphabet();
  return *alphabet;
}

// ---------------------------------------------------------------------------
// Regexes (PCRE2, UTF + Unicode properties, JIT when available).

class Regex {
 public:
  static absl::StatusOr<std::unique_ptr<Regex>> Compile(const std::string& pattern) {
    // Oniguruma's reading, which PCRE2's differs from in two places: \s is
    // White_Space (PCRE2 lacks U+0085... adds others), and (?i:...) folds
    // ASCII letters only (PCRE2 would fold U+017F to s, U+212A to k).
    std::string p;
    bool in_class = false;
    std::vector<bool> folds;  // per open group: inside (?i:...)
    for (size_t i = 0; i < pattern.size(); ++i) {
      const char c = pattern[i];
      const bool fold = !folds.empty() && folds.back();
      if (!in_class && c == '(') {
        if (pattern.compare(i, 4, "(?i:") == 0) {
          folds.push_back(true);
          p += "(?:";
          i += 3;
        } else {
          folds.push_back(fold);
          p += c;
        }
        continue;
      }
      if (!in_class && c == ')' && !folds.empty()) folds.pop_back();
      if (!in_class && fold && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))) {
        const char lower = static_cast<char>(c | 0x20);
        absl::StrAppend(&p, "[", std::string(1, lower), std::string(1, static_cast<char>(lower - 32)), "]");
        continue;
      }
      if (c == '\\' && i + 1 < pattern.size()) {
        const char n = pattern[i + 1];
        if (n == 's') {
          absl::StrAppend(&p, in_class ? "" : "[", kWhiteSpaceClass, in_class ? "" : "]");
        } else if (n == 'S' && !in_class) {
          absl::StrAppend(&p, "[^", kWhiteSpaceClass, "]");
        } else {
          p += c;
          p += n;
        }
        ++i;
        continue;
      }
      if (c == '[' && !in_class) in_class = true;
      else if (c == ']' && in_class) in_class = false;
      p += c;
    }
    int error = 0;
    PCRE2_SIZE offset = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.data()), p.size(), PCRE2_UTF | PCRE2_UCP,
                                     &error, &offset, nullptr);
    if (code == nullptr) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof(message));
      return absl::InvalidArgumentError(absl::StrFormat("regex %s: %s at offset %d", pattern,
                                                        reinterpret_cast<const char*>(message), offset));
    }
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if unavailable
    return std::unique_ptr<Regex>(new Regex(code));
  }
  ~Regex() { pcre2_code_free(code_); }

  // Non-overlapping matches, left to right, as [begin, end) byte ranges.
  std::vector<std::pair<size_t, size_t>> FindAll(std::string_view s) const {
    std::vector<std::pair<size_t, size_t>> out;
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
    size_t at = 0;
    while (at <= s.size()) {
      const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), at, PCRE2_NO_UTF_CHECK,
                                 md, nullptr);
      if (rc < 0) break;
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      const size_t b = ov[0], e = ov[1];
      if (e > b) out.emplace_back(b, e);
      if (e > at) {
        at = e;
      } else {  // an empty match: step over one character
        if (at >= s.size()) break;
        at += CodePointAt(s, at).second;
      }
    }
    pcre2_match_data_free(md);
    return out;
  }

 private:
  explicit Regex(pcre2_code* code) : code_(code) {}
  pcre2_code* code_;
};

// A pattern: {"String": "..."} or {"Regex": "..."}.
struct Pattern {
  std::string literal;
  std::unique_ptr<Regex> regex;

  std::vector<std::pair<size_t, size_t>> FindAll(std::string_view s) const {
    if (regex != nullptr) return regex->FindAll(s);
    std::vector<std::pair<size_t, size_t>> out;
    if (literal.empty()) return out;
    for (size_t at = s.find(literal); at != std::string_view::npos; at = s.find(literal, at + literal.size())) {
      out.emplace_back(at, at + literal.size());
    }
    return out;
  }
  std::string ReplaceAll(std::string_view s, std::string_view with) const {
    std::string out;
    size_t last = 0;
    for (const auto& [b, e] : FindAll(s)) {
      out.append(s.substr(last, b - last));
      out.append(with);
      last = e;
    }
    out.append(s.substr(last));
    return out;
  }
};

// j[key] for reading: null when j is not an object or lacks the key (a const
// operator[] on a missing key is undefined in nlohmann, and files are hostile).
// Ids beyond this (4x the largest vocabulary shipped) are refused: the id
// table is sized by the largest id.
constexpr int64_t kMaxTokenId = 1 << 20;

// `v` as an integer in [lo, hi]; false for anything else (a float, a string,
// a number out of range: nlohmann's own conversion of those is undefined).
bool IntIn(const json& v, int64_t lo, int64_t hi, int64_t* out) {
  if (v.is_number_unsigned()) {
    if (v.get<uint64_t>() > static_cast<uint64_t>(hi)) return false;
    *out = static_cast<int64_t>(v.get<uint64_t>());
    return *out >= lo;
  }
  if (!v.is_number_integer()) return false;
  *out = v.get<int64_t>();
  return *out >= lo && *out <= hi;
}

const json& Field(const json& j, const std::string& key) {
  static const json kNull;
  if (!j.is_object()) return kNull;
  auto it = j.find(key);
  return it == j.end() ? kNull : *it;
}

absl::StatusOr<Pattern> ParsePattern(const json& j, const std::string& where) {
  Pattern p;
  if (j.is_object() && j.contains("String") && j["String"].is_string()) {
    p.literal = j["String"].get<std::string>();
  } else if (j.is_object() && j.contains("Regex") && j["Regex"].is_string()) {
    ASSIGN_OR_RETURN(p.regex, Regex::Compile(j["Regex"].get<std::string>()));
  } else {
    return absl::InvalidArgumentError(absl::StrCat(where, ".pattern must be {\"String\"} or {\"Regex\"}"));
  }
  return p;
}

// ---------------------------------------------------------------------------
// Normalizers.

using Normalizer = std::function<std::string(std::string)>;

std::string Utf8proc(const std::string& s, bool compat) {
  // By length, not NUL-terminated: a NUL inside the text is text too.
  utf8proc_uint8_t* r = nullptr;
  const auto options = static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE |
                                                      (compat ? UTF8PROC_COMPAT : 0));
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                          static_cast<utf8proc_ssize_t>(s.size()), &r, options);
  if (n < 0) return s;
  std::string out(reinterpret_cast<char*>(r), static_cast<size_t>(n));
  std::free(r);
  return out;
}

absl::StatusOr<Normalizer> ParseNormalizer(const json& j, const std::string& file) {
  if (j.is_null()) return Normalizer();
  const std::string type = j.value("type", "");
  if (type == "NFC" || type == "NFKC") {
    const bool compat = type == "NFKC";
    return Normalizer([compat](std::string s) { return Utf8proc(s, compat); });
  }
  if (type == "Prepend") {
    const std::string prepend = j.value("prepend", "");
    return Normalizer([prepend](std::string s) { return s.empty() ? s : prepend + s; });
  }
  if (type == "Replace") {
    auto pattern = std::make_shared<Pattern>();
    ASSIGN_OR_RETURN(*pattern, ParsePattern(Field(j, "pattern"), "normalizer"));
    const std::string content = j.value("content", "");
    return Normalizer([pattern, content](std::string s) { return pattern->ReplaceAll(s, content); });
  }
  if (type == "Sequence") {
    std::vector<Normalizer> parts;
    for (const json& n : j.value("normalizers", json::array())) {
      ASSIGN_OR_RETURN(Normalizer part, ParseNormalizer(n, file));
      if (part) parts.push_back(std::move(part));
    }
    return Normalizer([parts](std::string s) {
      for (const auto& p : parts) s = p(std::move(s));
      return s;
    });
  }
  return absl::UnimplementedError(absl::StrFormat("%s: normalizer type \"%s\" is not supported", file, type));
}

// ---------------------------------------------------------------------------
// Pre-tokenizers: a list of pieces in, a finer list out. `first` says whether
// a piece begins the input (Metaspace's prepend_scheme "first").

struct Piece {
  std::string text;
  bool first;
};
using PreTokenizer = std::function<void(std::vector<Piece>*)>;

// Metaspace's replacement character and prepend scheme (always, first,
// never; older files say add_prefix_space), as both its pre-tokenizer and its
// decoder read them.
std::pair<std::string, std::string> MetaspaceOptions(const json& j) {
  std::string scheme = j.value("prepend_scheme", "");
  if (scheme.empty()) scheme = j.value("add_prefix_space", true) ? "always" : "never";
  return {j.value("replacement", "\xE2\x96\x81"), scheme};
}

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// Splits every piece at the pattern's matches (`invert`: at what lies between).
void SplitPieces(std::vector<Piece>* pieces, const Pattern& pattern, Behavior behavior, bool invert) {
  std::vector<Piece> out;
  for (Piece& piece : *pieces) {
    const std::string& s = piece.text;
    // The whole string as (range, is_delimiter) spans.
    std::vector<std::tuple<size_t, size_t, bool>> spans;
    size_t last = 0;
    for (const auto& [b, e] : pattern.FindAll(s)) {
      if (b > last) spans.emplace_back(last, b, invert);
      spans.emplace_back(b, e, !invert);
      last = e;
    }
    if (last < s.size()) spans.emplace_back(last, s.size(), invert);
    std::vector<std::pair<size_t, size_t>> parts;
    bool prev_delim = false;
    for (const auto& [b, e, delim] : spans) {
      switch (behavior) {
        case Behavior::kRemoved:
          if (!delim) parts.emplace_back(b, e);
          break;
        case Behavior::kIsolated:
          parts.emplace_back(b, e);
          break;
        case Behavior::kMergedWithPrevious:
          if (delim && !parts.empty() && !prev_delim) {
            parts.back().second = e;
          } else {
            parts.emplace_back(b, e);
          }
          break;
        case Behavior::kMergedWithNext:
          if (!delim && !parts.empty() && prev_delim) {
            parts.back().second = e;
          } else {
            parts.emplace_back(b, e);
          }
          break;
        case Behavior::kContiguous:
          if (delim && prev_delim && !parts.empty()) {
            parts.back().second = e;
          } else {
            parts.emplace_back(b, e);
          }
          break;
      }
      prev_delim = delim;
    }
    for (size_t k = 0; k < parts.size(); ++k) {
      out.push_back({s.substr(parts[k].first, parts[k].second - parts[k].first), piece.first && parts[k].first == 0});
    }
  }
  *pieces = std::move(out);
}

absl::StatusOr<PreTokenizer> ParsePreTokenizer(const json& j, const std::string& file) {
  if (j.is_null()) return PreTokenizer();
  const std::string type = j.value("type", "");
  if (type == "Split") {
    auto pattern = std::make_shared<Pattern>();
    ASSIGN_OR_RETURN(*pattern, ParsePattern(Field(j, "pattern"), "pre_tokenizer"));
    static const std::map<std::string, Behavior> kBehaviors = {{"Removed", Behavior::kRemoved},
                                                               {"Isolated", Behavior::kIsolated},
                                                               {"MergedWithPrevious", Behavior::kMergedWithPrevious},
                                                               {"MergedWithNext", Behavior::kMergedWithNext},
                                                               {"Contiguous", Behavior::kContiguous}};
    auto it = kBehaviors.find(j.value("behavior", ""));
    if (it == kBehaviors.end()) {
      return absl::InvalidArgumentError(absl::StrCat(file, ": unknown Split behavior ", j.value("behavior", "")));
    }
    const Behavior behavior = it->second;
    const bool invert = j.value("invert", false);
    return PreTokenizer(
        [pattern, behavior, invert](std::vector<Piece>* p) { SplitPieces(p, *pattern, behavior, invert); });
  }
  if (type == "ByteLevel") {
    const bool prefix = j.value("add_prefix_space", false);
    std::shared_ptr<Pattern> gpt2;
    if (j.value("use_regex", true)) {
      gpt2 = std::make_shared<Pattern>();
      ASSIGN_OR_RETURN(gpt2->regex,
                       Regex::Compile("'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"));
    }
    return PreTokenizer([prefix, gpt2](std::vector<Piece>* pieces) {
      if (prefix) {
        for (Piece& p : *pieces) {
          if (p.first && !p.text.empty() && p.text[0] != ' ') p.text.insert(0, " ");
        }
      }
      if (gpt2 != nullptr) SplitPieces(pieces, *gpt2, Behavior::kIsolated, false);
      const ByteAlphabet& bytes = Bytes();
      for (Piece& p : *pieces) {
        std::string mapped;
        mapped.reserve(p.text.size() * 2);
        for (unsigned char c : p.text) mapped += bytes.to_char[c];
        p.text = std::move(mapped);
      }
    });
  }
  if (type == "Metaspace") {
    // Named copies, not a structured binding: C++17 lambdas cannot capture those.
    const std::pair<std::string, std::string> options = MetaspaceOptions(j);
    const std::string replacement = options.first, scheme = options.second;
    const bool split = j.value("split", true);
    auto delim = std::make_shared<Pattern>();
    delim->literal = replacement;
    return PreTokenizer([replacement, scheme, split, delim](std::vector<Piece>* pieces) {
      for (Piece& p : *pieces) {
        std::string t;
        for (char c : p.text) {
          if (c == ' ') {
            t += replacement;
          } else {
            t.push_back(c);
          }
        }
        if ((scheme == "always" || (scheme == "first" && p.first)) && t.compare(0, replacement.size(), replacement) != 0) {
          t.insert(0, replacement);
        }
        p.text = std::move(t);
      }
      if (split) SplitPieces(pieces, *delim, Behavior::kMergedWithNext, false);
    });
  }
  if (type == "Digits") {
    auto digits = std::make_shared<Pattern>();
    ASSIGN_OR_RETURN(digits->regex, Regex::Compile(j.value("individual_digits", false) ? "\\p{N}" : "\\p{N}+"));
    return PreTokenizer([digits](std::vector<Piece>* p) { SplitPieces(p, *digits, Behavior::kIsolated, false); });
  }
  if (type == "Sequence") {
    std::vector<PreTokenizer> parts;
    for (const json& n : j.value("pretokenizers", json::array())) {
      ASSIGN_OR_RETURN(PreTokenizer part, ParsePreTokenizer(n, file));
      if (part) parts.push_back(std::move(part));
    }
    return PreTokenizer([parts](std::vector<Piece>* p) {
      for (const auto& part : parts) part(p);
    });
  }
  return absl::UnimplementedError(absl::StrFormat("%s: pre_tokenizer type \"%s\" is not supported", file, type));
}

// ---------------------------------------------------------------------------
// Decoders: a chain over the tokens' strings, as the tokenizers library does.

using Decoder = std::function<void(std::vector<std::string>*)>;

bool ParseByteToken(std::string_view t, uint8_t* byte) {
  if (t.size() != 6 || t.substr(0, 3) != "<0x" || t[5] != '>') return false;
  auto hex = [](char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1; };
  const int hi = hex(t[3]), lo = hex(t[4]);
  if (hi < 0 || lo < 0) return false;
  *byte = static_cast<uint8_t>(hi * 16 + lo);
  return true;
}

// `byte_level` is set when the chain maps characters back to bytes.
absl::StatusOr<Decoder> ParseDecoder(const json& j, const std::string& file, bool* byte_level) {
  if (j.is_null()) return Decoder();
  const std::string type = j.value("type", "");
  if (type == "ByteLevel") {
    *byte_level = true;
    return Decoder([](std::vector<std::string>* tokens) {
      const ByteAlphabet& bytes = Bytes();
      std::string raw;
      for (const std::string& t : *tokens) {
        std::string mapped;
        bool all = true;
        for (size_t i = 0; i < t.size();) {
          const auto [cp, len] = CodePointAt(t, i);
          auto it = bytes.to_byte.find(cp);
          if (it == bytes.to_byte.end()) {
            all = false;
            break;
          }
          mapped.push_back(static_cast<char>(it->second));
          i += len;
        }
        raw += all ? mapped : t;
      }
      *tokens = {ReplaceInvalidUtf8(raw)};
    });
  }
  if (type == "ByteFallback") {
    return Decoder([](std::vector<std::string>* tokens) {
      std::vector<std::string> out;
      std::string run;
      size_t run_tokens = 0;
      auto flush = [&] {
        if (run_tokens == 0) return;
        if (IsValidUtf8(run)) {
          out.push_back(run);
        } else {
          for (size_t k = 0; k < run_tokens; ++k) out.push_back("\xEF\xBF\xBD");
        }
        run.clear();
        run_tokens = 0;
      };
      for (std::string& t : *tokens) {
        uint8_t b;
        if (ParseByteToken(t, &b)) {
          run.push_back(static_cast<char>(b));
          ++run_tokens;
        } else {
          flush();
          out.push_back(std::move(t));
        }
      }
      flush();
      *tokens = std::move(out);
    });
  }
  if (type == "Fuse") {
    return Decoder([](std::vector<std::string>* tokens) {
      std::string all;
      for (const auto& t : *tokens) all += t;
      *tokens = {all};
    });
  }
  if (type == "Strip") {
    const std::string content = j.value("content", " ");
    int64_t start = 0, stop = 0;
    if ((j.contains("start") && !IntIn(j["start"], 0, 1 << 16, &start)) ||
        (j.contains("stop") && !IntIn(j["stop"], 0, 1 << 16, &stop))) {
      return absl::InvalidArgumentError(absl::StrCat(file, ": decoder Strip start/stop must be small integers"));
    }
    return Decoder([content, start, stop](std::vector<std::string>* tokens) {
      for (std::string& t : *tokens) {
        for (int k = 0; k < start && !content.empty() && t.compare(0, content.size(), content) == 0; ++k) {
          t.erase(0, content.size());
        }
        for (int k = 0; k < stop && !content.empty() && t.size() >= content.size() &&
                        t.compare(t.size() - content.size(), content.size(), content) == 0;
             ++k) {
          t.erase(t.size() - content.size());
        }
      }
    });
  }
  if (type == "Replace") {
    auto pattern = std::make_shared<Pattern>();
    ASSIGN_OR_RETURN(*pattern, ParsePattern(Field(j, "pattern"), "decoder"));
    const std::string content = j.value("content", "");
    return Decoder([pattern, content](std::vector<std::string>* tokens) {
      for (std::string& t : *tokens) t = pattern->ReplaceAll(t, content);
    });
  }
  if (type == "Metaspace") {
    // Named copies, not a structured binding: C++17 lambdas cannot capture those.
    const std::pair<std::string, std::string> options = MetaspaceOptions(j);
    const std::string replacement = options.first, scheme = options.second;
    return Decoder([replacement, scheme](std::vector<std::string>* tokens) {
      Pattern p;
      p.literal = replacement;
      for (size_t k = 0; k < tokens->size(); ++k) {
        std::string t = p.ReplaceAll((*tokens)[k], " ");
        if (k == 0 && scheme != "never" && !t.empty() && t[0] == ' ') t.erase(0, 1);
        (*tokens)[k] = std::move(t);
      }
    });
  }
  if (type == "Sequence") {
    std::vector<Decoder> parts;
    for (const json& n : j.value("decoders", json::array())) {
      ASSIGN_OR_RETURN(Decoder part, ParseDecoder(n, file, byte_level));
      if (part) parts.push_back(std::move(part));
    }
    return Decoder([parts](std::vector<std::string>* t) {
      for (const auto& part : parts) part(t);
    });
  }
  return absl::UnimplementedError(absl::StrFormat("%s: decoder type \"%s\" is not supported", file, type));
}

// ---------------------------------------------------------------------------
// The tokenizer.

// Byte trie of the added tokens, for leftmost-longest matching in one pass.
struct Trie {
  struct Node {
    absl::flat_hash_map<unsigned char, int32_t> next;
    int32_t token = -1;  // index into the added tokens
  };
  std::vector<Node> nodes = std::vector<Node>(1);
  void Insert(std::string_view s, int32_t token) {
    int32_t node = 0;
    for (unsigned char c : s) {
      auto it = nodes[node].next.find(c);
      if (it == nodes[node].next.end()) {
        nodes.emplace_back();
        it = nodes[node].next.emplace(c, static_cast<int32_t>(nodes.size()) - 1).first;
      }
      node = it->second;
    }
    nodes[node].token = token;
  }
};

struct AddedToken {
  std::string content;
  int32_t id;
  bool special, lstrip, rstrip, normalized, single_word;
};

class HfTokenizer final : public Tokenizer {
 public:
  static absl::StatusOr<std::unique_ptr<HfTokenizer>> Load(const std::string& path);
  // `text` is the tokenizer.json's content; `path` names it in errors.
  static absl::StatusOr<std::unique_ptr<HfTokenizer>> FromJson(std::string_view text, const std::string& path);

  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool add_bos) const override;
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids) const override;
  int32_t vocab_size() const override { return static_cast<int32_t>(id_to_token_.size()); }
  int32_t bos_id() const override { return bos_; }
  int32_t eos_id() const override { return eos_; }
  absl::StatusOr<std::string> IdToPiece(int32_t id) const override {
    RETURN_IF_ERROR(CheckId(id));
    return id_to_token_[id];
  }
  absl::StatusOr<std::string> TokenBytes(int32_t id) const override;
  bool IsControl(int32_t id) const override {
    return id >= 0 && id < vocab_size() && special_[id];
  }

 private:
  static absl::StatusOr<std::unique_ptr<HfTokenizer>> Parse(json& j, const std::string& path);  // j: operator[] inserts
  absl::Status CheckId(int32_t id) const {
    if (id < 0 || id >= vocab_size()) {
      return absl::InvalidArgumentError(absl::StrFormat("token id %d is outside [0, %d)", id, vocab_size()));
    }
    return absl::OkStatus();
  }
  // Splits `text` at the added tokens of one kind (normalized or not):
  // (text, added id or -1) in order.
  void SplitAdded(const std::string& text, bool normalized, std::vector<std::pair<std::string, int32_t>>* out) const;
  void EncodeWord(const std::string& word, std::vector<int32_t>* ids) const;
  void EncodeText(const std::string& text, bool first, std::vector<int32_t>* ids) const;

  std::string file_;
  absl::flat_hash_map<std::string, int32_t> vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> special_;
  // Merges: (left id, right id) -> (rank, merged id).
  absl::flat_hash_map<uint64_t, std::pair<int32_t, int32_t>> merges_;
  bool byte_fallback_ = false, ignore_merges_ = false, fuse_unk_ = false;
  int32_t unk_ = -1;
  bool byte_level_ = false;  // the decoder maps characters back to bytes
  std::vector<AddedToken> added_;
  Trie raw_trie_, normalized_trie_;  // the added tokens matched before / after normalization
  Normalizer normalizer_;
  PreTokenizer pre_tokenizer_;
  Decoder decoder_;
  std::vector<int32_t> template_before_, template_after_;  // around $A
  int32_t bos_ = -1, eos_ = -1;

  mutable absl::Mutex cache_mu_;
  mutable absl::flat_hash_map<std::string, std::vector<int32_t>> cache_ ABSL_GUARDED_BY(cache_mu_);
};

uint64_t PairKey(int32_t a, int32_t b) { return (uint64_t{static_cast<uint32_t>(a)} << 32) | static_cast<uint32_t>(b); }

absl::StatusOr<std::unique_ptr<HfTokenizer>> HfTokenizer::Load(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return absl::NotFoundError(absl::StrCat(path, " does not exist"));
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  return FromJson(text, path);
}

absl::StatusOr<std::unique_ptr<HfTokenizer>> HfTokenizer::FromJson(std::string_view text, const std::string& path) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return absl::InvalidArgumentError(absl::StrCat(path, " is not JSON"));
  // A field of the wrong JSON type throws from nlohmann's accessors; the file
  // is then not a tokenizer, which is the caller's error, not a crash.
  absl::StatusOr<std::unique_ptr<HfTokenizer>> t;
  try {
    t = Parse(j, path);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": a field has the wrong type (", e.what(), ")"));
  }
  // Every error names the file (a bad regex or pattern is reported by the
  // component that read it).
  if (!t.ok() && t.status().message().find(path) == absl::string_view::npos) {
    return absl::Status(t.status().code(), absl::StrCat(path, ": ", t.status().message()));
  }
  return t;
}

absl::StatusOr<std::unique_ptr<HfTokenizer>> HfTokenizer::Parse(json& j, const std::string& path) {
  auto t = std::unique_ptr<HfTokenizer>(new HfTokenizer());
  t->file_ = path;
  const json& model = Field(j, "model");
  if (!model.is_object()) return absl::InvalidArgumentError(absl::StrCat(path, ": no model"));
  const std::string type = model.value("type", "BPE");
  if (type != "BPE") {
    return absl::UnimplementedError(absl::StrFormat("%s: model type \"%s\" is not supported", path, type));
  }
  if (!Field(model, "vocab").is_object()) return absl::InvalidArgumentError(absl::StrCat(path, ": model.vocab"));
  int32_t max_id = -1;
  for (const auto& [token, id] : Field(model, "vocab").items()) {
    int64_t value;
    if (!IntIn(id, 0, kMaxTokenId, &value)) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": model.vocab[", token, "] is not an id"));
    }
    t->vocab_[token] = static_cast<int32_t>(value);
    max_id = std::max(max_id, static_cast<int32_t>(value));
  }
  for (const json& a : j.value("added_tokens", json::array())) {
    int64_t id = -1;
    if (!IntIn(Field(a, "id"), 0, kMaxTokenId, &id)) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": an added token without a valid id"));
    }
    AddedToken tok{a.value("content", ""), static_cast<int32_t>(id), a.value("special", false),
                   a.value("lstrip", false), a.value("rstrip", false), a.value("normalized", true),
                   a.value("single_word", false)};
    if (tok.content.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": an added token without content"));
    }
    max_id = std::max(max_id, tok.id);
    t->added_.push_back(std::move(tok));
  }
  t->id_to_token_.resize(max_id + 1);
  t->special_.assign(max_id + 1, false);
  for (const auto& [token, id] : t->vocab_) t->id_to_token_[id] = token;
  for (size_t k = 0; k < t->added_.size(); ++k) {
    const AddedToken& a = t->added_[k];
    (a.normalized ? t->normalized_trie_ : t->raw_trie_).Insert(a.content, static_cast<int32_t>(k));
    t->id_to_token_[a.id] = a.content;
    t->special_[a.id] = a.special;
    t->vocab_.emplace(a.content, a.id);
  }
  int32_t rank = 0;
  for (const json& m : model.value("merges", json::array())) {
    std::string left, right;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos) return absl::InvalidArgumentError(absl::StrCat(path, ": merge \"", s, "\""));
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    } else {
      return absl::InvalidArgumentError(absl::StrCat(path, ": model.merges[", rank, "]"));
    }
    auto l = t->vocab_.find(left), r = t->vocab_.find(right), merged = t->vocab_.find(left + right);
    if (l == t->vocab_.end() || r == t->vocab_.end() || merged == t->vocab_.end()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": merge of tokens not in the vocabulary: ", left, " ", right));
    }
    t->merges_.emplace(PairKey(l->second, r->second), std::make_pair(rank++, merged->second));
  }
  t->byte_fallback_ = model.value("byte_fallback", false);
  t->ignore_merges_ = model.value("ignore_merges", false);
  t->fuse_unk_ = model.value("fuse_unk", false);
  if (Field(model, "unk_token").is_string()) {
    auto it = t->vocab_.find(Field(model, "unk_token").get<std::string>());
    if (it != t->vocab_.end()) t->unk_ = it->second;
  }
  if (model.value("continuing_subword_prefix", json()).is_string() &&
      !Field(model, "continuing_subword_prefix").get<std::string>().empty()) {
    return absl::UnimplementedError(absl::StrCat(path, ": BPE continuing_subword_prefix is not supported"));
  }
  ASSIGN_OR_RETURN(t->normalizer_, ParseNormalizer(Field(j, "normalizer"), path));
  ASSIGN_OR_RETURN(t->pre_tokenizer_, ParsePreTokenizer(Field(j, "pre_tokenizer"), path));
  ASSIGN_OR_RETURN(t->decoder_, ParseDecoder(Field(j, "decoder"), path, &t->byte_level_));

  // The post-processor: what add_special_tokens puts around the sequence.
  std::function<absl::Status(const json&)> post = [&](const json& p) -> absl::Status {
    if (p.is_null()) return absl::OkStatus();
    const std::string ptype = p.value("type", "");
    if (ptype == "ByteLevel") return absl::OkStatus();  // offsets only
    if (ptype == "Sequence") {
      for (const json& q : p.value("processors", json::array())) RETURN_IF_ERROR(post(q));
      return absl::OkStatus();
    }
    if (ptype != "TemplateProcessing") {
      return absl::UnimplementedError(absl::StrFormat("%s: post_processor type \"%s\" is not supported", path, ptype));
    }
    bool after = false;
    for (const json& item : p.value("single", json::array())) {
      if (item.contains("Sequence")) {
        after = true;
        continue;
      }
      const std::string name = Field(item, "SpecialToken").value("id", "");
      const json& special = Field(Field(p, "special_tokens"), name);
      if (!special.is_object()) return absl::InvalidArgumentError(absl::StrCat(path, ": template token ", name));
      for (const json& id : special.value("ids", json::array())) {
        int64_t value;
        if (!IntIn(id, 0, static_cast<int64_t>(t->id_to_token_.size()) - 1, &value)) {
          return absl::InvalidArgumentError(absl::StrCat(path, ": template token ", name, " has an id outside the vocabulary"));
        }
        (after ? t->template_after_ : t->template_before_).push_back(static_cast<int32_t>(value));
      }
    }
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(post(Field(j, "post_processor")));
  if (!t->template_before_.empty()) t->bos_ = t->template_before_.front();

  // BOS and EOS as transformers names them, from tokenizer_config.json beside.
  const std::filesystem::path config = std::filesystem::path(path).parent_path() / "tokenizer_config.json";
  if (std::ifstream cin(config); cin) {
    json c = json::parse(cin, nullptr, false);
    auto named = [&](const char* key) -> int32_t {
      if (c.is_discarded() || !c.contains(key)) return -1;
      const json& v = c[key];
      const std::string s = v.is_string() ? v.get<std::string>() : v.is_object() ? v.value("content", "") : "";
      auto it = t->vocab_.find(s);
      return it == t->vocab_.end() ? -1 : it->second;
    };
    if (const int32_t b = named("bos_token"); b >= 0 && t->bos_ < 0) t->bos_ = b;
    t->eos_ = named("eos_token");
  }
  return t;
}

void HfTokenizer::SplitAdded(const std::string& text, bool normalized,
                             std::vector<std::pair<std::string, int32_t>>* out) const {
  // Leftmost-longest, as the tokenizers library's Aho-Corasick matcher.
  auto is_word = [](char32_t c) { return c == '_' || utf8proc_category(c) <= UTF8PROC_CATEGORY_NO; };
  size_t last = 0, i = 0;
  while (i < text.size()) {
    const AddedToken* best = nullptr;
    // Every added token of this kind that starts here, shortest first.
    const Trie& trie = normalized ? normalized_trie_ : raw_trie_;
    std::vector<int32_t> found;
    for (int32_t node = 0, k = static_cast<int32_t>(i); k < static_cast<int32_t>(text.size()); ++k) {
      auto next = trie.nodes[node].next.find(static_cast<unsigned char>(text[k]));
      if (next == trie.nodes[node].next.end()) break;
      node = next->second;
      if (trie.nodes[node].token >= 0) found.push_back(trie.nodes[node].token);
    }
    for (auto f = found.rbegin(); f != found.rend() && best == nullptr; ++f) {
      const AddedToken& a = added_[*f];
      if (a.single_word) {
        const size_t end = i + a.content.size();
        bool before = false, after = false;
        if (i > 0) {
          size_t k = i - 1;
          while (k > 0 && (static_cast<unsigned char>(text[k]) & 0xC0) == 0x80) --k;
          before = is_word(CodePointAt(text, k).first);
        }
        if (end < text.size()) after = is_word(CodePointAt(text, end).first);
        if (before || after) continue;
      }
      best = &a;
    }
    if (best == nullptr) {
      i += CodePointAt(text, i).second;
      continue;
    }
    size_t b = i, e = i + best->content.size();
    if (best->lstrip) {
      while (b > last) {
        size_t k = b - 1;
        while (k > last && (static_cast<unsigned char>(text[k]) & 0xC0) == 0x80) --k;
        if (!IsWhiteSpace(CodePointAt(text, k).first)) break;
        b = k;
      }
    }
    if (best->rstrip) {
      while (e < text.size() && IsWhiteSpace(CodePointAt(text, e).first)) e += CodePointAt(text, e).second;
    }
    if (b > last) out->emplace_back(text.substr(last, b - last), -1);
    out->emplace_back(best->content, best->id);
    last = i = e;
  }
  if (last < text.size()) out->emplace_back(text.substr(last), -1);
}

void HfTokenizer::EncodeWord(const std::string& word, std::vector<int32_t>* ids) const {
  if (ignore_merges_) {
    if (auto it = vocab_.find(word); it != vocab_.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  {
    absl::MutexLock lock(&cache_mu_);
    if (auto it = cache_.find(word); it != cache_.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  // Symbols: one per character (bytes when the vocabulary lacks it).
  std::vector<int32_t> sym;
  bool last_unk = false;
  for (size_t i = 0; i < word.size();) {
    const int len = CodePointAt(word, i).second;
    auto it = vocab_.find(word.substr(i, len));
    if (it != vocab_.end()) {
      sym.push_back(it->second);
      last_unk = false;
    } else {
      bool bytes = byte_fallback_;
      std::vector<int32_t> b;
      for (int k = 0; bytes && k < len; ++k) {
        auto bt = vocab_.find(absl::StrFormat("<0x%02X>", static_cast<unsigned char>(word[i + k])));
        if (bt == vocab_.end()) bytes = false;
        else b.push_back(bt->second);
      }
      if (bytes) {
        sym.insert(sym.end(), b.begin(), b.end());
        last_unk = false;
      } else if (unk_ >= 0) {
        if (!(fuse_unk_ && last_unk)) sym.push_back(unk_);
        last_unk = true;
      }
    }
    i += len;
  }
  // Merge the lowest-ranked adjacent pair, leftmost first, until none is left.
  const int n = static_cast<int>(sym.size());
  std::vector<int> prev(n), next(n);
  for (int k = 0; k < n; ++k) prev[k] = k - 1, next[k] = k + 1 < n ? k + 1 : -1;
  // rank, left position, left id, right id, merged id
  using Candidate = std::tuple<int32_t, int, int32_t, int32_t, int32_t>;
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  auto push = [&](int left) {
    const int right = next[left];
    if (left < 0 || right < 0) return;
    auto it = merges_.find(PairKey(sym[left], sym[right]));
    if (it != merges_.end()) heap.emplace(it->second.first, left, sym[left], sym[right], it->second.second);
  };
  for (int k = 0; k + 1 < n; ++k) push(k);
  std::vector<bool> alive(n, true);
  while (!heap.empty()) {
    const auto [rank, left, lid, rid, merged] = heap.top();
    heap.pop();
    const int right = next[left];
    if (!alive[left] || right < 0 || sym[left] != lid || sym[right] != rid) continue;  // stale
    sym[left] = merged;
    alive[right] = false;
    next[left] = next[right];
    if (next[right] >= 0) prev[next[right]] = left;
    push(left);
    if (prev[left] >= 0) push(prev[left]);
  }
  std::vector<int32_t> result;
  for (int k = n > 0 ? 0 : -1; k >= 0; k = next[k]) result.push_back(sym[k]);
  ids->insert(ids->end(), result.begin(), result.end());
  absl::MutexLock lock(&cache_mu_);
  if (cache_.size() > 200000) cache_.clear();  // bounded: a long tail of words would grow it without end
  cache_.emplace(word, std::move(result));
}

void HfTokenizer::EncodeText(const std::string& text, bool first, std::vector<int32_t>* ids) const {
  std::vector<Piece> pieces = {{text, first}};
  if (pre_tokenizer_) pre_tokenizer_(&pieces);
  for (const Piece& p : pieces) {
    if (!p.text.empty()) EncodeWord(p.text, ids);
  }
}

absl::StatusOr<std::vector<int32_t>> HfTokenizer::Encode(std::string_view text, bool add_bos) const {
  if (!IsValidUtf8(text)) return absl::InvalidArgumentError("text is not well-formed UTF-8");
  std::vector<int32_t> ids;
  if (add_bos) ids = template_before_;
  std::vector<std::pair<std::string, int32_t>> raw;
  SplitAdded(std::string(text), /*normalized=*/false, &raw);
  bool first = true;
  for (auto& [piece, id] : raw) {
    if (id >= 0) {
      ids.push_back(id);
      first = false;
      continue;
    }
    const std::string normalized = normalizer_ ? normalizer_(piece) : piece;
    std::vector<std::pair<std::string, int32_t>> parts;
    SplitAdded(normalized, /*normalized=*/true, &parts);
    for (auto& [part, pid] : parts) {
      if (pid >= 0) {
        ids.push_back(pid);
      } else {
        EncodeText(part, first, &ids);
      }
      first = false;
    }
  }
  if (add_bos) ids.insert(ids.end(), template_after_.begin(), template_after_.end());
  return ids;
}

absl::StatusOr<std::string> HfTokenizer::Decode(absl::Span<const int32_t> ids) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    RETURN_IF_ERROR(CheckId(id));
    if (!special_[id]) tokens.push_back(id_to_token_[id]);
  }
  if (decoder_) decoder_(&tokens);
  std::string out;
  for (const auto& t : tokens) out += t;
  return ReplaceInvalidUtf8(out);
}

absl::StatusOr<std::string> HfTokenizer::TokenBytes(int32_t id) const {
  RETURN_IF_ERROR(CheckId(id));
  if (special_[id]) return std::string();
  const std::string& t = id_to_token_[id];
  uint8_t b;
  if (byte_fallback_ && ParseByteToken(t, &b)) return std::string(1, static_cast<char>(b));
  if (byte_level_) {
    std::string out;
    for (size_t i = 0; i < t.size();) {
      const auto [cp, len] = CodePointAt(t, i);
      auto it = Bytes().to_byte.find(cp);
      if (it == Bytes().to_byte.end()) return t;  // an added token spelled as text
      out.push_back(static_cast<char>(it->second));
      i += len;
    }
    return out;
  }
  Pattern space;
  space.literal = "\xE2\x96\x81";
  return space.ReplaceAll(t, " ");
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadHfTokenizer(const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<HfTokenizer> t, HfTokenizer::Load(path));
  return std::unique_ptr<Tokenizer>(std::move(t));
}

absl::StatusOr<std::unique_ptr<Tokenizer>> ParseHfTokenizer(std::string_view json_text, const std::string& name) {
  ASSIGN_OR_RETURN(std::unique_ptr<HfTokenizer> t, HfTokenizer::FromJson(json_text, name));
  return std::unique_ptr<Tokenizer>(std::move(t));
}

}  // namespace chunkattn
