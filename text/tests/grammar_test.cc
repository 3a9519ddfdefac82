// The grammar engine at the byte level: GBNF and regexes against PCRE2 (the
// same random expressions as regex and as GBNF, full matches and viable
// prefixes), recursive grammars against hand-written recognizers, the
// matcher's contract (rollback, completion, shortest completion), the bounds
// against hostile inputs, and the compile cache.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "text/grammar/compile_cache.h"
#include "text/grammar/gbnf.h"
#include "text/grammar/json_schema.h"
#include "text/grammar/matcher.h"
#include "text/grammar/regex.h"
#include "text/utf8.h"

namespace chunkattn::grammar {
namespace {

using ::testing::HasSubstr;

std::shared_ptr<const CompiledGrammar> CompileOrDie(const absl::StatusOr<Grammar>& g) {
  EXPECT_TRUE(g.ok()) << g.status();
  if (!g.ok()) return nullptr;
  auto c = CompiledGrammar::Compile(*g, nullptr);
  EXPECT_TRUE(c.ok()) << c.status() << "\n" << g->ToString();
  return c.ok() ? *c : nullptr;
}

bool FullMatch(const std::shared_ptr<const CompiledGrammar>& c, const std::string& s) {
  GrammarMatcher m(c);
  return m.AcceptBytes(s) && m.IsCompleted();
}

// --- PCRE2 as the reference --------------------------------------------------

class Pcre {
 public:
  explicit Pcre(const std::string& pattern) {
    full_ = Compile(pattern, PCRE2_UTF | PCRE2_ANCHORED | PCRE2_ENDANCHORED);
    // Partial matching refuses ENDANCHORED; \z in the pattern makes a
    // shorter alternative fail so that PCRE2 goes on to the partial ones.
    prefix_ = Compile("(?:" + pattern + ")\\z", PCRE2_UTF | PCRE2_ANCHORED);
    data_ = pcre2_match_data_create(4, nullptr);
  }
  ~Pcre() {
    pcre2_match_data_free(data_);
    pcre2_code_free(full_);
    pcre2_code_free(prefix_);
  }
  bool ok() const { return full_ != nullptr && prefix_ != nullptr; }
  bool Full(const std::string& s) const { return Run(full_, s, 0) >= 0; }
  // Whether `s` can be extended to a full match (or is one).
  bool Viable(const std::string& s) const {
    if (s.empty()) return true;
    const int rc = Run(prefix_, s, PCRE2_PARTIAL_HARD);
    return rc >= 0 || rc == PCRE2_ERROR_PARTIAL;
  }

 private:
  static pcre2_code* Compile(const std::string& pattern, uint32_t options) {
    int err;
    PCRE2_SIZE off;
    return pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options, &err, &off, nullptr);
  }
  int Run(pcre2_code* code, const std::string& s, uint32_t opts) const {
    return pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), 0, opts, data_, nullptr);
  }
  pcre2_code* full_ = nullptr;
  pcre2_code* prefix_ = nullptr;
  pcre2_match_data* data_ = nullptr;
};

// --- Random regular expressions, printed as regex and as GBNF ---------------

const std::vector<std::string>& Pool() {
  static const std::vector<std::string> p = {"a", "b", "c", "\xC3\xA9" /* é */, ".", "-", "1", " ", "\n", "x",
                                             "\xF0\x9F\x98\x80" /* 😀 */};
  return p;
}

uint32_t Cp(const std::string& s) {
  const uint8_t b = static_cast<uint8_t>(s[0]);
  if (b < 0x80) return b;
  int len = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
  uint32_t cp = b & (0x7F >> (len + 1));
  for (int i = 1; i < len; ++i) cp = (cp << 6) | (static_cast<uint8_t>(s[i]) & 0x3F);
  return cp;
}

struct Re {
  enum Kind { kChar, kClass, kSeq, kAlt, kRep } kind = kChar;
  std::string chr;                 // kChar: one UTF-8 character of the pool
  std::string re_class, gbnf_class;  // kClass
  std::vector<CodepointRange> ranges;  // kClass membership (normalized)
  std::vector<Re> kids;
  int min = 0, max = 0;  // kRep; max -1 unbounded
};

