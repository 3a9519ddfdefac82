// chunkattn-make-demo-model DIR: writes the built-in demo model, a small
// Llama (4 layers, GQA 8/2, hidden 256) with a SentencePiece tokenizer
// trained on the public-domain text in data/demo/, in the real Hugging Face
// layout (config.json, model.safetensors, tokenizer.model), so the demo goes
// through the real loader.
//
// The weights are made, not trained: the embedding and LM head are a
// low-rank factorization of the corpus' bigram log-probabilities (so the
// model writes Shakespeare-flavoured word salad rather than noise), and the
// attention and MLP layers are seeded random weights with small output
// projections, so every part of the model still runs and matters a little.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <cblas.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "proto/model/model_config.h"
#include "text/tokenizer.h"
#include "text/train.h"
#include "workers/model/weights.h"

ABSL_FLAG(std::string, corpus, CHUNKATTN_SOURCE_DIR "/data/demo/shakespeare.txt",
          "training text for the tokenizer and the bigram statistics");
ABSL_FLAG(int, vocab_size, 2048, "tokenizer vocabulary size");
ABSL_FLAG(uint64_t, seed, 1, "seed of the random layer weights");

namespace chunkattn {
namespace {

constexpr int kHidden = 256;
constexpr int kRank = kHidden - 1;  // the last dimension evens out the row norms

// Orthonormalizes the columns of m (rows x cols, row-major) in place
// (modified Gram-Schmidt in double).
void Orthonormalize(std::vector<float>& m, int rows, int cols) {
  std::vector<double> col(rows), other(rows);
  for (int j = 0; j < cols; ++j) {
    for (int r = 0; r < rows; ++r) col[r] = m[int64_t{r} * cols + j];
    for (int i = 0; i < j; ++i) {
      double dot = 0;
      for (int r = 0; r < rows; ++r) dot += col[r] * m[int64_t{r} * cols + i];
      for (int r = 0; r < rows; ++r) col[r] -= dot * m[int64_t{r} * cols + i];
    }
    double norm = 0;
    for (double x : col) norm += x * x;
    norm = std::sqrt(std::max(norm, 1e-30));
    for (int r = 0; r < rows; ++r) m[int64_t{r} * cols + j] = static_cast<float>(col[r] / norm);
  }
}

// c (m x n) = op(a) * op(b), row-major.
void Gemm(bool ta, bool tb, int m, int n, int k, const float* a, const float* b, float* c) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n,
              k, 1.0f, a, ta ? m : k, b, tb ? k : n, 0.0f, c, n);
}

