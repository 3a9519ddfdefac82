#include "kernels/cpu/reference.h"

#include <algorithm>
#include <cmath>

namespace chunkattn::cpu {

RefState ReferenceState(const double* q, const double* k, const double* v, int64_t len, int d, double scale) {
  std::vector<double> s(len);
  for (int64_t t = 0; t < len; ++t) {
    double dot = 0;
    for (int x = 0; x < d; ++x) dot += q[x] * k[t * d + x];
    s[t] = scale * dot;
  }
  RefState st;
  st.m = *std::max_element(s.begin(), s.end());
  st.o.assign(d, 0.0);
  for (int64_t t = 0; t < len; ++t) {
    const double p = std::exp(s[t] - st.m);
    st.n += p;
    for (int x = 0; x < d; ++x) st.o[x] += p * v[t * d + x];
  }
  return st;
}

void GatherPath(const KvPoolView& kv, const std::vector<int32_t>& chunks, int64_t len, int kv_head,
                std::vector<double>* k, std::vector<double>* v) {
  const int d = kv.head_dim;
  k->assign(len * d, 0.0);
  v->assign(len * d, 0.0);
  for (int64_t pos = 0; pos < len; ++pos) {
    const int64_t chunk = chunks[pos / kv.chunk_size];
    const int64_t base = ((chunk * kv.num_kv_heads + kv_head) * kv.chunk_size + pos % kv.chunk_size) * d;
    for (int x = 0; x < d; ++x) {
      (*k)[pos * d + x] = LoadAs(kv.dtype, kv.k, base + x);
      (*v)[pos * d + x] = LoadAs(kv.dtype, kv.v, base + x);
    }
  }
}

namespace {

// Output row for query `q` (float) over the first `len` keys.
void AttendRow(const float* q, const std::vector<double>& k, const std::vector<double>& v, int64_t len, int d,
               double scale, double* out) {
  std::vector<double> qd(q, q + d);
  const RefState st = ReferenceState(qd.data(), k.data(), v.data(), len, d, scale);
  for (int x = 0; x < d; ++x) out[x] = st.o[x] / st.n;
}

}  // namespace

std::vector<double> ReferenceDecode(const ChunkContext& ctx, const KvPoolView& kv, const AttentionShape& shape,
                                    const float* q) {
  const int H = shape.num_heads, d = shape.head_dim, g = shape.group_size();
  const double scale = shape.EffectiveScale();
  std::vector<double> out(static_cast<size_t>(ctx.num_seqs()) * H * d);
  std::vector<double> k, v;
  for (int s = 0; s < ctx.num_seqs(); ++s) {
    const std::vector<int32_t> chunks = SequenceChunks(ctx, s);
    for (int h = 0; h < shape.num_kv_heads; ++h) {
      GatherPath(kv, chunks, ctx.seq_len[s], h, &k, &v);
      for (int r = 0; r < g; ++r) {
        const int64_t row = int64_t{s} * H + h * g + r;
        AttendRow(q + row * d, k, v, ctx.seq_len[s], d, scale, out.data() + row * d);
      }
    }
  }
  return out;
}

std::vector<double> ReferencePrefill(const PrefillBatch& batch, const KvPoolView& kv, const AttentionShape& shape,
                                     const float* q) {
  const int H = shape.num_heads, d = shape.head_dim, g = shape.group_size();
  const double scale = shape.EffectiveScale();
  std::vector<double> out(static_cast<size_t>(batch.num_tokens()) * H * d);
  std::vector<double> k, v;
  for (int s = 0; s < batch.num_seqs(); ++s) {
    const std::vector<int32_t> chunks(batch.chunk_ids.begin() + batch.chunk_begin[s],
                                      batch.chunk_ids.begin() + batch.chunk_begin[s + 1]);
    const int64_t len = int64_t{batch.prefix_len[s]} + batch.q_begin[s + 1] - batch.q_begin[s];
    for (int h = 0; h < shape.num_kv_heads; ++h) {
      GatherPath(kv, chunks, len, h, &k, &v);
      for (int64_t t = batch.q_begin[s]; t < batch.q_begin[s + 1]; ++t) {
        const int64_t pos = batch.prefix_len[s] + (t - batch.q_begin[s]);
        for (int r = 0; r < g; ++r) {
          const int64_t row = t * H + h * g + r;
          AttendRow(q + row * d, k, v, pos + 1, d, scale, out.data() + row * d);
        }
      }
    }
  }
  return out;
}

}  // namespace chunkattn::cpu