Re RandomRe(std::mt19937& rng, int depth) {
  auto pick = [&](int n) { return static_cast<int>(rng() % n); };
  Re r;
  const int k = depth <= 0 ? pick(2) : pick(5);
  if (k == 0) {
    r.kind = Re::kChar;
    r.chr = Pool()[pick(static_cast<int>(Pool().size()))];
  } else if (k == 1) {
    r.kind = Re::kClass;
    struct C {
      const char* re;
      const char* gbnf;
      std::vector<CodepointRange> ranges;
      bool negated;
    };
    static const std::vector<C> classes = {
        {"[a-c]", "[a-c]", {{'a', 'c'}}, false},
        {"[^a]", "[^a]", {{'a', 'a'}}, true},
        {"\\d", "[0-9]", {{'0', '9'}}, false},
        {"\\s", "[\\t-\\r ]", {{'\t', '\r'}, {' ', ' '}}, false},
        {"\\w", "[0-9A-Z_a-z]", {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}}, false},
        {".", "[^\\n]", {{'\n', '\n'}}, true},
        {"[b-d\xC3\xA9]", "[b-d\xC3\xA9]", {{'b', 'd'}, {0xE9, 0xE9}}, false},
        {"[^\\d\\s]", "[^0-9\\t-\\r ]", {{'0', '9'}, {'\t', '\r'}, {' ', ' '}}, true},
        {"[\\x{1F600}-\\x{1F64F}x]", "[\\U0001F600-\\U0001F64Fx]", {{0x1F600, 0x1F64F}, {'x', 'x'}}, false},
    };
    const C& c = classes[pick(static_cast<int>(classes.size()))];
    r.re_class = c.re;
    r.gbnf_class = c.gbnf;
    r.ranges = NormalizeRanges(c.ranges, c.negated);
  } else if (k == 2 || k == 3) {
    r.kind = k == 2 ? Re::kSeq : Re::kAlt;
    const int n = 2 + pick(2);
    for (int i = 0; i < n; ++i) r.kids.push_back(RandomRe(rng, depth - 1));
  } else {
    r.kind = Re::kRep;
    r.kids.push_back(RandomRe(rng, depth - 1));
    static const int forms[][2] = {{0, -1}, {1, -1}, {0, 1}, {2, 2}, {1, 3}, {0, 2}, {2, -1}};
    const auto& f = forms[pick(7)];
    r.min = f[0];
    r.max = f[1];
  }
  return r;
}

std::string RepSuffix(const Re& r) {
  if (r.min == 0 && r.max == -1) return "*";
  if (r.min == 1 && r.max == -1) return "+";
  if (r.min == 0 && r.max == 1) return "?";
  if (r.max == -1) return absl::StrCat("{", r.min, ",}");
  if (r.min == r.max) return absl::StrCat("{", r.min, "}");
  return absl::StrCat("{", r.min, ",", r.max, "}");
}

std::string ToRegex(const Re& r) {
  switch (r.kind) {
    case Re::kChar:
      if (r.chr == ".") return "\\.";
      if (r.chr == "\n") return "\\n";
      return r.chr;
    case Re::kClass: return r.re_class;
    case Re::kSeq: {
      std::string s = "(?:";
      for (const Re& k : r.kids) s += ToRegex(k);
      return s + ")";
    }
    case Re::kAlt: {
      std::string s = "(?:";
      for (size_t i = 0; i < r.kids.size(); ++i) s += (i ? "|" : "") + ToRegex(r.kids[i]);
      return s + ")";
    }
    case Re::kRep: return "(?:" + ToRegex(r.kids[0]) + ")" + RepSuffix(r);
  }
  return "";
}

