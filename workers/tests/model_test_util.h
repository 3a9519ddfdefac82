// Shared by the model tests: reference fixtures (NumPy, or transformers when
// committed under tests/fixtures/transformers) and small drivers that manage
// KV chunks by hand.
//
// The fixtures' generator runs where the test binary runs, which on a GPU
// host is not where it was built (scripts/cuda_session.sh sets these):
//   CHUNKATTN_SOURCE_DIR         the source tree (default: the build's)
//   CHUNKATTN_PYTHON             a python3 with numpy (default /usr/bin/python3)
//   CHUNKATTN_TRANSFORMERS_FIXTURES  transformers fixtures (default: the
//                                committed ones under the source tree)
// The generator never inherits LD_LIBRARY_PATH: a bundle's libraries are for
// the bundle's binaries, not for the host's Python and NumPy.
#ifndef CHUNKATTN_WORKERS_TESTS_MODEL_TEST_UTIL_H_
#define CHUNKATTN_WORKERS_TESTS_MODEL_TEST_UTIL_H_

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "workers/model/context_builder.h"
#include "workers/model/llama.h"
#include "workers/model/safetensors.h"
#include "base/tests/temp_dir.h"

namespace chunkattn::testing {

struct Reference {
  std::string dir;
  std::string name;  // e.g. "numpy/llama3_gqa"
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::vector<int32_t>> greedy;
  std::vector<std::vector<float>> logits;  // per prompt: (len, vocab)
};

// $NAME when set and not empty, else `fallback`.
inline std::string EnvOr(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : fallback;
}

// `s` as one word of a POSIX shell command.
inline std::string ShellQuote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Generates the NumPy fixtures once per test binary (a few seconds) and adds
// the committed transformers fixtures when they exist. The NumPy fixtures'
// folder is removed when the process exits.
inline const std::vector<Reference>& References() {
  static const std::vector<Reference>* refs = [] {
    auto* out = new std::vector<Reference>();
    const std::string tmp = MakeTempDir("chunkattn-ref");
    if (tmp.empty()) return out;
    const std::string source = EnvOr("CHUNKATTN_SOURCE_DIR", CHUNKATTN_SOURCE_DIR);
    const std::string cmd = "env -u LD_LIBRARY_PATH " + ShellQuote(EnvOr("CHUNKATTN_PYTHON", "/usr/bin/python3")) +
                            " " + ShellQuote(source + "/tests/tools/make_reference.py") + " --backend numpy --out " +
                            ShellQuote(tmp) + " > " + ShellQuote(tmp + "/log.txt") + " 2>&1";
    if (std::system(cmd.c_str()) != 0) {
      std::ifstream log(tmp + "/log.txt");
      std::stringstream text;
      text << log.rdbuf();
      ADD_FAILURE() << "make_reference.py failed:\n" << text.str();
      return out;
    }
    std::vector<std::pair<std::string, std::string>> roots = {
        {"numpy", tmp},
        {"transformers", EnvOr("CHUNKATTN_TRANSFORMERS_FIXTURES", source + "/tests/fixtures/transformers")}};
    for (const auto& [backend, root] : roots) {
      for (const char* model : {"llama_mha", "llama3_gqa", "qwen2_tied", "qwen3_qk_norm"}) {
        Reference r;
        r.dir = root + "/" + model;
        r.name = backend + "/" + model;
        std::ifstream in(r.dir + "/reference.json");
        if (!in) continue;
        std::stringstream text;
        text << in.rdbuf();
        auto j = nlohmann::json::parse(text.str());
        r.prompts = j["prompts"].get<std::vector<std::vector<int32_t>>>();
        r.greedy = j["greedy"].get<std::vector<std::vector<int32_t>>>();
        auto file = SafetensorsFile::Open(r.dir + "/reference.safetensors");
        if (!file.ok()) {
          ADD_FAILURE() << file.status();
          continue;
        }
        for (size_t p = 0; p < r.prompts.size(); ++p) {
          auto t = (*file)->Get("logits." + std::to_string(p));
          EXPECT_TRUE(t.ok()) << t.status();
          std::vector<float> v(t->num_elements());
          ToFloat(*t, 0, t->num_elements(), v.data());
          r.logits.push_back(std::move(v));
        }
        out->push_back(std::move(r));
      }
    }
    return out;
  }();
  return *refs;
}

// max |a - b| / max |b|: the relative error of a logits block.
inline double RelError(const float* a, const float* b, size_t n) {
  double diff = 0, scale = 1e-30;
  for (size_t i = 0; i < n; ++i) {
    diff = std::max(diff, std::abs(double{a[i]} - double{b[i]}));
    scale = std::max(scale, std::abs(double{b[i]}));
  }
  return diff / scale;
}

inline std::unique_ptr<LlamaModel> LoadModelOrDie(const std::string& dir, ShardSpec shard = {},
                                                  Communicator* comm = nullptr,
                                                  ModelOptions options = {},
                                                  ThreadPool* pool = nullptr) {
  auto config = LoadModelConfig(dir);
  EXPECT_TRUE(config.ok()) << config.status();
  auto weights = LoadWeights(dir, *config, shard);
  EXPECT_TRUE(weights.ok()) << weights.status();
  if (options.num_kv_chunks == 0) options.num_kv_chunks = 64;
  auto model = LlamaModel::Create(*config, std::move(*weights), options, comm, pool);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? std::move(*model) : nullptr;
}

// A step of one sequence's prefill piece: `tokens` at positions
// prefix_len..., chunks `chunks` (enough for prefix_len + tokens), the logits
// of every row wanted.
inline ForwardBatch OnePrefill(const std::vector<int32_t>& tokens, int prefix_len,
                               const std::vector<int32_t>& chunks) {
  ForwardBatch b;
  b.tokens = tokens;
  b.prefill.prefix_len = {prefix_len};
  b.prefill.q_begin = {0, static_cast<int32_t>(tokens.size())};
  b.prefill.chunk_begin = {0, static_cast<int32_t>(chunks.size())};
  b.prefill.chunk_ids = chunks;
  for (size_t r = 0; r < tokens.size(); ++r) b.logits_rows.push_back(static_cast<int32_t>(r));
  return b;
}

// Runs OnePrefill on `model`. Returns logits of every row.
inline std::vector<float> PrefillPiece(Model& model, const std::vector<int32_t>& tokens,
                                       int prefix_len, const std::vector<int32_t>& chunks,
                                       std::vector<KvCopy> copies = {}) {
  ForwardBatch b = OnePrefill(tokens, prefix_len, chunks);
  b.copies = std::move(copies);
  std::vector<float> logits;
  const absl::Status st = model.Forward(b, logits);
  EXPECT_TRUE(st.ok()) << st;
  return logits;
}

inline int32_t Argmax(const float* x, int n) {
  return static_cast<int32_t>(std::max_element(x, x + n) - x);
}

// Chunk ids [first, first + n).
inline std::vector<int32_t> Chunks(int32_t first, int n) {
  std::vector<int32_t> v(n);
  for (int i = 0; i < n; ++i) v[i] = first + i;
  return v;
}

}  // namespace chunkattn::testing

#endif  // CHUNKATTN_WORKERS_TESTS_MODEL_TEST_UTIL_H_
