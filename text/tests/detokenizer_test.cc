#include "text/detokenizer.h"

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "text/hf_tokenizer.h"
#include "text/tests/test_model.h"
#include "text/utf8.h"

namespace chunkattn {
namespace {

using tokenizer_test::ByteId;
using tokenizer_test::DemoTokenizer;

std::vector<int32_t> Encode(const std::string& text, bool add_bos = false) {
  absl::StatusOr<std::vector<int32_t>> ids = DemoTokenizer().Encode(text, add_bos);
  EXPECT_TRUE(ids.ok()) << ids.status();
  return ids.ok() ? *ids : std::vector<int32_t>();
}

std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

struct Streamed {
  std::vector<std::string> pieces;  // one per Append, then Flush()'s
  std::string text;                 // their concatenation
  size_t max_window = 0;
};

// Streams `generated` after `prompt`, checking that every piece is
// well-formed UTF-8 (so no character was split).
Streamed Stream(const std::vector<int32_t>& prompt, const std::vector<int32_t>& generated) {
  Streamed out;
  IncrementalDetokenizer detokenizer(&DemoTokenizer(), prompt);
  for (int32_t id : generated) {
    absl::StatusOr<std::string> piece = detokenizer.Append(id);
    EXPECT_TRUE(piece.ok()) << piece.status();
    if (!piece.ok()) return out;
    EXPECT_TRUE(IsValidUtf8(*piece)) << "token " << id << " gave a split character";
    out.pieces.push_back(*piece);
    out.text += *piece;
    out.max_window = std::max(out.max_window, detokenizer.window_size());
  }
  absl::StatusOr<std::string> rest = detokenizer.Flush();
  EXPECT_TRUE(rest.ok()) << rest.status();
  if (rest.ok()) {
    EXPECT_TRUE(IsValidUtf8(*rest));
    out.pieces.push_back(*rest);
    out.text += *rest;
  }
  return out;
}

// The contract for prompts ending on a complete character: the streamed text
// is Decode(prompt + generated) minus the prefix Decode(prompt).
void ExpectMatchesFullDecode(const std::vector<int32_t>& prompt, const std::vector<int32_t>& generated) {
  const std::string full = DemoTokenizer().Decode(Concat(prompt, generated)).value();
  const std::string prefix = DemoTokenizer().Decode(prompt).value();
  ASSERT_EQ(full.compare(0, prefix.size(), prefix), 0) << "Decode(prompt) is not a prefix";
  const Streamed streamed = Stream(prompt, generated);
  EXPECT_EQ(streamed.text, full.substr(prefix.size()));
}

// Hugging Face tokenizers, where two things differ from SentencePiece: a
// byte-level token can end one character and start the next, and
// ByteFallback decodes a run of byte tokens that is not valid UTF-8 as one
// U+FFFD per byte, the valid characters in it too.
std::unique_ptr<Tokenizer> ParseOrDie(const std::string& json) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> t = ParseHfTokenizer(json, "test/tokenizer.json");
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *std::move(t) : nullptr;
}

std::string StreamWith(const Tokenizer& t, const std::vector<int32_t>& prompt, const std::vector<int32_t>& generated) {
  IncrementalDetokenizer detokenizer(&t, prompt);
  std::string text;
  for (int32_t id : generated) {
    absl::StatusOr<std::string> piece = detokenizer.Append(id);
    EXPECT_TRUE(piece.ok()) << piece.status();
    if (!piece.ok()) return text;
    EXPECT_TRUE(IsValidUtf8(*piece)) << "token " << id << " gave a split character";
    text += *piece;
  }
  return text + detokenizer.Flush().value_or("<flush failed>");
}

TEST(DetokenizerTest, ByteLevelTokenThatEndsOneCharacterAndStartsTheNext) {
  // "éé" is C3 A9 C3 A9; byte-level BPE spells C3 as "Ã" and A9 as "©".
  std::unique_ptr<Tokenizer> t = ParseOrDie(R"({"model": {"type": "BPE", "merges": [],
      "vocab": {"Ã": 0, "©Ã": 1, "©": 2, "a": 3}}, "decoder": {"type": "ByteLevel"}})");
  ASSERT_NE(t, nullptr);
  const std::vector<int32_t> ids = {0, 1, 2};  // Ã | ©Ã | ©
  ASSERT_EQ(t->Decode(ids).value(), "éé");
  EXPECT_EQ(StreamWith(*t, {3}, ids), "éé");
  EXPECT_EQ(StreamWith(*t, {}, ids), "éé");
}