// GBNF; some subexpressions become rules of their own (`rules` collects them).
std::string ToGbnf(const Re& r, std::mt19937& rng, std::vector<std::string>* rules) {
  std::string s;
  switch (r.kind) {
    case Re::kChar: s = r.chr == "\n" ? "\"\\n\"" : "\"" + r.chr + "\""; break;
    case Re::kClass: s = r.gbnf_class; break;
    case Re::kSeq:
      s = "(";
      for (const Re& k : r.kids) s += " " + ToGbnf(k, rng, rules);
      s += " )";
      break;
    case Re::kAlt:
      s = "(";
      for (size_t i = 0; i < r.kids.size(); ++i) s += (i ? " | " : " ") + ToGbnf(r.kids[i], rng, rules);
      s += " )";
      break;
    case Re::kRep: s = "(" + ToGbnf(r.kids[0], rng, rules) + ")" + RepSuffix(r); break;
  }
  if (rng() % 3 == 0) {
    const std::string name = absl::StrCat("r", rules->size());
    rules->push_back(name + " ::= " + s + "  # extracted\n");
    return name;
  }
  return s;
}

bool InRanges(const std::vector<CodepointRange>& ranges, uint32_t cp) {
  for (const auto& x : ranges) {
    if (cp >= x.lo && cp <= x.hi) return true;
  }
  return false;
}

void Sample(const Re& r, std::mt19937& rng, std::string* out) {
  switch (r.kind) {
    case Re::kChar: *out += r.chr; return;
    case Re::kClass: {
      std::vector<std::string> members;
      for (const std::string& c : Pool()) {
        if (InRanges(r.ranges, Cp(c))) members.push_back(c);
      }
      for (uint32_t cp : {uint32_t{'z'}, uint32_t{'7'}, uint32_t{0x1F64F}}) {
        if (InRanges(r.ranges, cp)) {
          std::string s;
          AppendUtf8(cp, &s);
          members.push_back(s);
        }
      }
      if (!members.empty()) *out += members[rng() % members.size()];
      return;
    }
    case Re::kSeq:
      for (const Re& k : r.kids) Sample(k, rng, out);
      return;
    case Re::kAlt: Sample(r.kids[rng() % r.kids.size()], rng, out); return;
    case Re::kRep: {
      const int hi = r.max < 0 ? r.min + 3 : r.max;
      const int n = r.min + static_cast<int>(rng() % (hi - r.min + 1));
      for (int i = 0; i < n; ++i) Sample(r.kids[0], rng, out);
      return;
    }
  }
}

std::vector<std::string> Chars(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    const uint8_t b = static_cast<uint8_t>(s[i]);
    const size_t len = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 1;
    out.push_back(s.substr(i, len));
    i += len;
  }
  return out;
}

std::vector<std::string> TestStrings(const Re& re, std::mt19937& rng) {
  std::vector<std::string> out;
  for (int i = 0; i < 12; ++i) {
    std::string s;
    Sample(re, rng, &s);
    out.push_back(s);
    // Mutations: insert, delete, replace one character.
    std::vector<std::string> cs = Chars(s);
    const std::string& c = Pool()[rng() % Pool().size()];
    std::vector<std::string> m = cs;
    m.insert(m.begin() + (cs.empty() ? 0 : rng() % (cs.size() + 1)), c);
    out.push_back(absl::StrJoin(m, ""));
    if (!cs.empty()) {
      m = cs;
      m.erase(m.begin() + rng() % cs.size());
      out.push_back(absl::StrJoin(m, ""));
      m = cs;
      m[rng() % cs.size()] = c;
      out.push_back(absl::StrJoin(m, ""));
    }
  }
  for (int i = 0; i < 8; ++i) {
    std::string s;
    const int n = static_cast<int>(rng() % 6);
    for (int k = 0; k < n; ++k) s += Pool()[rng() % Pool().size()];
    out.push_back(s);
  }
  return out;
}

// Checks full matches and every viable prefix (at character boundaries)
// against PCRE2.
void CheckAgainstPcre(const std::shared_ptr<const CompiledGrammar>& c, const Pcre& pcre,
                      const std::vector<std::string>& strings, const std::string& what) {
  for (const std::string& s : strings) {
    ASSERT_EQ(FullMatch(c, s), pcre.Full(s)) << what << " on \"" << s << "\"";
    GrammarMatcher m(c);
    std::string prefix;
    for (const std::string& ch : Chars(s)) {
      prefix += ch;
      const bool ours = m.AcceptBytes(ch);
      ASSERT_EQ(ours, pcre.Viable(prefix)) << what << " prefix \"" << prefix << "\"";
      if (!ours) break;
      // The shortest completion completes.
      GrammarMatcher copy = m;
      const std::string done = copy.ShortestCompletion();
      ASSERT_TRUE(copy.AcceptBytes(done) && copy.IsCompleted()) << what << " completing \"" << prefix << "\"";
      ASSERT_TRUE(pcre.Full(prefix + done)) << what << " completion \"" << prefix + done << "\"";
    }
  }
}

