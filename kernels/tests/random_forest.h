// Random (C, i, j) contexts over a poisoned KV pool, for the attention tests:
// random shared prefixes (runs of chunks with the same range, nested
// splits), ragged private tails, partially filled chunks (shared and
// private), sequences with no private chunk, gaps in the private table.
// Every pool slot no sequence owns holds NaN, so a kernel that reads one
// poisons its output.
#ifndef CHUNKATTN_KERNELS_TESTS_RANDOM_FOREST_H_
#define CHUNKATTN_KERNELS_TESTS_RANDOM_FOREST_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/api/attention.h"
#include "kernels/api/chunk_context.h"

namespace chunkattn::testing {

// A one-layer KV pool with both the stored values and the fp32 originals.
struct TestPool {
  TestPool(DType dtype, int64_t num_chunks, int kv_heads, int chunk_size, int head_dim)
      : original_k(num_chunks * kv_heads * chunk_size * head_dim, std::numeric_limits<float>::quiet_NaN()),
        original_v(original_k.size(), std::numeric_limits<float>::quiet_NaN()),
        k(original_k.size() * DTypeBytes(dtype)),
        v(k.size()) {
    view.k = k.data();
    view.v = v.data();
    view.dtype = dtype;
    view.num_chunks = num_chunks;
    view.num_kv_heads = kv_heads;
    view.chunk_size = chunk_size;
    view.head_dim = head_dim;
    original_view = view;
    original_view.k = original_k.data();
    original_view.v = original_v.data();
    original_view.dtype = DType::kFloat32;
    for (int64_t i = 0; i < static_cast<int64_t>(original_k.size()); ++i) Store(i);
  }
  TestPool(const TestPool&) = delete;
  TestPool& operator=(const TestPool&) = delete;

  // Fills slots [0, tokens) of `chunk` (all heads) with N(0, 1) values.
  void Fill(std::mt19937& rng, int32_t chunk, int tokens) {
    std::normal_distribution<float> normal;
    const int64_t head = int64_t{view.chunk_size} * view.head_dim;
    for (int h = 0; h < view.num_kv_heads; ++h) {
      const int64_t base = (int64_t{chunk} * view.num_kv_heads + h) * head;
      for (int64_t i = base; i < base + int64_t{tokens} * view.head_dim; ++i) {
        original_k[i] = normal(rng);
        original_v[i] = normal(rng);
        Store(i);
      }
    }
  }

  void Store(int64_t i) {
    StoreAs(view.dtype, view.k, i, original_k[i]);
    StoreAs(view.dtype, view.v, i, original_v[i]);
  }