absl::Status Run(const std::string& dir) {
  std::filesystem::create_directories(dir);
  const std::string corpus = absl::GetFlag(FLAGS_corpus);
  RETURN_IF_ERROR(TrainSentencePiece(corpus, absl::GetFlag(FLAGS_vocab_size), dir + "/tokenizer"));
  std::filesystem::remove(dir + "/tokenizer.vocab");
  ASSIGN_OR_RETURN(auto tokenizer, LoadTokenizer(dir));
  const int vocab = tokenizer->vocab_size();

  // Bigram log-probabilities, each line starting after BOS.
  std::vector<float> counts(int64_t{vocab} * vocab, 0.0f);
  std::ifstream in(corpus);
  std::string line;
  int64_t tokens = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    ASSIGN_OR_RETURN(std::vector<int32_t> ids, tokenizer->Encode(line, /*add_bos=*/true));
    for (size_t i = 1; i < ids.size(); ++i) counts[int64_t{ids[i - 1]} * vocab + ids[i]] += 1;
    tokens += static_cast<int64_t>(ids.size());
  }
  std::vector<float> logp(counts.size());
  for (int a = 0; a < vocab; ++a) {
    double total = 0;
    for (int b = 0; b < vocab; ++b) total += counts[int64_t{a} * vocab + b] + 0.01;
    double mean = 0;
    for (int b = 0; b < vocab; ++b) {
      const double lp = std::log((counts[int64_t{a} * vocab + b] + 0.01) / total);
      logp[int64_t{a} * vocab + b] = static_cast<float>(lp);
      mean += lp / vocab;
    }
    // Softmax ignores a per-row constant; centred rows factorize better.
    for (int b = 0; b < vocab; ++b) logp[int64_t{a} * vocab + b] -= static_cast<float>(mean);
  }

  // Randomized range finder with two power iterations: logp ~ Y (Y^T logp).
  std::mt19937_64 rng(absl::GetFlag(FLAGS_seed));
  std::normal_distribution<float> normal;
  std::vector<float> omega(int64_t{vocab} * kRank), y(int64_t{vocab} * kRank), z(int64_t{vocab} * kRank);
  for (float& x : omega) x = normal(rng);
  Gemm(false, false, vocab, kRank, vocab, logp.data(), omega.data(), y.data());
  Orthonormalize(y, vocab, kRank);
  for (int it = 0; it < 2; ++it) {
    Gemm(true, false, vocab, kRank, vocab, logp.data(), y.data(), z.data());
    Orthonormalize(z, vocab, kRank);
    Gemm(false, false, vocab, kRank, vocab, logp.data(), z.data(), y.data());
    Orthonormalize(y, vocab, kRank);
  }
  std::vector<float> bt(int64_t{kRank} * vocab);  // Y^T logp
  Gemm(true, false, kRank, vocab, vocab, y.data(), logp.data(), bt.data());

  ModelConfig c;
  c.architecture = "LlamaForCausalLM";
  c.model_type = "llama";
  c.vocab_size = vocab;
  c.hidden_size = kHidden;
  c.intermediate_size = 704;
  c.num_layers = 4;
  c.num_heads = 8;
  c.num_kv_heads = 2;
  c.head_dim = 32;
  c.rms_norm_eps = 1e-5;
  c.max_context = 4096;
  c.bos_token_id = tokenizer->bos_id();
  c.eos_token_ids = {tokenizer->eos_id()};
  ASSIGN_OR_RETURN(ModelWeights w, DummyWeights(c, {}, absl::GetFlag(FLAGS_seed)));
  // Embedding rows [y_a, sqrt(1 - |y_a|^2)] all have norm 1, so RMSNorm
  // scales every one by sqrt(hidden); the LM head undoes that.
  const float inv_scale = 1.0f / std::sqrt(static_cast<float>(kHidden));
  for (int a = 0; a < vocab; ++a) {
    float* e = w.embed.f32.data() + int64_t{a} * kHidden;
    float* head = w.lm_head.f32.data() + int64_t{a} * kHidden;
    double norm2 = 0;
    for (int j = 0; j < kRank; ++j) {
      e[j] = y[int64_t{a} * kRank + j];
      norm2 += double{e[j]} * e[j];
      head[j] = bt[int64_t{j} * vocab + a] * inv_scale;
    }
    e[kRank] = static_cast<float>(std::sqrt(std::max(0.0, 1.0 - norm2)));
    head[kRank] = 0;
  }
  // Small layer outputs: the layers nudge the bigram rather than drown it.
  for (LayerWeights& l : w.layers) {
    for (float& x : l.o.f32) x *= 0.003f;
    for (float& x : l.down.f32) x *= 0.003f;
  }
  RETURN_IF_ERROR(SaveModel(dir, c, w, DType::kFloat32));
  std::printf("wrote the demo model to %s: vocab %d, %d layers, hidden %d, %d corpus tokens\n",
              dir.c_str(), vocab, c.num_layers, kHidden, static_cast<int>(tokens));
  return absl::OkStatus();
}

}  // namespace
}  // namespace chunkattn

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("chunkattn-make-demo-model DIR: writes the built-in demo model");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() != 2) {
    std::fprintf(stderr, "usage: chunkattn-make-demo-model DIR [--corpus FILE]\n");
    return 2;
  }
  const absl::Status st = chunkattn::Run(args[1]);
  if (!st.ok()) {
    std::fprintf(stderr, "chunkattn-make-demo-model: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}