TEST(GrammarRegex, RandomRegexesMatchPcre2) {
  std::mt19937 rng(20250301);
  for (int round = 0; round < 300; ++round) {
    const Re re = RandomRe(rng, 4);
    const std::string pattern = ToRegex(re);
    Pcre pcre(pattern);
    ASSERT_TRUE(pcre.ok()) << pattern;
    auto c = CompileOrDie(RegexToGrammar(pattern));
    ASSERT_NE(c, nullptr) << pattern;
    CheckAgainstPcre(c, pcre, TestStrings(re, rng), "regex " + pattern);
  }
}

TEST(GrammarGbnf, RandomGrammarsMatchPcre2) {
  std::mt19937 rng(77);
  for (int round = 0; round < 300; ++round) {
    const Re re = RandomRe(rng, 4);
    std::vector<std::string> rules;
    const std::string root = ToGbnf(re, rng, &rules);
    std::string text = "# random grammar\nroot ::= " + root + "\n";
    for (const std::string& r : rules) text += r;
    Pcre pcre(ToRegex(re));
    ASSERT_TRUE(pcre.ok());
    auto c = CompileOrDie(ParseGbnf(text));
    ASSERT_NE(c, nullptr) << text;
    CheckAgainstPcre(c, pcre, TestStrings(re, rng), "grammar " + text);
  }
}

TEST(GrammarRegex, Features) {
  struct Case {
    const char* pattern;
    std::vector<const char*> yes, no;
  };
  const std::vector<Case> cases = {
      {"^\\d{3}-\\d{4}$", {"555-1234"}, {"5551234", "555-12345"}},
      {"(?P<y>\\d{4})-(?<m>\\d\\d)", {"2024-01"}, {"2024-1"}},
      {"a{2,}b*?", {"aa", "aaab"}, {"a", "ab"}},
      {"[\\]\\-\\\\]+", {"]-\\"}, {"a"}},
      {"\\u00e9|\\x41|\\u{1F600}", {"\xC3\xA9", "A", "\xF0\x9F\x98\x80"}, {"e"}},
      {"a{,2}", {"a{,2}"}, {"aa"}},  // not a quantifier in PCRE2: literal
      {"[^\"\\\\]*", {"abc", ""}, {"a\"b"}},
  };
  for (const Case& c : cases) {
    auto compiled = CompileOrDie(RegexToGrammar(c.pattern));
    ASSERT_NE(compiled, nullptr) << c.pattern;
    for (const char* s : c.yes) EXPECT_TRUE(FullMatch(compiled, s)) << c.pattern << " " << s;
    for (const char* s : c.no) EXPECT_FALSE(FullMatch(compiled, s)) << c.pattern << " " << s;
  }
}

TEST(GrammarRegex, UnsupportedFeaturesAreNamed) {
  const std::vector<std::pair<const char*, const char*>> cases = {
      {"(a)\\1", "backreferences"},  {"(?=a)a", "lookaround"},       {"(?<!a)b", "lookaround"},
      {"\\bword", "word boundaries"}, {"a^b", "'^' is supported only"}, {"a$b", "'$' is supported only"},
      {"(?i)abc", "inline flags"},   {"a*+", "possessive"},          {"[[:alpha:]]", "POSIX"},
      {"\\p{L}", "property"},        {"(ab", "missing ')'"},          {"ab)", "unbalanced"},
      {"*a", "nothing to repeat"},   {"[b-a]", "out of order"},        {"\\k<x>", "backreferences"},
  };
  for (const auto& [pattern, reason] : cases) {
    auto g = RegexToGrammar(pattern);
    ASSERT_FALSE(g.ok()) << pattern;
    EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument) << pattern;
    EXPECT_THAT(std::string(g.status().message()), HasSubstr(reason)) << pattern;
  }
}