TEST(DetokenizerTest, PromptContextStartsOnAWholeCharacter) {
  // "€" is E2 82 AC, here three byte-fallback tokens.
  std::unique_ptr<Tokenizer> t = ParseOrDie(R"({"model": {"type": "BPE", "byte_fallback": true, "merges": [],
      "vocab": {"<0xE2>": 0, "<0x82>": 1, "<0xAC>": 2, "x": 3}},
      "decoder": {"type": "Sequence", "decoders": [{"type": "ByteFallback"}, {"type": "Fuse"}]}})");
  ASSERT_NE(t, nullptr);
  const std::vector<int32_t> euro = {0, 1, 2};
  ASSERT_EQ(t->Decode(euro).value(), "€");
  // The prompt's last four tokens (AC E2 82 AC) begin inside a character;
  // decoded with the new bytes in one run they would all be U+FFFD.
  EXPECT_EQ(StreamWith(*t, {0, 1, 2, 0, 1, 2}, euro), "€");
}

TEST(DetokenizerTest, HoldsBytesUntilTheCharacterIsComplete) {
  const std::vector<int32_t> prompt = Encode("Price:");
  const Streamed euro = Stream(prompt, {ByteId(0xE2), ByteId(0x82), ByteId(0xAC)});
  EXPECT_EQ(euro.pieces, (std::vector<std::string>{"", "", "\xE2\x82\xAC", ""}));

  const Streamed emoji =
      Stream(prompt, Concat({ByteId(0xF0), ByteId(0x9F), ByteId(0x98), ByteId(0x80)}, Encode("ok")));
  ASSERT_GE(emoji.pieces.size(), 6u);
  EXPECT_EQ(emoji.pieces[0], "");
  EXPECT_EQ(emoji.pieces[1], "");
  EXPECT_EQ(emoji.pieces[2], "");
  EXPECT_EQ(emoji.pieces[3], "\xF0\x9F\x98\x80");
  EXPECT_EQ(emoji.text, "\xF0\x9F\x98\x80 ok");
}

TEST(DetokenizerTest, KeepsTheSpaceBeforeTheFirstGeneratedWord) {
  const std::vector<int32_t> prompt = Encode("To be, or");
  const std::vector<int32_t> generated = Encode("not to be");  // starts with "▁not"
  const Streamed streamed = Stream(prompt, generated);
  EXPECT_EQ(streamed.text, " not to be");
  ASSERT_FALSE(streamed.pieces.empty());
  EXPECT_EQ(streamed.pieces[0].substr(0, 1), " ");
  ExpectMatchesFullDecode(prompt, generated);
}

TEST(DetokenizerTest, EmptyPromptDropsTheDummySpaceLikeDecode) {
  const std::vector<int32_t> generated = Encode("Hello there");
  EXPECT_EQ(Stream({}, generated).text, "Hello there");
  EXPECT_EQ(Stream({DemoTokenizer().bos_id()}, generated).text, "Hello there");
}

TEST(DetokenizerTest, ControlTokensAddNothing) {
  const std::vector<int32_t> prompt = Encode("Speak", /*add_bos=*/true);
  const std::vector<int32_t> generated =
      Concat(Concat(Encode("a word"), {DemoTokenizer().eos_id(), DemoTokenizer().bos_id()}), Encode("more"));
  const Streamed streamed = Stream(prompt, generated);
  EXPECT_EQ(streamed.text, " a word more");
  ExpectMatchesFullDecode(prompt, generated);
}

TEST(DetokenizerTest, PromptEndingInsideACharacterEmitsTheWholeCharacter) {
  // Only prompts not made by Encode can end mid-character; the pending bytes
  // are emitted with the byte that completes them.
  const std::vector<int32_t> prompt = Concat(Encode("cost"), {ByteId(0xE2), ByteId(0x82)});
  IncrementalDetokenizer detokenizer(&DemoTokenizer(), prompt);
  EXPECT_EQ(detokenizer.Append(ByteId(0xAC)).value(), "\xE2\x82\xAC");
  EXPECT_EQ(detokenizer.Append(Encode("the")[0]).value(), " the");
  EXPECT_EQ(detokenizer.Flush().value(), "");

  // If generation does not complete it, those bytes come out as U+FFFD, as in
  // Decode(prompt + generated).
  const std::vector<int32_t> generated = Encode("x");
  const std::string full = DemoTokenizer().Decode(Concat(prompt, generated)).value();
  EXPECT_EQ(full, "cost\xEF\xBF\xBD\xEF\xBF\xBD x");
  EXPECT_EQ(Stream(prompt, generated).text, "\xEF\xBF\xBD\xEF\xBF\xBD x");
}

TEST(DetokenizerTest, FlushEmitsAnUnfinishedCharacterAsReplacementCharacters) {
  const Streamed streamed = Stream(Encode("Hi"), {ByteId(0xF0), ByteId(0x9F)});
  EXPECT_EQ(streamed.pieces, (std::vector<std::string>{"", "", "\xEF\xBF\xBD\xEF\xBF\xBD"}));
  ExpectMatchesFullDecode(Encode("Hi"), {ByteId(0xF0), ByteId(0x9F)});
}

