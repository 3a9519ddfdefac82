#include "text/tests/test_model.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>
#include <vector>

#include "text/train.h"

namespace chunkattn::tokenizer_test {
namespace {

namespace fs = std::filesystem;

// Removes the folders MakeTempDir() made when the process exits.
class TempDirs {
 public:
  ~TempDirs() {
    std::error_code ec;
    for (const std::string& dir : dirs_) fs::remove_all(dir, ec);
  }
  std::string Make() {
    std::string pattern = (fs::temp_directory_path() / "chunkattn_tokenizer_test_XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) {
      std::perror("mkdtemp");
      std::abort();
    }
    std::lock_guard<std::mutex> lock(mu_);
    dirs_.push_back(pattern);
    return pattern;
  }

 private:
  std::mutex mu_;
  std::vector<std::string> dirs_;
};

TempDirs& Dirs() {
  static TempDirs dirs;
  return dirs;
}

}  // namespace

std::string SourcePath(const std::string& relative) {
  return (fs::path(CHUNKATTN_SOURCE_DIR) / relative).string();
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string MakeTempDir() { return Dirs().Make(); }

const std::string& DemoModelPath() {
  static const std::string* path = [] {
    const std::string prefix = MakeTempDir() + "/demo";
    const absl::Status status =
        TrainSentencePiece(SourcePath("data/demo/shakespeare.txt"), kDemoVocabSize, prefix);
    if (!status.ok()) {
      std::fprintf(stderr, "training the demo tokenizer failed: %s\n", status.ToString().c_str());
      std::abort();
    }
    return new std::string(prefix + ".model");
  }();
  return *path;
}

const Tokenizer& DemoTokenizer() {
  static const Tokenizer* tokenizer = [] {
    absl::StatusOr<std::unique_ptr<Tokenizer>> loaded = LoadSentencePieceTokenizer(DemoModelPath());
    if (!loaded.ok()) {
      std::fprintf(stderr, "loading the demo tokenizer failed: %s\n", loaded.status().ToString().c_str());
      std::abort();
    }
    return loaded->release();
  }();
  return *tokenizer;
}

int32_t ByteId(uint8_t byte) { return 3 + byte; }

}  // namespace chunkattn::tokenizer_test