// --- Recursive grammars --------------------------------------------------------

// Balanced () and [] around x's; a prefix is viable when no bracket mismatches.
struct Dyck {
  bool viable = true;
  std::vector<char> stack;
  void Feed(char c) {
    if (!viable) return;
    if (c == '(' || c == '[') {
      stack.push_back(c);
    } else if (c == ')' || c == ']') {
      const char open = c == ')' ? '(' : '[';
      if (stack.empty() || stack.back() != open) viable = false;
      else stack.pop_back();
    } else if (c != 'x') {
      viable = false;
    }
  }
};

TEST(GrammarGbnf, RecursiveGrammarMatchesRecognizer) {
  auto c = CompileOrDie(ParseGbnf(R"G(
      root ::= item*
      item ::= "(" item* ")" | "[" item* "]" | "x"   # nested, to any depth
  )G"));
  ASSERT_NE(c, nullptr);
  std::mt19937 rng(5);
  const char alphabet[] = "()[]x";
  for (int round = 0; round < 2000; ++round) {
    std::string s;
    const int n = static_cast<int>(rng() % 24);
    for (int i = 0; i < n; ++i) s += alphabet[rng() % (round % 3 == 0 ? 5 : 4)];
    GrammarMatcher m(c);
    Dyck ref;
    for (char ch : s) {
      ref.Feed(ch);
      ASSERT_EQ(m.AcceptBytes(std::string(1, ch)), ref.viable) << s;
      if (!ref.viable) break;
      ASSERT_EQ(m.IsCompleted(), ref.stack.empty()) << s;
      ASSERT_EQ(m.ShortestCompletion().size(), ref.stack.size()) << s;
    }
  }
}

TEST(GrammarGbnf, DeepNestingUsesAStack) {
  auto c = CompileOrDie(ParseGbnf("root ::= \"(\" root \")\" | \"x\""));
  ASSERT_NE(c, nullptr);
  GrammarMatcher m(c);
  const int depth = 20000;
  ASSERT_TRUE(m.AcceptBytes(std::string(depth, '(')));
  EXPECT_FALSE(m.IsCompleted());
  EXPECT_EQ(m.ShortestCompletion(), "x" + std::string(depth, ')'));
  ASSERT_TRUE(m.AcceptBytes("x" + std::string(depth - 1, ')')));
  EXPECT_FALSE(m.IsCompleted());
  EXPECT_FALSE(m.AcceptBytes("))"));
  EXPECT_TRUE(m.AcceptBytes(")"));
  EXPECT_TRUE(m.IsCompleted());
  EXPECT_FALSE(m.CanContinue());
}

TEST(GrammarGbnf, LlamaCppJsonGrammar) {
  // llama.cpp's grammars/json.gbnf, as users send it.
  auto c = CompileOrDie(ParseGbnf(R"G(
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws

# Optional space: by convention, applied in this grammar after literal chars when allowed
ws ::= | " " | "\n" [ \t]{0,20}
)G"));
  ASSERT_NE(c, nullptr);
  EXPECT_TRUE(FullMatch(c, R"({"a": [1, 2.5, {"b": null}], "c": "d\"\u00e9"})"));
  EXPECT_FALSE(FullMatch(c, R"({"a": [1, 2.5, {"b": null}], "c": "d\"\u00e9")"));
  EXPECT_FALSE(FullMatch(c, R"({"a" 1})"));
}

TEST(GrammarGbnf, Errors) {
  const std::vector<std::pair<const char*, const char*>> cases = {
      {"a ::= \"x\"", "no rule named 'root'"},
      {"root ::= b", "'b' is used but not defined"},
      {"root ::= \"x\"\nroot ::= \"y\"", "defined twice"},
      {"root ::= \"x", "unterminated string"},
      {"root ::= [a-", "unterminated character class"},
      {"root ::= (\"x\"", "expected ')'"},
      {"root ::= \"x\"{3,1}", "n < m"},
      {"root ::= \"\\q\"", "unknown escape"},
      {"root = \"x\"", "expected '::='"},
      {"root ::= \"x\" @", "unexpected character"},
  };
  for (const auto& [text, reason] : cases) {
    auto g = ParseGbnf(text);
    ASSERT_FALSE(g.ok()) << text;
    EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(g.status().message()), HasSubstr(reason)) << text;
  }
}

TEST(GrammarGbnf, CompileErrors) {
  const std::vector<std::pair<const char*, const char*>> cases = {
      {"root ::= root \"a\" | \"a\"", "left recursion"},
      {"root ::= a\na ::= b \"x\"\nb ::= a? \"y\"", "left recursion"},
      {"root ::= a \"x\"\na ::= \"y\" a", "matches no string"},
      {"root ::= [^\\x00-\\U0010FFFF]", "matches no string"},
  };
  for (const auto& [text, reason] : cases) {
    auto g = ParseGbnf(text);
    ASSERT_TRUE(g.ok()) << g.status();
    auto c = CompiledGrammar::Compile(*g, nullptr);
    ASSERT_FALSE(c.ok()) << text;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(c.status().message()), HasSubstr(reason)) << text;
  }
}

// --- Matcher contract ------------------------------------------------------------

TEST(GrammarMatcher, RollbackRestoresEveryStep) {
  auto c = CompileOrDie(ParseGbnf("root ::= (\"ab\" | \"a\" [c-d]+ | \"(\" root \")\")+"));
  ASSERT_NE(c, nullptr);
  GrammarMatcher m(c);
  const std::vector<std::string> steps = {"(", "(a", "b)", "ac", "d", ")"};
  std::vector<std::string> completions;
  for (const std::string& s : steps) {
    completions.push_back(m.ShortestCompletion());
    ASSERT_TRUE(m.AcceptBytes(s)) << s;
  }
  EXPECT_TRUE(m.IsCompleted());
  EXPECT_FALSE(m.AcceptBytes(")"));  // a failed step changes nothing
  EXPECT_EQ(m.num_steps(), 6);
  for (int i = static_cast<int>(steps.size()) - 1; i >= 0; --i) {
    m.Rollback(1);
    EXPECT_EQ(m.ShortestCompletion(), completions[i]) << i;
  }
  EXPECT_EQ(m.num_steps(), 0);
  m.Rollback(5);  // more than there is: back to the start
  EXPECT_TRUE(m.AcceptBytes("((ab))"));
  EXPECT_TRUE(m.IsCompleted());
}

TEST(GrammarMatcher, ShortestCompletionIsShortest) {
  // Completions that a greedy choice would get wrong.
  auto c = CompileOrDie(ParseGbnf(R"G(
      root ::= "{" ( long | short ) "}"
      long ::= "a" [b-z] [b-z] [b-z]
      short ::= "aaaa" | "ab"
  )G"));
  ASSERT_NE(c, nullptr);
  GrammarMatcher m(c);
  EXPECT_EQ(m.ShortestCompletion(), "{ab}");
  ASSERT_TRUE(m.AcceptBytes("{a"));
  EXPECT_EQ(m.ShortestCompletion(), "b}");
  ASSERT_TRUE(m.AcceptBytes("a"));
  EXPECT_EQ(m.ShortestCompletion(), "aa}");
}

// --- Bounds ------------------------------------------------------------------------

void ExpectInvalid(const absl::Status& s, const std::string& reason) {
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(reason));
}

template <typename T>
absl::Status StatusOf(const absl::StatusOr<T>& s) {
  return s.status();
}

TEST(GrammarBounds, EachBoundIsAnError) {
  Limits small;
  small.max_input_bytes = 100;
  ExpectInvalid(StatusOf(RegexToGrammar(std::string(200, 'a'), small)), "regex too long");
  ExpectInvalid(StatusOf(ParseGbnf("root ::= \"" + std::string(200, 'a') + "\"", small)), "grammar text too large");
  ExpectInvalid(StatusOf(JsonSchemaToGrammar(R"({"type":"string","description":")" + std::string(200, 'a') + "\"}",
                                             {}, small)),
                "json schema too large");
  // Nesting.
  ExpectInvalid(StatusOf(RegexToGrammar(std::string(100, '(') + "a" + std::string(100, ')'))), "nested deeper");
  ExpectInvalid(StatusOf(ParseGbnf("root ::= " + std::string(100, '(') + "\"a\"" + std::string(100, ')'))),
                "nesting deeper");
  std::string deep = "true";
  for (int i = 0; i < 100; ++i) deep = R"({"type":"array","items":)" + deep + "}";
  ExpectInvalid(StatusOf(JsonSchemaToGrammar(deep)), "nested deeper");
  // Repetition counts.
  ExpectInvalid(StatusOf(RegexToGrammar("a{100000}")), "repetition count exceeds");
  ExpectInvalid(StatusOf(ParseGbnf("root ::= \"a\"{100000}")), "repetition count exceeds");
  ExpectInvalid(StatusOf(JsonSchemaToGrammar(R"({"type":"string","maxLength":1000000})")), "'maxLength'");
  ExpectInvalid(StatusOf(JsonSchemaToGrammar(R"({"type":"array","minItems":1000000})")), "'minItems'");
  // Expansion: each count is allowed, their product is not.
  auto expanded = RegexToGrammar("((a{1000}){1000}){1000}");
  ASSERT_TRUE(expanded.ok());
  ExpectInvalid(StatusOf(CompiledGrammar::Compile(*expanded, nullptr)), "automaton too large");
  // Determinization blow-up (the n-th symbol from the end).
  auto blowup = RegexToGrammar("[ab]*a[ab]{20}");
  ASSERT_TRUE(blowup.ok());
  ExpectInvalid(StatusOf(CompiledGrammar::Compile(*blowup, nullptr)), "deterministic states");
  // Schema size.
  std::string wide = R"({"type":"object","properties":{)";
  for (int i = 0; i < 30; ++i) wide += absl::StrCat(i ? "," : "", "\"p", i, "\":{\"type\":\"integer\"}");
  wide += "}}";
  Limits few;
  few.max_schema_nodes = 10;
  ExpectInvalid(StatusOf(JsonSchemaToGrammar(wide, {}, few)), "schema too large");
  // Grammar size.
  Limits tiny;
  tiny.max_rules = 3;
  ExpectInvalid(StatusOf(ParseGbnf("root ::= a b c d\na ::= \"a\"\nb ::= \"b\"\nc ::= \"c\"\nd ::= \"d\"", tiny)),
                "rules");
  tiny = Limits();
  tiny.max_exprs = 50;
  ExpectInvalid(StatusOf(JsonSchemaToGrammar(wide, {}, tiny)), "expressions");
  // Compile work (token-trie steps) is checked in grammar_mask_test.
}

