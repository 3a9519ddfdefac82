#include "text/utf8.h"

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "text/tests/test_model.h"

namespace chunkattn {
namespace {

using tokenizer_test::ByteId;
using tokenizer_test::DemoTokenizer;

TEST(Utf8Test, IsValidUtf8FollowsTable3_7) {
  EXPECT_TRUE(IsValidUtf8(""));
  EXPECT_TRUE(IsValidUtf8("plain ASCII\n"));
  EXPECT_TRUE(IsValidUtf8("\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80"));  // é € 😀
  EXPECT_TRUE(IsValidUtf8("\xEF\xBF\xBD"));                          // U+FFFD
  EXPECT_TRUE(IsValidUtf8("\xF4\x8F\xBF\xBF"));                      // U+10FFFF
  EXPECT_TRUE(IsValidUtf8("\xED\x9F\xBF"));                          // U+D7FF
  EXPECT_FALSE(IsValidUtf8("\x80"));                                 // lone continuation
  EXPECT_FALSE(IsValidUtf8("\xC0\xAF"));                             // overlong '/'
  EXPECT_FALSE(IsValidUtf8("\xC1\xBF"));                             // overlong
  EXPECT_FALSE(IsValidUtf8("\xE0\x9F\xBF"));                         // overlong
  EXPECT_FALSE(IsValidUtf8("\xED\xA0\x80"));                         // surrogate D800
  EXPECT_FALSE(IsValidUtf8("\xF0\x8F\xBF\xBF"));                     // overlong
  EXPECT_FALSE(IsValidUtf8("\xF4\x90\x80\x80"));                     // > U+10FFFF
  EXPECT_FALSE(IsValidUtf8("\xF5\x80\x80\x80"));
  EXPECT_FALSE(IsValidUtf8("\xFF"));
  EXPECT_FALSE(IsValidUtf8("\xE2\x82"));                             // truncated
  EXPECT_FALSE(IsValidUtf8("a\xE2\x82" "b"));
}

TEST(Utf8Test, IncompleteSuffixLength) {
  EXPECT_EQ(IncompleteUtf8SuffixLength(""), 0u);
  EXPECT_EQ(IncompleteUtf8SuffixLength("abc"), 0u);
  EXPECT_EQ(IncompleteUtf8SuffixLength("\xE2\x82\xAC"), 0u);
  EXPECT_EQ(IncompleteUtf8SuffixLength("x\xE2"), 1u);
  EXPECT_EQ(IncompleteUtf8SuffixLength("x\xE2\x82"), 2u);
  EXPECT_EQ(IncompleteUtf8SuffixLength("\xF0\x9F\x98"), 3u);
  EXPECT_EQ(IncompleteUtf8SuffixLength("\xC3"), 1u);
  EXPECT_EQ(IncompleteUtf8SuffixLength("\xE0\x80"), 0u);   // can only be overlong
  EXPECT_EQ(IncompleteUtf8SuffixLength("\xED\xA0"), 0u);   // can only be a surrogate
  EXPECT_EQ(IncompleteUtf8SuffixLength("\xF4\x90"), 0u);   // can only exceed U+10FFFF
  EXPECT_EQ(IncompleteUtf8SuffixLength("\xC0"), 0u);
  EXPECT_EQ(IncompleteUtf8SuffixLength("\x80\x80"), 0u);
  EXPECT_EQ(IncompleteUtf8SuffixLength("\xE2\xF0\x9F"), 2u);  // E2 is dead, F0 9F lives
}

// IncompleteUtf8SuffixLength(s) is k > 0 exactly when some continuation makes
// the last k bytes one well-formed character; checked on every 1- and 2-byte
// string and on random 3-byte ones.
TEST(Utf8Test, IncompleteSuffixAgreesWithIsValidUtf8) {
  auto completable = [](const std::string& tail) {
    const uint8_t lead = static_cast<uint8_t>(tail[0]);
    if (lead < 0xC0) return false;
    const size_t len = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : 2;
    if (tail.size() >= len) return false;
    for (int second = 0x80; second <= 0xBF; ++second) {
      std::string candidate = tail;
      while (candidate.size() < len) candidate += static_cast<char>(candidate.size() == 1 ? second : 0x80);
      if (IsValidUtf8(candidate)) return true;
    }
    return false;
  };
  auto expected = [&](const std::string& s) -> size_t {
    for (size_t k = std::min<size_t>(3, s.size()); k >= 1; --k) {
      if (completable(s.substr(s.size() - k))) return k;
    }
    return 0;
  };
  for (int a = 0; a < 256; ++a) {
    const std::string one(1, static_cast<char>(a));
    ASSERT_EQ(IncompleteUtf8SuffixLength(one), expected(one)) << a;
    for (int b = 0; b < 256; ++b) {
      const std::string two = one + static_cast<char>(b);
      ASSERT_EQ(IncompleteUtf8SuffixLength(two), expected(two)) << a << " " << b;
    }
  }
  std::mt19937 rng(3);
  for (int trial = 0; trial < 200000; ++trial) {
    std::string three;
    for (int k = 0; k < 3; ++k) three += static_cast<char>(rng() % 2 ? 0x80 + rng() % 0x80 : rng() % 256);
    ASSERT_EQ(IncompleteUtf8SuffixLength(three), expected(three));
  }
}

TEST(Utf8Test, CommonPrefixDoesNotSplitCharacters) {
  EXPECT_EQ(CommonUtf8PrefixLength("abc", "abd"), 2u);
  EXPECT_EQ(CommonUtf8PrefixLength("", "abc"), 0u);
  EXPECT_EQ(CommonUtf8PrefixLength("abc", "abc"), 3u);
  // "€" and "₂" share their first two bytes.
  EXPECT_EQ(CommonUtf8PrefixLength("a\xE2\x82\xAC", "a\xE2\x82\x82"), 1u);
}

TEST(Utf8Test, ReplaceInvalidUtf8SubstitutesMaximalSubparts) {
  // Unicode's example of maximal subparts (chapter 3, U+FFFD substitution).
  EXPECT_EQ(ReplaceInvalidUtf8("a\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64"),
            "a\uFFFD\uFFFD\uFFFDb\uFFFDc\uFFFD\uFFFDd");
  EXPECT_EQ(ReplaceInvalidUtf8("\xE0\x80\xAF"), "\uFFFD\uFFFD\uFFFD");  // overlong: no subpart
  EXPECT_EQ(ReplaceInvalidUtf8("\xED\xA0\x80"), "\uFFFD\uFFFD\uFFFD");  // surrogate
  EXPECT_EQ(ReplaceInvalidUtf8("\xE2\x82"), "\uFFFD");                   // truncated at the end
  std::mt19937 rng(3);
  for (int trial = 0; trial < 20000; ++trial) {
    std::string bytes(rng() % 8, '\0');
    for (char& c : bytes) c = static_cast<char>(rng() % 4 == 0 ? rng() % 128 : 0x80 + rng() % 128);
    const std::string fixed = ReplaceInvalidUtf8(bytes);
    ASSERT_TRUE(IsValidUtf8(fixed));
    if (IsValidUtf8(bytes)) {
      ASSERT_EQ(fixed, bytes);
    }
  }
}

TEST(Utf8Test, CodePointsRoundTrip) {
  for (char32_t cp = 0; cp <= 0x10FFFF; cp += (cp < 0x10000 ? 1 : 97)) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    std::string s = "x";
    AppendUtf8(cp, &s);
    ASSERT_TRUE(IsValidUtf8(s)) << cp;
    const auto [got, len] = CodePointAt(s, 1);
    ASSERT_EQ(got, cp);
    ASSERT_EQ(len, static_cast<int>(s.size()) - 1);
  }
}

// The detokenizer relies on SentencePiece decoding byte-fallback runs with
// these same rules: well-formed characters kept, every other byte -> U+FFFD.
TEST(Utf8Test, SentencePieceDecodesBytesWithTheSameRules) {
  auto reference = [](const std::string& bytes) {
    std::string out;
    size_t i = 0;
    while (i < bytes.size()) {
      bool matched = false;
      for (size_t len = 4; len >= 1 && !matched; --len) {
        if (i + len <= bytes.size() && IsValidUtf8(bytes.substr(i, len))) {
          out += bytes.substr(i, len);
          i += len;
          matched = true;
        }
      }
      if (!matched) {
        out += "\xEF\xBF\xBD";
        ++i;
      }
    }
    return out;
  };
  std::mt19937 rng(11);
  for (int trial = 0; trial < 2000; ++trial) {
    std::string bytes;
    std::vector<int32_t> ids = DemoTokenizer().Encode("x", false).value();  // "▁x"
    for (int k = rng() % 12; k > 0; --k) {
      const uint8_t byte = rng() % 2 ? static_cast<uint8_t>(0x80 + rng() % 0x80) : static_cast<uint8_t>(rng());
      bytes += static_cast<char>(byte);
      ids.push_back(ByteId(byte));
    }
    ASSERT_EQ(DemoTokenizer().Decode(ids).value(), "x" + reference(bytes));
  }
}

}  // namespace
}  // namespace chunkattn