TEST(DetokenizerTest, RejectsBadIdsAndCallsAfterFlush) {
  const Tokenizer& tokenizer = DemoTokenizer();
  IncrementalDetokenizer detokenizer(&tokenizer, Encode("Well"));
  EXPECT_EQ(detokenizer.Append(-1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(detokenizer.Append(tokenizer.vocab_size()).status().code(), absl::StatusCode::kInvalidArgument);
  // A rejected id leaves the state as it was.
  EXPECT_EQ(detokenizer.Append(Encode("the")[0]).value(), " the");
  EXPECT_EQ(detokenizer.Flush().value(), "");
  EXPECT_EQ(detokenizer.Flush().status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(detokenizer.Append(5).status().code(), absl::StatusCode::kFailedPrecondition);

  IncrementalDetokenizer bad_prompt(&tokenizer, {5, 99999});
  absl::StatusOr<std::string> piece = bad_prompt.Append(5);
  EXPECT_EQ(piece.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(piece.status().message(), ::testing::HasSubstr("99999"));
  EXPECT_EQ(bad_prompt.Flush().status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(DetokenizerTest, LongGenerationKeepsTheWindowSmall) {
  std::string text;
  for (int k = 0; k < 300; ++k) {
    text += "Now is the winter of our discontent \xE2\x82\xAC" + std::to_string(k) + " \xF0\x9F\x98\x80\n";
  }
  const std::vector<int32_t> generated = Encode(text);
  ASSERT_GT(generated.size(), 5000u);
  const Streamed streamed = Stream(Encode("GLOUCESTER:"), generated);
  EXPECT_LE(streamed.max_window, 8u);
  EXPECT_EQ(streamed.text, " " + text);
}

// Random text over an alphabet mixing ASCII, whitespace runs, characters the
// corpus has never seen (byte fallback) and emoji with modifiers.
std::string RandomText(std::mt19937& rng) {
  static const std::vector<std::string> kAlphabet = {
      "a", "e", "t", "h", "the", " ", "  ", "\n", "\t", ",", ".", "'", "O", "KING", ":",
      "0", "7", "42",
      "\xC3\xA9",                                  // é
      "\xC3\x9F",                                  // ß
      "\xE6\x97\xA5",                              // 日
      "\xE2\x82\xAC",                              // €
      "\xF0\x9F\x98\x80",                          // 😀
      "\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD",          // 👍🏽
      "\xE2\x80\x8D",                              // zero-width joiner
      "\xEF\xBF\xBD",                              // U+FFFD itself
  };
  std::string text;
  const int n = rng() % 24;
  for (int k = 0; k < n; ++k) text += kAlphabet[rng() % kAlphabet.size()];
  return text;
}

TEST(DetokenizerTest, RandomWalkMatchesFullDecode) {
  const Tokenizer& tokenizer = DemoTokenizer();
  std::mt19937 rng(20240607);
  for (int trial = 0; trial < 400; ++trial) {
    // Prompt: empty, encoded text, or random ids that end on a text token (so
    // the prompt ends on a complete character).
    std::vector<int32_t> prompt;
    switch (rng() % 3) {
      case 0:
        break;
      case 1:
        prompt = Encode(RandomText(rng), rng() % 2 == 0);
        break;
      case 2:
        for (int k = rng() % 6; k > 0; --k) prompt.push_back(rng() % tokenizer.vocab_size());
        prompt.push_back(Encode("so")[0]);
        break;
    }
    // Generated: runs of encoded text, lone bytes and arbitrary ids
    // (control, <unk>, bytes that never form a character).
    std::vector<int32_t> generated;
    for (int run = rng() % 6; run > 0; --run) {
      switch (rng() % 4) {
        case 0:
        case 1:
          generated = Concat(generated, Encode(RandomText(rng)));
          break;
        case 2:
          for (int k = rng() % 5; k > 0; --k) generated.push_back(ByteId(rng() % 256));
          break;
        case 3:
          for (int k = rng() % 3; k > 0; --k) generated.push_back(rng() % tokenizer.vocab_size());
          break;
      }
    }
    SCOPED_TRACE(::testing::Message() << "trial " << trial);
    ExpectMatchesFullDecode(prompt, generated);
    EXPECT_LE(Stream(prompt, generated).max_window, 8u);
    if (HasFatalFailure() || HasNonfatalFailure()) break;  // one readable failure is enough
  }
}

TEST(DetokenizerTest, ByteSaladMatchesFullDecode) {
  std::mt19937 rng(99);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<int32_t> generated;
    for (int k = 0; k < 500; ++k) {
      // Bias towards lead and continuation bytes so characters do form.
      const uint8_t byte = rng() % 2 ? static_cast<uint8_t>(0x80 + rng() % 0x80) : static_cast<uint8_t>(rng());
      generated.push_back(ByteId(byte));
    }
    ExpectMatchesFullDecode(Encode("Bytes:"), generated);
  }
}

}  // namespace
}  // namespace chunkattn