TEST(GrammarBounds, UnsupportedSchemaKeywordsAreNamed) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"type":"number","multipleOf":3})", "'multipleOf'"},
      {R"({"type":"object","minProperties":1})", "'minProperties'"},
      {R"({"type":"object","maxProperties":1})", "'maxProperties'"},
      {R"({"type":"object","patternProperties":{"^a":{}}})", "'patternProperties'"},
      {R"({"type":"object","propertyNames":{"pattern":"a"}})", "'propertyNames'"},
      {R"({"not":{"type":"string"}})", "'not'"},
      {R"({"if":{"type":"string"},"then":{}})", "'if'"},
      {R"({"type":"array","contains":{"type":"string"}})", "'contains'"},
      {R"({"type":"array","uniqueItems":true})", "'uniqueItems'"},
      {R"({"type":"object","dependentRequired":{"a":["b"]}})", "'dependentRequired'"},
      {R"({"type":"object","unevaluatedProperties":false})", "'unevaluatedProperties'"},
      {R"({"type":"string","format":"uri"})", "format 'uri'"},
      {R"({"type":"number","exclusiveMinimum":0})", "'exclusiveMinimum'"},
      {R"({"type":"number","minimum":0.5})", "'minimum'"},
      {R"({"allOf":[{"type":"string"},{"minLength":1}]})", "'allOf'"},
      {R"({"$ref":"http://example.com/schema"})", "not local"},
      {R"({"$ref":"#/$defs/missing"})", "does not resolve"},
      {R"({"type":"object","properties":{"a":{"type":"integer","foo":1}}})", "'foo'"},
      {R"({"type":"strin"})", "unknown type 'strin'"},
      {R"({"type":"string","pattern":"(a)\\1"})", "backreferences"},
      {R"({"type":"object","properties":{},"required":["x"]})", "'x'"},
      {"{\"type\":", "not valid JSON"},
  };
  for (const auto& [schema, reason] : cases) {
    auto g = JsonSchemaToGrammar(schema);
    ASSERT_FALSE(g.ok()) << schema;
    ExpectInvalid(g.status(), reason);
  }
  // Unsatisfiable: an anyOf branch may be; the whole schema may not.
  auto empty = JsonSchemaToGrammar(R"({"type":"integer","minimum":5,"maximum":1})");
  ASSERT_TRUE(empty.ok());
  ExpectInvalid(StatusOf(CompiledGrammar::Compile(*empty, nullptr)), "matches no string");
  // Annotations are not errors.
  EXPECT_TRUE(JsonSchemaToGrammar(R"({"$schema":"https://json-schema.org/draft/2020-12/schema","$id":"x",
      "title":"t","description":"d","default":1,"examples":[1],"$comment":"c","type":"integer"})")
                  .ok());
}