  std::vector<float> original_k, original_v;
  std::vector<uint8_t> k, v;
  KvPoolView view;           // as stored
  KvPoolView original_view;  // the fp32 values before rounding to the dtype
};

struct ForestOptions {
  int max_seqs = 10;
  int max_run = 4;      // shared chunks per tree level
  int max_private = 4;  // private chunks per sequence
};

// Builds a random context whose chunks are distinct random ids of `pool` and
// fills exactly the slots it uses.
inline ChunkContext RandomForest(std::mt19937& rng, TestPool& pool, const ForestOptions& opt) {
  const int c = pool.view.chunk_size;
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  std::vector<int32_t> ids(pool.view.num_chunks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  size_t next_id = 0;
  auto take = [&](int tokens) {
    const int32_t id = ids.at(next_id++);
    pool.Fill(rng, id, tokens);
    return id;
  };

  ChunkContext ctx;
  ctx.chunk_size = c;
  ctx.version = uniform(1, 1000);
  const int n = uniform(1, opt.max_seqs);
  ctx.seq_len.assign(n, 0);
  std::vector<std::vector<std::pair<int32_t, int32_t>>> priv(n);  // (chunk, tokens)

  // Sequences [i, j) share their path so far; `ended` means it finished in a
  // partial shared chunk.
  auto grow = [&](auto&& self, int i, int j) -> void {
    if (j - i >= 2) {
      const int run = uniform(0, opt.max_run);
      for (int r = 0; r < run; ++r) {
        ctx.shared_chunk.push_back(take(c));
        ctx.shared_begin.push_back(i);
        ctx.shared_end.push_back(j);
        ctx.shared_tokens.push_back(c);
        for (int s = i; s < j; ++s) ctx.seq_len[s] += c;
      }
      if (uniform(0, 9) == 0) {  // all of [i, j) end in one partially filled shared chunk
        const int t = uniform(1, c - 1);
        ctx.shared_chunk.push_back(take(t));
        ctx.shared_begin.push_back(i);
        ctx.shared_end.push_back(j);
        ctx.shared_tokens.push_back(t);
        for (int s = i; s < j; ++s) ctx.seq_len[s] += t;
        return;
      }
      // Split into 2 or 3 contiguous non-empty groups.
      const int parts = uniform(2, std::min(3, j - i));
      std::vector<int> cuts;
      while (static_cast<int>(cuts.size()) < parts - 1) {
        const int cut = uniform(i + 1, j - 1);
        if (std::find(cuts.begin(), cuts.end(), cut) == cuts.end()) cuts.push_back(cut);
      }
      std::sort(cuts.begin(), cuts.end());
      int lo = i;
      for (int cut : cuts) {
        self(self, lo, cut);
        lo = cut;
      }
      self(self, lo, j);
      return;
    }
    // A single sequence: private chunks, the last possibly partial. None at
    // all is allowed when the shared path already holds tokens.
    const int s = i;
    const int count = uniform(ctx.seq_len[s] == 0 ? 1 : 0, opt.max_private);
    for (int e = 0; e < count; ++e) {
      const int t = e + 1 == count ? uniform(1, c) : c;
      priv[s].push_back({take(t), t});
      ctx.seq_len[s] += t;
    }
  };
  grow(grow, 0, n);

  // Private table with random gaps between ranges.
  for (int s = 0; s < n; ++s) {
    for (int gap = uniform(0, 2); gap > 0; --gap) {
      ctx.private_chunk.push_back(-1);
      ctx.private_tokens.push_back(0);
    }
    ctx.private_begin.push_back(static_cast<int32_t>(ctx.private_chunk.size()));
    for (auto [chunk, t] : priv[s]) {
      ctx.private_chunk.push_back(chunk);
      ctx.private_tokens.push_back(t);
    }
    ctx.private_end.push_back(static_cast<int32_t>(ctx.private_chunk.size()));
  }
  for (int s = 0; s < n; ++s) ctx.seq_ids.push_back(1000 + s);
  return ctx;
}

// Chunks a context of `opt` can use at most (its pool must be at least this).
inline int64_t MaxForestChunks(const ForestOptions& opt) {
  // Each split level adds at most max_run + 1 chunks per group; a binary-ish
  // tree over n leaves has < 2n groups.
  return int64_t{2} * opt.max_seqs * (opt.max_run + 1) + int64_t{opt.max_seqs} * opt.max_private + 8;
}

inline std::vector<float> RandomVector(std::mt19937& rng, int64_t n, float scale) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> x(n);
  for (float& e : x) e = normal(rng);
  return x;
}

// A prefill batch over `pool`: 1..max_seqs sequences with random matched
// prefixes (0 to 2 chunks and a bit) and new-token counts, on distinct random
// chunks whose slots [0, len) are filled; q is (num_tokens, num_heads, d).
struct PrefillCase {
  PrefillBatch batch;
  std::vector<float> q;
};

inline PrefillCase RandomPrefill(std::mt19937& rng, TestPool& pool, int num_heads, int max_seqs) {
  const int c = pool.view.chunk_size;
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  std::vector<int32_t> ids(pool.view.num_chunks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  PrefillCase pc;
  PrefillBatch& b = pc.batch;
  b.q_begin = {0};
  b.chunk_begin = {0};
  size_t next = 0;
  const int n = uniform(1, max_seqs);
  for (int s = 0; s < n; ++s) {
    const int prefix = uniform(0, 2 * c + 3);
    const int fresh = uniform(1, 2 * c + 5);
    const int len = prefix + fresh;
    for (int e = 0; e < (len + c - 1) / c; ++e) {
      const int32_t id = ids.at(next++);
      pool.Fill(rng, id, std::min(c, len - e * c));
      b.chunk_ids.push_back(id);
    }
    b.prefix_len.push_back(prefix);
    b.q_begin.push_back(b.q_begin.back() + fresh);
    b.chunk_begin.push_back(static_cast<int32_t>(b.chunk_ids.size()));
  }
  pc.q = RandomVector(rng, int64_t{b.num_tokens()} * num_heads * pool.view.head_dim, 1.5f);
  return pc;
}

}  // namespace chunkattn::testing

#endif  // CHUNKATTN_KERNELS_TESTS_RANDOM_FOREST_H_
