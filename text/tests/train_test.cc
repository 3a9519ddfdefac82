#include "text/train.h"

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>

#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "text/tests/test_model.h"
#include "text/tokenizer.h"

namespace chunkattn {
namespace {

using ::testing::HasSubstr;
using tokenizer_test::MakeTempDir;
using tokenizer_test::ReadFile;
using tokenizer_test::SourcePath;

std::string Corpus() { return SourcePath("data/demo/shakespeare.txt"); }

TEST(TrainTest, DemoCorpusIsShipped) {
  const std::string corpus = ReadFile(Corpus());
  EXPECT_GT(corpus.size(), 150u * 1000);
  EXPECT_EQ(corpus.substr(0, 14), "First Citizen:");
}

TEST(TrainTest, TrainsQuicklyAndDeterministically) {
  const std::string a = MakeTempDir() + "/tok";
  const std::string b = MakeTempDir() + "/tok";
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(TrainSentencePiece(Corpus(), 2000, a).ok());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("trained a 2000-piece tokenizer in %.2f s\n", seconds);
  EXPECT_LT(seconds, 20.0);  // ~0.2 s normally; generous for a loaded machine
  const std::string first_model = ReadFile(a + ".model");
  const std::string first_vocab = ReadFile(a + ".vocab");
  ASSERT_FALSE(first_model.empty());

  // Same corpus, vocab_size and prefix: byte-identical model.
  ASSERT_TRUE(TrainSentencePiece(Corpus(), 2000, a).ok());
  EXPECT_EQ(ReadFile(a + ".model"), first_model);
  // Another prefix: the model records the prefix, but pieces and scores match.
  ASSERT_TRUE(TrainSentencePiece(Corpus(), 2000, b).ok());
  EXPECT_EQ(ReadFile(b + ".vocab"), first_vocab);
  EXPECT_EQ(ReadFile(b + ".model").size(), first_model.size());
}

TEST(TrainTest, SplitsDigitsIntoSingleTokens) {
  const std::string dir = MakeTempDir();
  {
    std::ofstream corpus(dir + "/numbers.txt");
    for (int k = 0; k < 400; ++k) {
      corpus << absl::StrFormat("In the year %d we counted %d sheep and %d goats, 2024 2024 2024.\n",
                                1900 + k % 125, 12345 + k, 100 * (k % 7));
    }
  }
  const absl::Status trained = TrainSentencePiece(dir + "/numbers.txt", 340, dir + "/numbers");
  ASSERT_TRUE(trained.ok()) << trained;
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = LoadSentencePieceTokenizer(dir + "/numbers.model");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const std::vector<int32_t> ids = (*tokenizer)->Encode("2024 12345", false).value();
  int digit_tokens = 0;
  for (int32_t id : ids) {
    const std::string bytes = (*tokenizer)->TokenBytes(id).value();
    int digits = 0;
    for (char c : bytes) digits += (c >= '0' && c <= '9');
    EXPECT_LE(digits, 1) << "piece \"" << bytes << "\" merges digits";
    digit_tokens += digits;
  }
  EXPECT_EQ(digit_tokens, 9);
  EXPECT_EQ((*tokenizer)->Decode(ids).value(), "2024 12345");
}

TEST(TrainTest, RejectsBadArguments) {
  const std::string dir = MakeTempDir();
  EXPECT_EQ(TrainSentencePiece(Corpus(), 0, dir + "/m").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TrainSentencePiece(Corpus(), -3, dir + "/m").code(), absl::StatusCode::kInvalidArgument);

  const absl::Status missing = TrainSentencePiece(dir + "/absent.txt", 2000, dir + "/m");
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.message(), HasSubstr("absent.txt"));

  { std::ofstream empty(dir + "/empty.txt"); }
  EXPECT_EQ(TrainSentencePiece(dir + "/empty.txt", 2000, dir + "/m").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TrainSentencePiece(dir, 2000, dir + "/m").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TrainSentencePiece(Corpus(), 2000, dir + "/no/such/folder/m").code(),
            absl::StatusCode::kNotFound);

  // Too small for 3 specials + 256 bytes + the corpus's characters; too large
  // for the merges the corpus allows.
  const absl::Status too_small = TrainSentencePiece(Corpus(), 100, dir + "/m");
  EXPECT_EQ(too_small.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(too_small.message(), HasSubstr("Vocabulary size"));
  EXPECT_EQ(TrainSentencePiece(Corpus(), 1000000, dir + "/m").code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace chunkattn