// --- Compile cache ---------------------------------------------------------------------

TEST(GrammarCache, HitsEvictsAndCachesErrors) {
  auto vocab = Vocabulary::FromTokens({"a", "b", "{", "}", "\"", "ab", "</s>"}, {false, false, false, false, false, false, true},
                                      {6});
  ASSERT_TRUE(vocab.ok()) << vocab.status();
  CompileCache::Options options;
  options.max_entries = 2;
  CompileCache cache(options);
  const Constraint re1{ConstraintKind::kRegex, "a+b"};
  auto x = cache.Get(*vocab, re1);
  ASSERT_TRUE(x.ok()) << x.status();
  auto y = cache.Get(*vocab, re1);
  ASSERT_TRUE(y.ok());
  EXPECT_EQ(x->get(), y->get());
  EXPECT_EQ(cache.hits(), 1);
  // The same text as another kind is another entry.
  auto z = cache.Get(*vocab, Constraint{ConstraintKind::kGrammar, "a+b"});
  EXPECT_FALSE(z.ok());
  auto z2 = cache.Get(*vocab, Constraint{ConstraintKind::kGrammar, "a+b"});
  EXPECT_FALSE(z2.ok());
  EXPECT_EQ(cache.hits(), 2);  // the error was cached
  EXPECT_EQ(cache.size(), 2u);
  ASSERT_TRUE(cache.Get(*vocab, Constraint{ConstraintKind::kChoice, R"(["a","b"])"}).ok());
  EXPECT_EQ(cache.size(), 2u);  // bounded: the least recent went
  auto again = cache.Get(*vocab, re1);
  ASSERT_TRUE(again.ok());
  EXPECT_NE(again->get(), x->get());  // recompiled after eviction
  // Concurrent gets of one key agree.
  std::vector<std::shared_ptr<const CompiledGrammar>> got(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] { got[t] = *cache.Get(*vocab, Constraint{ConstraintKind::kJsonObject, ""}); });
  }
  for (auto& t : threads) t.join();
  for (int t = 1; t < 4; ++t) EXPECT_EQ(got[t].get(), got[0].get());
  // Scopes (tenants) never share an entry, even with names that run into
  // the rest of the key.
  const int64_t hits = cache.hits();
  auto a = cache.Get(*vocab, re1, "t:a");
  auto b = cache.Get(*vocab, re1, "t:b");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->get(), b->get());
  EXPECT_EQ(cache.hits(), hits);
  EXPECT_EQ(cache.Get(*vocab, re1, "t:a")->get(), a->get());
  EXPECT_EQ(cache.hits(), hits + 1);
}

}  // namespace
}  // namespace chunkattn::grammar
