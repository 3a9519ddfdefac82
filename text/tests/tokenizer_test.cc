#include "text/tokenizer.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "text/tests/test_model.h"

namespace chunkattn {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using tokenizer_test::ByteId;
using tokenizer_test::DemoModelPath;
using tokenizer_test::DemoTokenizer;
using tokenizer_test::kDemoVocabSize;
using tokenizer_test::MakeTempDir;
using tokenizer_test::ReadFile;

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

// Texts with what a chat prompt may hold: prose from and beyond the corpus,
// whitespace runs, characters the corpus never saw (byte fallback), emoji with
// modifiers and joiners.
const std::vector<std::string>& VariedTexts() {
  static const auto* texts = new std::vector<std::string>{
      "",
      "Hello world",
      "First Citizen:\nBefore we proceed any further, hear me speak.",
      " leading space",
      "   three leading spaces",
      "trailing spaces   ",
      "inner     run of spaces",
      "tabs\tand\nnewlines\r\n\n\n",
      " ",
      "\n",
      "\xC3\xA9",                                       // é
      "na\xC3\xAFve caf\xC3\xA9 r\xC3\xA9sum\xC3\xA9",  // naïve café résumé
      "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E",           // 日本語
      "\xCE\x95\xCE\xBB\xCE\xBB\xCE\xB7\xCE\xBD\xCE\xB9\xCE\xBA\xCE\xAC and \xD0\xBA\xD0\xB8\xD1\x80",
      "emoji \xF0\x9F\x98\x80 thumbs \xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD family "
      "\xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA7",
      "math \xE2\x88\x91 x\xC2\xB2 \xE2\x89\xA4 10",
      "digits 0123456789 and 3.14159, {json: [1, 2]}",
      "<s> literal </s> markers <0x41>",
      "\x01\x7F control characters",
      "\xE2\x82\xAC",  // €
  };
  return *texts;
}

TEST(TokenizerTest, RoundTripsVariedText) {
  const Tokenizer& tokenizer = DemoTokenizer();
  for (const std::string& text : VariedTexts()) {
    SCOPED_TRACE(text);
    absl::StatusOr<std::vector<int32_t>> ids = tokenizer.Encode(text, /*add_bos=*/false);
    ASSERT_TRUE(ids.ok()) << ids.status();
    for (int32_t id : *ids) {
      EXPECT_GE(id, 0);
      EXPECT_LT(id, tokenizer.vocab_size());
      EXPECT_NE(id, 0) << "byte fallback should leave nothing to <unk>";
      EXPECT_FALSE(tokenizer.IsControl(id)) << "text must not produce control tokens";
    }
    absl::StatusOr<std::string> decoded = tokenizer.Decode(*ids);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(*decoded, text);
  }
}

TEST(TokenizerTest, CharactersOutsideTheVocabularyFallBackToBytes) {
  const Tokenizer& tokenizer = DemoTokenizer();
  const std::string emoji = "\xF0\x9F\x98\x80";  // 😀: never in the corpus
  absl::StatusOr<std::vector<int32_t>> ids = tokenizer.Encode(emoji, false);
  ASSERT_TRUE(ids.ok()) << ids.status();
  // The dummy-prefix space, then one token per UTF-8 byte.
  ASSERT_EQ(ids->size(), 5u);
  for (int k = 0; k < 4; ++k) {
    EXPECT_EQ((*ids)[k + 1], ByteId(static_cast<uint8_t>(emoji[k])));
    absl::StatusOr<std::string> piece = tokenizer.IdToPiece((*ids)[k + 1]);
    ASSERT_TRUE(piece.ok());
    EXPECT_EQ(piece->substr(0, 3), "<0x");
  }
}

TEST(TokenizerTest, AddBosPrependsBos) {
  const Tokenizer& tokenizer = DemoTokenizer();
  absl::StatusOr<std::vector<int32_t>> plain = tokenizer.Encode("To be, or not to be", false);
  absl::StatusOr<std::vector<int32_t>> with_bos = tokenizer.Encode("To be, or not to be", true);
  ASSERT_TRUE(plain.ok() && with_bos.ok());
  ASSERT_EQ(with_bos->size(), plain->size() + 1);
  EXPECT_EQ(with_bos->front(), tokenizer.bos_id());
  EXPECT_TRUE(std::equal(plain->begin(), plain->end(), with_bos->begin() + 1));
  absl::StatusOr<std::string> decoded = tokenizer.Decode(*with_bos);
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(*decoded, "To be, or not to be");
}

TEST(TokenizerTest, SpecialIdsFollowLlamaLayout) {
  const Tokenizer& tokenizer = DemoTokenizer();
  EXPECT_EQ(tokenizer.vocab_size(), kDemoVocabSize);
  EXPECT_EQ(tokenizer.bos_id(), 1);
  EXPECT_EQ(tokenizer.eos_id(), 2);
  EXPECT_EQ(tokenizer.IdToPiece(0).value(), "<unk>");
  EXPECT_EQ(tokenizer.IdToPiece(1).value(), "<s>");
  EXPECT_EQ(tokenizer.IdToPiece(2).value(), "</s>");
  EXPECT_EQ(tokenizer.IdToPiece(ByteId(0x00)).value(), "<0x00>");
  EXPECT_EQ(tokenizer.IdToPiece(ByteId(0xE2)).value(), "<0xE2>");
  EXPECT_EQ(tokenizer.IdToPiece(ByteId(0xFF)).value(), "<0xFF>");
  EXPECT_TRUE(tokenizer.IsControl(1));
  EXPECT_TRUE(tokenizer.IsControl(2));
  EXPECT_FALSE(tokenizer.IsControl(0));
  EXPECT_FALSE(tokenizer.IsControl(ByteId('A')));
  EXPECT_FALSE(tokenizer.IsControl(-1));
  EXPECT_FALSE(tokenizer.IsControl(kDemoVocabSize));
  EXPECT_EQ(tokenizer.TokenBytes(1).value(), "");
  EXPECT_EQ(tokenizer.TokenBytes(ByteId(0xE2)).value(), "\xE2");
  // Control tokens decode to nothing wherever they are.
  absl::StatusOr<std::vector<int32_t>> hi = tokenizer.Encode("Hi there", false);
  ASSERT_TRUE(hi.ok());
  std::vector<int32_t> wrapped = {1};
  wrapped.insert(wrapped.end(), hi->begin(), hi->end());
  wrapped.push_back(2);
  EXPECT_EQ(tokenizer.Decode(wrapped).value(), "Hi there");
}

TEST(TokenizerTest, TokenBytesConcatenateToTheText) {
  const Tokenizer& tokenizer = DemoTokenizer();
  for (const std::string& text : VariedTexts()) {
    if (text.empty()) continue;
    SCOPED_TRACE(text);
    absl::StatusOr<std::vector<int32_t>> ids = tokenizer.Encode(text, false);
    ASSERT_TRUE(ids.ok());
    std::string bytes;
    for (int32_t id : *ids) bytes += tokenizer.TokenBytes(id).value();
    EXPECT_EQ(bytes, " " + text);  // the dummy-prefix space Decode drops
  }
}

TEST(TokenizerTest, RejectsIdsOutsideTheVocabulary) {
  const Tokenizer& tokenizer = DemoTokenizer();
  for (int32_t bad : {-1, kDemoVocabSize, kDemoVocabSize + 1, std::numeric_limits<int32_t>::max(),
                      std::numeric_limits<int32_t>::min()}) {
    SCOPED_TRACE(bad);
    const std::vector<int32_t> ids = {5, 6, bad, 7};
    absl::StatusOr<std::string> decoded = tokenizer.Decode(ids);
    ASSERT_FALSE(decoded.ok());
    EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(decoded.status().message(), HasSubstr(std::to_string(bad)));
    EXPECT_THAT(decoded.status().message(), HasSubstr("position 2"));
    EXPECT_EQ(tokenizer.IdToPiece(bad).status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(tokenizer.TokenBytes(bad).status().code(), absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(tokenizer.Decode({}).value(), "");
}

TEST(TokenizerTest, EncodeRejectsInvalidUtf8) {
  const Tokenizer& tokenizer = DemoTokenizer();
  for (const std::string& bad : {std::string("\xFF"), std::string("cut \xE2\x82"),
                                std::string("\xED\xA0\x80 surrogate"), std::string("\xC0\xAF overlong"),
                                std::string("\x80 stray continuation")}) {
    EXPECT_EQ(tokenizer.Encode(bad, false).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(TokenizerTest, LoadTokenizerWithoutModelFileIsNotFound) {
  const std::string dir = MakeTempDir();
  absl::StatusOr<std::unique_ptr<Tokenizer>> loaded = LoadTokenizer(dir);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(loaded.status().message(), HasSubstr(dir));
  EXPECT_THAT(loaded.status().message(), HasSubstr("tokenizer.model"));

  WriteFile(dir + "/tokenizer.json", "{}");  // found, and not a tokenizer
  loaded = LoadTokenizer(dir);
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(loaded.status().message(), HasSubstr("tokenizer.json"));

  loaded = LoadTokenizer(dir + "/no_such_folder");
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(loaded.status().message(), HasSubstr("no_such_folder"));
}

TEST(TokenizerTest, LoadTokenizerReadsTokenizerModel) {
  const std::string dir = MakeTempDir();
  fs::copy_file(DemoModelPath(), dir + "/tokenizer.model");
  absl::StatusOr<std::unique_ptr<Tokenizer>> loaded = LoadTokenizer(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ((*loaded)->vocab_size(), kDemoVocabSize);
  EXPECT_EQ((*loaded)->Encode("Good morrow", true).value(),
            DemoTokenizer().Encode("Good morrow", true).value());
}

TEST(TokenizerTest, TokenizerJsonWinsOverTokenizerModel) {
  const std::string dir = MakeTempDir();
  fs::copy_file(DemoModelPath(), dir + "/tokenizer.model");
  WriteFile(dir + "/tokenizer.json",
            R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}})");
  absl::StatusOr<std::unique_ptr<Tokenizer>> loaded = LoadTokenizer(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ((*loaded)->vocab_size(), 3);
  EXPECT_EQ((*loaded)->Encode("abab", false).value(), (std::vector<int32_t>{2, 2}));
  // Invalid UTF-8 is refused by this tokenizer too.
  EXPECT_EQ((*loaded)->Encode("a\xFF", false).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TokenizerTest, MissingModelFileIsNotFound) {
  const std::string path = MakeTempDir() + "/absent.model";
  absl::StatusOr<std::unique_ptr<Tokenizer>> loaded = LoadSentencePieceTokenizer(path);
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(loaded.status().message(), HasSubstr(path));
}

TEST(TokenizerTest, CorruptModelFilesAreErrorsNotCrashes) {
  const std::string good = ReadFile(DemoModelPath());
  ASSERT_GT(good.size(), 1000u);
  std::mt19937 rng(7);
  std::string random_bytes(good.size(), '\0');
  for (char& c : random_bytes) c = static_cast<char>(rng());
  std::string smashed = good;
  std::fill(smashed.begin() + smashed.size() / 3, smashed.begin() + smashed.size() / 3 + 64, '\xFF');

  const std::string dir = MakeTempDir();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"truncated_half", good.substr(0, good.size() / 2)},
      {"truncated_100", good.substr(0, 100)},
      {"empty", ""},
      {"random", random_bytes},
      {"text", "this is not a protobuf\n"},
      {"smashed", smashed},
  };
  for (const auto& [name, bytes] : cases) {
    SCOPED_TRACE(name);
    const std::string path = dir + "/" + name + ".model";
    WriteFile(path, bytes);
    absl::StatusOr<std::unique_ptr<Tokenizer>> loaded = LoadSentencePieceTokenizer(path);
    ASSERT_FALSE(loaded.ok());
    EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(loaded.status().message(), HasSubstr(path));
  }
  // A folder where the file should be: SentencePiece would throw here.
  fs::create_directory(dir + "/folder.model");
  absl::StatusOr<std::unique_ptr<Tokenizer>> loaded = LoadSentencePieceTokenizer(dir + "/folder.model");
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument);
  fs::create_directory(dir + "/model_dir");
  fs::create_directory(dir + "/model_dir/tokenizer.model");
  EXPECT_EQ(LoadTokenizer(dir + "/model_dir").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TokenizerTest, ConcurrentCallsMatchSerialResults) {
  const Tokenizer& tokenizer = DemoTokenizer();
  // Lines of the corpus plus the varied texts.
  std::vector<std::string> texts = VariedTexts();
  std::ifstream corpus(tokenizer_test::SourcePath("data/demo/shakespeare.txt"));
  std::string line;
  for (int k = 0; k < 400 && std::getline(corpus, line); ++k) texts.push_back(line);
  std::vector<std::vector<int32_t>> expected;
  for (const std::string& text : texts) expected.push_back(tokenizer.Encode(text, true).value());

  constexpr int kThreads = 8;
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      for (int round = 0; round < 5; ++round) {
        for (size_t k = 0; k < texts.size(); ++k) {
          const size_t i = rng() % texts.size();
          absl::StatusOr<std::vector<int32_t>> ids = tokenizer.Encode(texts[i], true);
          if (!ids.ok() || *ids != expected[i]) ++mismatches;
          absl::StatusOr<std::string> text = tokenizer.Decode(expected[i]);
          if (!text.ok() || *text != texts[i]) ++mismatches;
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(mismatches.load(), 0);
}

}  // namespace
}  // namespace chunkattn
