// The CPU attention kernels, written once over an 8-lane vector type S
// (simd_avx2.h or simd_portable.h) and a storage tag D (storage.h).
// Included by exactly one translation unit per ISA. Everything is a template
// on S, so each ISA's copy has its own symbols: a helper compiled with AVX2
// can never be picked by the linker for the portable path.
#ifndef CHUNKATTN_KERNELS_CPU_INTERNAL_KERNELS_IMPL_H_
#define CHUNKATTN_KERNELS_CPU_INTERNAL_KERNELS_IMPL_H_

#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "kernels/cpu/packed_layout.h"
#include "kernels/cpu/int8_layout.h"
#include "kernels/cpu/internal/int8_tile.h"
#include "kernels/cpu/internal/kernels.h"
#include "kernels/cpu/internal/storage.h"

namespace chunkattn::cpu::internal {

template <class S>
struct Impl {
  using V = typename S::V;
  static constexpr int L = S::kLanes;
  static constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  static constexpr int kMaxNaiveHeadDim = 256;

  static int64_t Up8(int64_t x) { return (x + 7) / 8 * 8; }

  // dst[0..n) = src[0..n) as fp32; n is a multiple of 8.
  template <class D>
  static void Convert(const typename D::T* src, float* dst, int64_t n) {
    for (int64_t i = 0; i < n; i += L) S::Store(dst + i, S::LoadKv(src + i, D{}));
  }

  // st[j][m0 .. m0 + NV*8) for rows j0 .. j0+R of kf:
  //   st[j][m] = sum_k kf[j][k] * qt[k][m]
  // kf: (R, d) with row stride d; qt: (d, mp); st: rows of mp.
  template <int R, int NV>
  static void ScoreTile(const float* kf, int d, const float* qt, int64_t mp, float* st) {
    V acc[R][NV];
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < NV; ++v) acc[r][v] = S::Zero();
    for (int k = 0; k < d; ++k) {
      V b[NV];
      for (int v = 0; v < NV; ++v) b[v] = S::Load(qt + k * mp + v * L);
      for (int r = 0; r < R; ++r) {
        const V a = S::Set1(kf[r * d + k]);
        for (int v = 0; v < NV; ++v) acc[r][v] = S::Fma(a, b[v], acc[r][v]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < NV; ++v) S::Store(st + r * mp + v * L, acc[r][v]);
  }

  // Tiles of kTileRows rows keep 12 accumulators, 2 streamed vectors and one
  // broadcast in the 16 AVX2 registers.
  static constexpr int kTileRows = 6;

  template <int NV>
  static void ScoreColumns(const float* kf, int t, int d, const float* qt, int64_t mp, float* st) {
    int j = 0;
    for (; j + kTileRows <= t; j += kTileRows) ScoreTile<kTileRows, NV>(kf + j * d, d, qt, mp, st + j * mp);
    switch (t - j) {
      case 5: ScoreTile<5, NV>(kf + j * d, d, qt, mp, st + j * mp); break;
      case 4: ScoreTile<4, NV>(kf + j * d, d, qt, mp, st + j * mp); break;
      case 3: ScoreTile<3, NV>(kf + j * d, d, qt, mp, st + j * mp); break;
      case 2: ScoreTile<2, NV>(kf + j * d, d, qt, mp, st + j * mp); break;
      case 1: ScoreTile<1, NV>(kf + j * d, d, qt, mp, st + j * mp); break;
      default: break;
    }
  }

  // acc[m0 + r][db .. db + 16) = acc * alpha[m0 + r] + sum_j p[j][m0 + r] * v[j][db ..]
  // for r < R. p: (t, mp) probabilities (transposed), v: (t, d) as stored, acc: (mp, d).
  // V is converted on the fly: a chunk of it stays in L1 across row tiles.
  template <int R, class D>
  static void PvTile(const float* p, int64_t mp, const typename D::T* v, int d, int t, const float* alpha,
                     float* acc) {
    V o[R][2];
    for (int r = 0; r < R; ++r) {
      const V al = S::Set1(alpha[r]);
      o[r][0] = S::Mul(S::Load(acc + r * d), al);
      o[r][1] = S::Mul(S::Load(acc + r * d + L), al);
    }
    for (int j = 0; j < t; ++j) {
      const V b0 = S::LoadKv(v + j * d, D{});
      const V b1 = S::LoadKv(v + j * d + L, D{});
      for (int r = 0; r < R; ++r) {
        const V a = S::Set1(p[j * mp + r]);
        o[r][0] = S::Fma(a, b0, o[r][0]);
        o[r][1] = S::Fma(a, b1, o[r][1]);
      }
    }
    for (int r = 0; r < R; ++r) {
      S::Store(acc + r * d, o[r][0]);
      S::Store(acc + r * d + L, o[r][1]);
    }
  }

  // Chunk-first / prefill: see BlockArgs.
  template <class D>
  static void Block(const BlockArgs& a) {
    using T = typename D::T;
    const int d = a.kv.head_dim;
    const int c = a.kv.chunk_size;
    const int g = a.group;
    const int rows = a.row_groups * g;
    const int64_t mp = Up8(rows);
    float* qt = a.scratch;     // (d, mp) scaled queries, transposed
    float* kf = qt + d * mp;          // (c, d) K of the current chunk in fp32, for broadcasts
    float* st = kf + int64_t{c} * d;  // (c, mp) scores, then probabilities
    float* acc = st + c * mp;         // (mp, d) unnormalized output
    float* mcol = acc + mp * d;       // (mp) running max
    float* ncol = mcol + mp;          // (mp) running sum
    float* alpha = ncol + mp;         // (mp) rescale of the previous state

    for (int row = 0; row < mp; ++row) {
      const float* q = row < rows ? a.q + (row / g) * a.q_stride + (row % g) * d : nullptr;
      for (int k = 0; k < d; ++k) qt[k * mp + row] = q ? q[k] * a.scale : 0.0f;
    }
    std::memset(acc, 0, sizeof(float) * mp * d);
    for (int64_t row = 0; row < mp; ++row) {
      mcol[row] = kNegInf;
      ncol[row] = 0;
    }
    const int64_t last_q_pos = a.q_pos0 + a.row_groups - 1;
    const T* kbase = static_cast<const T*>(a.kv.k) + a.kv.head_offset;
    const T* vbase = static_cast<const T*>(a.kv.v) + a.kv.head_offset;

    for (int e = 0; e < a.list.count; ++e) {
      const int64_t key0 = int64_t{e} * c;
      if (a.causal && key0 > last_q_pos) break;
      const int t = a.list.tokens[e];
      const int64_t chunk = a.list.chunks[e];
      Convert<D>(kbase + chunk * a.kv.chunk_stride, kf, int64_t{t} * d);
      const T* vc = vbase + chunk * a.kv.chunk_stride;

      int64_t m0 = 0;
      for (; m0 + 2 * L <= mp; m0 += 2 * L) ScoreColumns<2>(kf, t, d, qt + m0, mp, st + m0);
      if (m0 < mp) ScoreColumns<1>(kf, t, d, qt + m0, mp, st + m0);

      if (a.causal && key0 + t - 1 > a.q_pos0) {  // some key lies after some query
        for (int j = 0; j < t; ++j) {
          for (int row = 0; row < rows; ++row) {
            if (key0 + j > a.q_pos0 + row / g) st[j * mp + row] = kNegInf;
          }
        }
      }

      // Online softmax per column (query row), eight columns at a time.
      for (int64_t col = 0; col < mp; col += L) {
        const V m_old = S::Load(mcol + col);
        V mx = m_old;
        for (int j = 0; j < t; ++j) mx = S::Max(mx, S::Load(st + j * mp + col));
        V sum = S::Zero();
        for (int j = 0; j < t; ++j) {
          const V p = S::Exp(S::Sub(S::Load(st + j * mp + col), mx));
          S::Store(st + j * mp + col, p);
          sum = S::Add(sum, p);
        }
        const V al = S::Exp(S::Sub(m_old, mx));  // 0 while the state is empty
        S::Store(alpha + col, al);
        S::Store(ncol + col, S::Fma(S::Load(ncol + col), al, sum));
        S::Store(mcol + col, mx);
      }

      for (int db = 0; db < d; db += 2 * L) {
        int row = 0;
        for (; row + kTileRows <= rows; row += kTileRows)
          PvTile<kTileRows, D>(st + row, mp, vc + db, d, t, alpha + row, acc + row * d + db);
        float* out = acc + row * d + db;
        switch (rows - row) {
          case 5: PvTile<5, D>(st + row, mp, vc + db, d, t, alpha + row, out); break;
          case 4: PvTile<4, D>(st + row, mp, vc + db, d, t, alpha + row, out); break;
          case 3: PvTile<3, D>(st + row, mp, vc + db, d, t, alpha + row, out); break;
          case 2: PvTile<2, D>(st + row, mp, vc + db, d, t, alpha + row, out); break;
          case 1: PvTile<1, D>(st + row, mp, vc + db, d, t, alpha + row, out); break;
          default: break;
        }
      }
    }

    for (int row = 0; row < rows; ++row) {
      const int ag = row / g;
      const int r = row % g;
      float* o = a.o + ag * a.o_stride + r * d;
      const float* src = acc + row * d;
      if (a.normalize) {
        const V inv = S::Set1(1.0f / ncol[row]);
        for (int k = 0; k < d; k += L) S::Store(o + k, S::Mul(S::Load(src + k), inv));
      } else {
        std::memcpy(o, src, sizeof(float) * d);
        a.m[ag * a.st_stride + r] = mcol[row];
        a.n[ag * a.st_stride + r] = ncol[row];
      }
    }
  }

  // s[j] = dot(q, k_j) for j < t; q already scaled. k: (t, d) stored as D.
  template <class D>
  static void Scores(const float* q, const typename D::T* k, int64_t t, int d, float* s) {
    int64_t j = 0;
    for (; j + 4 <= t; j += 4) {
      V a0 = S::Zero(), a1 = S::Zero(), a2 = S::Zero(), a3 = S::Zero();
      const typename D::T* k0 = k + j * d;
      for (int i = 0; i < d; i += L) {
        const V qv = S::Load(q + i);
        a0 = S::Fma(qv, S::LoadKv(k0 + i, D{}), a0);
        a1 = S::Fma(qv, S::LoadKv(k0 + d + i, D{}), a1);
        a2 = S::Fma(qv, S::LoadKv(k0 + 2 * d + i, D{}), a2);
        a3 = S::Fma(qv, S::LoadKv(k0 + 3 * d + i, D{}), a3);
      }
      S::HSum4(a0, a1, a2, a3, s + j);
    }
    for (; j < t; ++j) {
      V a0 = S::Zero();
      for (int i = 0; i < d; i += L) a0 = S::Fma(S::Load(q + i), S::LoadKv(k + j * d + i, D{}), a0);
      s[j] = S::HSum(a0);
    }
  }

  // Turns scores s[0..t) into exp(s - mx) in place and returns their sum.
  // s has room for t rounded up to 8; the padding is set to -inf first.
  static float ExpInPlace(float* s, int64_t t, float mx) {
    const int64_t tp = Up8(t);
    for (int64_t j = t; j < tp; ++j) s[j] = kNegInf;
    const V vmx = S::Set1(mx);
    V sum = S::Zero();
    for (int64_t j = 0; j < tp; j += L) {
      const V p = S::Exp(S::Sub(S::Load(s + j), vmx));
      S::Store(s + j, p);
      sum = S::Add(sum, p);
    }
    return S::HSum(sum);
  }

  static float MaxOf(const float* s, int64_t t, float init) {
    float mx = init;
    int64_t j = 0;
    if (t >= L) {
      V v = S::Load(s);
      for (j = L; j + L <= t; j += L) v = S::Max(v, S::Load(s + j));
      const float h = S::HMax(v);
      mx = h > mx ? h : mx;
    }
    for (; j < t; ++j) mx = s[j] > mx ? s[j] : mx;
    return mx;
  }

  static float ScalarExp(float x) { return S::HMax(S::Exp(S::Set1(x))); }

  // o[0..d) = o * alpha + sum_j p[j] * v_j, v: (t, d) stored as D. Strips
  // of up to 64 dims keep their accumulators in registers, so V is swept in
  // d / 64 passes (each reading whole cache lines) rather than d / 16.
  template <int NV, class D>
  static void PvStrip(const float* p, const typename D::T* v, int64_t t, int d, float alpha, float* o) {
    const V al = S::Set1(alpha);
    V acc[NV];
    for (int i = 0; i < NV; ++i) acc[i] = S::Mul(S::Load(o + i * L), al);
    for (int64_t j = 0; j < t; ++j) {
      const V pj = S::Set1(p[j]);
      for (int i = 0; i < NV; ++i) acc[i] = S::Fma(pj, S::LoadKv(v + j * d + i * L, D{}), acc[i]);
    }
    for (int i = 0; i < NV; ++i) S::Store(o + i * L, acc[i]);
  }

  template <class D>
  static void AccumulatePv(const float* p, const typename D::T* v, int64_t t, int d, float alpha,
                           float* o) {
    int db = 0;
    for (; db + 8 * L <= d; db += 8 * L) PvStrip<8, D>(p, v + db, t, d, alpha, o + db);
    switch ((d - db) / L) {  // d is a multiple of 16
      case 6: PvStrip<6, D>(p, v + db, t, d, alpha, o + db); break;
      case 4: PvStrip<4, D>(p, v + db, t, d, alpha, o + db); break;
      case 2: PvStrip<2, D>(p, v + db, t, d, alpha, o + db); break;
      default: break;
    }
  }

  // Sequence-first: see SeqArgs.
  template <class D>
  static void Seq(const SeqArgs& a) {
    using T = typename D::T;
    const int d = a.kv.head_dim;
    const int c = a.kv.chunk_size;
    float* qs = a.scratch;               // (group, d) scaled queries
    float* s = qs + int64_t{a.group} * d;  // (group, c + 8) scores / probabilities
    const int64_t s_stride = c + 8;
    for (int64_t i = 0; i < int64_t{a.group} * d; ++i) qs[i] = a.q[i] * a.scale;
    const T* kbase = static_cast<const T*>(a.kv.k) + a.kv.head_offset;
    const T* vbase = static_cast<const T*>(a.kv.v) + a.kv.head_offset;

    for (int li = 0; li < a.num_lists; ++li) {
      const ChunkList& list = a.lists[li];
      for (int e = 0; e < list.count; ++e) {
        const int t = list.tokens[e];
        const int64_t chunk = list.chunks[e];
        const T* k = kbase + chunk * a.kv.chunk_stride;
        const T* v = vbase + chunk * a.kv.chunk_stride;
        for (int r = 0; r < a.group; ++r) {
          float* sr = s + r * s_stride;
          Scores<D>(qs + r * d, k, t, d, sr);
          const float mx = MaxOf(sr, t, a.m[r]);
          const float alpha = ScalarExp(a.m[r] - mx);  // 0 while empty
          const float sum = ExpInPlace(sr, t, mx);
          a.n[r] = a.n[r] * alpha + sum;
          a.m[r] = mx;
          AccumulatePv<D>(sr, v, t, d, alpha, a.o + r * d);
        }
      }
    }
    for (int r = 0; r < a.group; ++r) {
      const V inv = S::Set1(1.0f / a.n[r]);
      float* o = a.o + r * d;
      for (int k = 0; k < d; k += L) S::Store(o + k, S::Mul(S::Load(o + k), inv));
    }
  }

  // Naive pass 1: every score of the group's query heads.
  template <class D>
  static void NaiveScores(const NaiveArgs& a) {
    const int d = a.head_dim;
    float qs[kMaxNaiveHeadDim];
    for (int r = 0; r < a.group; ++r) {
      for (int i = 0; i < d; ++i) qs[i] = a.q[r * d + i] * a.scale;
      Scores<D>(qs, static_cast<const typename D::T*>(a.k), a.len, d, a.scores + r * a.score_stride);
    }
  }

  // Naive pass 2: each score row becomes probabilities.
  static void NaiveSoftmax(const NaiveArgs& a) {
    for (int r = 0; r < a.group; ++r) {
      float* s = a.scores + r * a.score_stride;
      const float sum = ExpInPlace(s, a.len, MaxOf(s, a.len, kNegInf));
      const V inv = S::Set1(1.0f / sum);
      for (int64_t j = 0; j < a.len; j += L) S::Store(s + j, S::Mul(S::Load(s + j), inv));
    }
  }

  // Naive pass 3: probabilities times V.
  template <class D>
  static void NaivePv(const NaiveArgs& a) {
    for (int r = 0; r < a.group; ++r) {
      float* o = a.o + r * a.head_dim;
      std::memset(o, 0, sizeof(float) * a.head_dim);
      AccumulatePv<D>(a.scores + r * a.score_stride, static_cast<const typename D::T*>(a.v), a.len, a.head_dim,
                      1.0f, o);
    }
  }

  // c(r0 .. r0+R, j0 .. j0+J) of LinearArgs: J weight rows against R
  // activation rows, one accumulator each (J * R <= 8 keeps them, the J
  // weight vectors and an activation vector in 16 registers). J > 1 gives a
  // single row several independent FMA chains. Int8 weights are widened and
  // scaled by their block's scale, once per vector for all R rows.
  template <class D, int R, int J>
  static void LinearTile(const LinearArgs& a, int r0, int64_t j0) {
    const auto* w = static_cast<const typename D::T*>(a.w) + j0 * a.k;
    V acc[R][J];
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < J; ++j) acc[r][j] = S::Zero();
    auto step = [&](const V (&wv)[J], int64_t i) {
      for (int r = 0; r < R; ++r) {
        const V x = S::Load(a.a + (r0 + r) * a.a_stride + i);
        for (int j = 0; j < J; ++j) acc[r][j] = S::Fma(x, wv[j], acc[r][j]);
      }
    };
    if constexpr (std::is_same_v<D, I8>) {
      const int64_t nb = a.k / a.block;
      const uint16_t* sc = a.scales + j0 * nb;
      for (int64_t b = 0; b < nb; ++b) {
        V s[J];
        for (int j = 0; j < J; ++j) s[j] = S::Set1(HalfToFloat(sc[j * nb + b]));
        for (int64_t i = b * a.block, end = i + a.block; i < end; i += L) {
          V wv[J];
          for (int j = 0; j < J; ++j) wv[j] = S::Mul(S::LoadI8(w + j * a.k + i), s[j]);
          step(wv, i);
        }
      }
    } else if (a.packed) {
      // Packed rows (packed_layout.h; J == 4, j0 a multiple of 4): the
      // tile's four rows are one stream, the same values in the same order,
      // which the prefetchers follow unaided.
      static_assert(L == kPackCols, "the packed layout holds 8 columns a row at a time");
      const auto* p = static_cast<const typename D::T*>(a.w) + j0 * a.k;
      for (int64_t i = 0; i < a.k; i += L) {
        V wv[J];
        for (int j = 0; j < J; ++j) wv[j] = S::LoadKv(p + i * kPackRows + j * L, D{});
        step(wv, i);
      }
    } else {
      // Row-major 16-bit weights: the rows two tiles on as this one streams
      // (1.37x at batch 1 on the 156M model). fp32 streams as fast without
      // (its prefetch measured 1.1x slower).
      const char* next = reinterpret_cast<const char*>(w + 2 * J * a.k);
      for (int64_t i = 0; i < a.k; i += L) {
        if constexpr (sizeof(typename D::T) == 2) {
          for (int l = 0; l < J * L * 2; l += 64) __builtin_prefetch(next + i * J * 2 + l);
        }
        V wv[J];
        for (int j = 0; j < J; ++j) wv[j] = S::LoadKv(w + j * a.k + i, D{});
        step(wv, i);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < J; ++j) a.c[(r0 + r) * a.c_stride + j0 + j] = S::HSum(acc[r][j]);
  }

  // Weight rows in groups of 4, each group against every activation row
  // while it is in L1; the rows two at a time, then one.
  template <class D, int J>
  static void LinearColumns(const LinearArgs& a, int64_t j) {
    int r = 0;
    for (; r + 2 <= a.rows; r += 2) LinearTile<D, 2, J>(a, r, j);
    if (r < a.rows) LinearTile<D, 1, J>(a, r, j);
  }

  // The direct tiles convert a 16-bit or int8 weight vector once per row
  // pair, and converting costs about what the pair's FMAs do. From
  // kConvertOnceRows rows on, a group of 4 weight rows is converted a segment
  // of kSegment columns at a time into an fp32 buffer in L1 that every row
  // then reads; the accumulators wait in memory between segments. Each
  // c(r, j) is the same chain of FMAs on the same values as in the direct
  // tiles, so the result is the same bit for bit.
  static constexpr int kConvertOnceRows = 3;
  static constexpr int64_t kSegment = 512;  // 4 x 512 fp32 = 8 KiB
  static constexpr int kSegmentRows = 32;   // accumulators: 32 x 4 vectors = 4 KiB

  template <class D>
  static void ConvertSegment(const LinearArgs& a, int64_t j, int64_t i0, int64_t len, float* wf) {
    for (int jj = 0; jj < 4; ++jj) {
      const auto* w = static_cast<const typename D::T*>(a.w) + (j + jj) * a.k;
      float* dst = wf + jj * kSegment;
      if constexpr (std::is_same_v<D, I8>) {
        const uint16_t* sc = a.scales + (j + jj) * (a.k / a.block);
        for (int64_t i = 0; i < len; i += L) {
          S::Store(dst + i, S::Mul(S::LoadI8(w + i0 + i), S::Set1(HalfToFloat(sc[(i0 + i) / a.block]))));
        }
      } else if (a.packed) {
        const auto* p = static_cast<const typename D::T*>(a.w) + j * a.k + jj * L;
        for (int64_t i = 0; i < len; i += L) S::Store(dst + i, S::LoadKv(p + (i0 + i) * kPackRows, D{}));
      } else {
        for (int64_t i = 0; i < len; i += L) S::Store(dst + i, S::LoadKv(w + i0 + i, D{}));
      }
    }
  }

  template <int R>
  static void SegmentTile(const LinearArgs& a, int r0, int64_t i0, int64_t len, const float* wf, V (*acc)[4]) {
    V t[R][4];
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < 4; ++j) t[r][j] = acc[r][j];
    for (int64_t i = 0; i < len; i += L) {
      V wv[4];
      for (int j = 0; j < 4; ++j) wv[j] = S::Load(wf + j * kSegment + i);
      for (int r = 0; r < R; ++r) {
        const V x = S::Load(a.a + (r0 + r) * a.a_stride + i0 + i);
        for (int j = 0; j < 4; ++j) t[r][j] = S::Fma(x, wv[j], t[r][j]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < 4; ++j) acc[r][j] = t[r][j];
  }

  template <class D>
  static void LinearConverted(const LinearArgs& a, int64_t j) {
    alignas(32) float wf[4 * kSegment];
    V acc[kSegmentRows][4];
    for (int r0 = 0; r0 < a.rows; r0 += kSegmentRows) {
      const int rn = a.rows - r0 < kSegmentRows ? a.rows - r0 : kSegmentRows;
      for (int r = 0; r < rn; ++r)
        for (int jj = 0; jj < 4; ++jj) acc[r][jj] = S::Zero();
      for (int64_t i0 = 0; i0 < a.k; i0 += kSegment) {
        const int64_t len = a.k - i0 < kSegment ? a.k - i0 : kSegment;
        ConvertSegment<D>(a, j, i0, len, wf);
        int r = 0;
        for (; r + 2 <= rn; r += 2) SegmentTile<2>(a, r0 + r, i0, len, wf, acc + r);
        if (r < rn) SegmentTile<1>(a, r0 + r, i0, len, wf, acc + r);
      }
      for (int r = 0; r < rn; ++r)
        for (int jj = 0; jj < 4; ++jj) a.c[(r0 + r) * a.c_stride + j + jj] = S::HSum(acc[r][jj]);
    }
  }

  // Int8 weights against int16 activations (LinearArgs::aq): R rows times J
  // weight rows, one 32-column group at a time. The group's 32 weights are
  // widened to int16 once for the R rows; each product sum is an exact int32
  // per lane, scaled by the activation group's and the weight block's scales
  // in one FMA:
  //   acc(r, j) = fma(Dot16(w(j, g), aq(r, g)), sa(r, g) * sw(j, b), acc(r, j))
  // over the groups g in order, so every c(r, j) is the same chain whatever R,
  // J and the batch are.
  template <int R, int J>
  static void LinearTile16(const LinearArgs& a, int r0, int64_t j0) {
    const auto* w = static_cast<const int8_t*>(a.w) + j0 * a.k;
    const int64_t nb = a.k / a.block;
    const int64_t ng = a.k / 32;
    const int64_t per = a.block / 32;
    V acc[R][J];
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < J; ++j) acc[r][j] = S::Zero();
    for (int64_t b = 0; b < nb; ++b) {
      float sw[J];
      for (int j = 0; j < J; ++j) sw[j] = HalfToFloat(a.scales[(j0 + j) * nb + b]);
      for (int64_t g = b * per, end = g + per; g < end; ++g) {
        // The weight rows two tiles on, J * 32 bytes a group, as this tile
        // streams its own (rows follow each other in memory). The integer
        // dot's instructions fill the out-of-order window, which leaves few
        // loads in flight; this gave 1.1x at distance 1 and 1.1x more at 2
        // (4: no better), int8 at batch 1 on the 156M model.
        for (int l = 0; l < J * 32; l += 64) __builtin_prefetch(w + 2 * J * a.k + g * J * 32 + l);
        typename S::W16 wv[J];
        for (int j = 0; j < J; ++j) wv[j] = S::LoadW16(w + j * a.k + g * 32);
        for (int r = 0; r < R; ++r) {
          const int16_t* x = a.aq + (r0 + r) * a.k + g * 32;
          const float sa = a.aq_scales[(r0 + r) * ng + g];
          for (int j = 0; j < J; ++j) acc[r][j] = S::Fma(S::Dot16(wv[j], x), S::Set1(sa * sw[j]), acc[r][j]);
        }
      }
    }
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < J; ++j) a.c[(r0 + r) * a.c_stride + j0 + j] = S::HSum(acc[r][j]);
  }

  // LinearTile16 on interleaved rows (LinearArgs::interleaved): per 256
  // columns, each (r, j) sums its 8 blocks' integer dots in the 8 lanes of one
  // int32 vector, then takes them in with one FMA by the blocks' combined
  // scales:
  //   acc(r, j) = fma(float(d(r, j)), sa(r, span) * sw(j, span), acc(r, j))
  // over the spans in order, so every c(r, j) is the same chain whatever R, J
  // and the batch are. A lane's sum of 32 products converts to fp32 with a
  // relative rounding under 2^-24 once past 2^24, far under the weights' 2^-8.
  template <int R, int J>
  static void LinearTile16I(const LinearArgs& a, int r0, int64_t j0) {
    const auto* w = static_cast<const int8_t*>(a.w);
    const int64_t ng = a.k / 32, spans = a.k / kInt8InterleavedSpan;
    V acc[R][J];
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < J; ++j) acc[r][j] = S::Zero();
    for (int64_t sp = 0; sp < spans; ++sp) {
      const int64_t c0 = sp * kInt8InterleavedSpan;
      const int8_t* row[J];
      Int8TileSpan<J>(w, a.scales, j0, sp, a.k, row);
      typename S::I32 d[R][J];
      for (int r = 0; r < R; ++r)
        for (int j = 0; j < J; ++j) d[r][j] = S::ZeroI();
      for (int64_t v = 0; v < 16; ++v) {
        typename S::W8 wv[J];
        for (int j = 0; j < J; ++j) wv[j] = S::LoadW8(row[j] + v * 16);
        for (int r = 0; r < R; ++r) {
          const int16_t* x = a.aq + (r0 + r) * a.k + c0 + v * 16;
          for (int j = 0; j < J; ++j) d[r][j] = S::MaddAcc(d[r][j], wv[j], x);
        }
      }
      for (int r = 0; r < R; ++r) {
        const V sa = S::Load(a.aq_scales + (r0 + r) * ng + sp * 8);
        for (int j = 0; j < J; ++j) {
          const V sw = S::LoadKv(a.scales + (j0 + j) * ng + sp * 8, F16{});
          acc[r][j] = S::Fma(S::ToFloat(d[r][j]), S::Mul(sa, sw), acc[r][j]);
        }
      }
    }
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < J; ++j) a.c[(r0 + r) * a.c_stride + j0 + j] = S::HSum(acc[r][j]);
  }

  // One row: 4 weight rows at a time (4 FMA chains). More rows: 4 rows by 2
  // weight rows, so a widened group serves 4 rows and an activation group 2
  // weight rows (8 accumulators and 4 widened pairs fit the 16 registers).
  template <int J>
  static void LinearRows16(const LinearArgs& a, int64_t j) {
    int r = 0;
    for (; r + 4 <= a.rows; r += 4) LinearTile16<4, J>(a, r, j);
    for (; r + 2 <= a.rows; r += 2) LinearTile16<2, J>(a, r, j);
    if (r < a.rows) LinearTile16<1, J>(a, r, j);
  }

  // Interleaved: one row against 4 weight rows; more, rows in pairs against 2
  // (8 int32 sums, 8 accumulators: 16 registers with the 2 weight vectors).
  static void Linear16I(const LinearArgs& a) {
    int64_t j = a.j0;
    if (a.rows == 1) {
      for (; j + 4 <= a.j1; j += 4) LinearTile16I<1, 4>(a, 0, j);
    } else {
      for (; j + 2 <= a.j1; j += 2) {
        int r = 0;
        for (; r + 2 <= a.rows; r += 2) LinearTile16I<2, 2>(a, r, j);
        if (r < a.rows) LinearTile16I<1, 2>(a, r, j);
      }
    }
    for (; j < a.j1; ++j) {
      int r = 0;
      for (; r + 2 <= a.rows; r += 2) LinearTile16I<2, 1>(a, r, j);
      if (r < a.rows) LinearTile16I<1, 1>(a, r, j);
    }
  }

  static void Linear16(const LinearArgs& a) {
    if (a.interleaved) return Linear16I(a);
    int64_t j = a.j0;
    if (a.rows == 1) {
      for (; j + 4 <= a.j1; j += 4) LinearTile16<1, 4>(a, 0, j);
    } else {
      for (; j + 2 <= a.j1; j += 2) LinearRows16<2>(a, j);
    }
    for (; j < a.j1; ++j) LinearRows16<1>(a, j);
  }

  // See IsaKernels::quantize16.
  static void Quantize16(const float* x, int64_t k, int16_t* q, float* scales) {
    for (int64_t g = 0; g < k / 32; ++g) scales[g] = S::Quantize16(x + g * 32, q + g * 32);
  }
  // The same, q in Int8InterleavedColumn order (column pairs stay adjacent).
  static void Quantize16Interleaved(const float* x, int64_t k, int16_t* q, float* scales) {
    for (int64_t g = 0; g < k / 32; ++g) {
      int16_t t[32];
      scales[g] = S::Quantize16(x + g * 32, t);
      for (int p = 0; p < 16; ++p) std::memcpy(q + Int8InterleavedColumn(g * 32 + 2 * p), t + 2 * p, 2 * sizeof(int16_t));
    }
  }

  template <class D>
  static void Linear(const LinearArgs& a) {
    if constexpr (std::is_same_v<D, I8>) {
      if (a.aq != nullptr) return Linear16(a);
    }
    int64_t j = a.j0;
    if (!std::is_same_v<D, F32> && a.rows >= kConvertOnceRows) {
      for (; j + 4 <= a.j1; j += 4) LinearConverted<D>(a, j);
    }
    for (; j + 4 <= a.j1; j += 4) LinearColumns<D, 4>(a, j);
    for (; j < a.j1; ++j) LinearColumns<D, 1>(a, j);
  }

  static float ToFloat1(uint16_t x, F16) { return HalfToFloat(x); }
  static float ToFloat1(uint16_t x, BF16) { return BFloat16ToFloat(x); }
  static float ToFloat1(float x, F32) { return x; }

  // See WeightRowsArgs.
  template <class D>
  static void WeightRows(const WeightRowsArgs& a) {
    using T = typename D::T;
    if constexpr (!std::is_same_v<D, I8>) {
      if (a.packed) {
        for (int64_t j = a.j0; j < a.j1; ++j) {
          for (int64_t i = 0; i < a.k; i += L) {
            S::Store(a.out + (j - a.j0) * a.k + i, S::LoadKv(static_cast<const T*>(a.w) + PackedIndex(j, i, a.k), D{}));
          }
        }
        return;
      }
    }
    for (int64_t j = a.j0; j < a.j1; ++j) {
      const T* src = static_cast<const T*>(a.w) + j * a.k;
      float* dst = a.out + (j - a.j0) * a.k;
      if constexpr (std::is_same_v<D, I8>) {
        const uint16_t* sc = a.scales + j * (a.k / a.block);
        if (a.interleaved) {
          // Each span back to column order (its column pairs), then scaled as below.
          for (int64_t c0 = 0; c0 < a.k; c0 += kInt8InterleavedSpan) {
            const T* span = static_cast<const T*>(a.w) + Int8SpanOffset(j, c0 / kInt8InterleavedSpan, a.k);
            int8_t t[kInt8InterleavedSpan];
            for (int i = 0; i < kInt8InterleavedSpan; i += 2) std::memcpy(t + i, span + Int8InterleavedColumn(i), 2);
            for (int m = 0; m < 8; ++m) {
              const V sv = S::Set1(HalfToFloat(sc[c0 / 32 + m]));
              for (int i = 0; i < 32; i += L) S::Store(dst + c0 + m * 32 + i, S::Mul(S::LoadI8(t + m * 32 + i), sv));
            }
          }
          continue;
        }
        for (int64_t b0 = 0; b0 < a.k; b0 += a.block) {
          const float s = HalfToFloat(sc[b0 / a.block]);
          const V sv = S::Set1(s);
          int64_t i = b0;
          for (; i + L <= b0 + a.block; i += L) S::Store(dst + i, S::Mul(S::LoadI8(src + i), sv));
          for (; i < b0 + a.block; ++i) dst[i] = static_cast<float>(src[i]) * s;
        }
      } else {
        int64_t i = 0;
        for (; i + L <= a.k; i += L) S::Store(dst + i, S::LoadKv(src + i, D{}));
        for (; i < a.k; ++i) dst[i] = ToFloat1(src[i], D{});
      }
    }
  }

  template <class D>
  static IsaKernels Table() {
    IsaKernels t;
    t.linear = &Linear<D>;
    t.linear_q8 = &Linear<I8>;
    t.quantize16 = &Quantize16;
    t.quantize16_interleaved = &Quantize16Interleaved;
    t.weight_rows = &WeightRows<D>;
    t.weight_rows_q8 = &WeightRows<I8>;
    t.block = &Block<D>;
    t.seq = &Seq<D>;
    t.naive_scores = &NaiveScores<D>;
    t.naive_softmax = &NaiveSoftmax;
    t.naive_pv = &NaivePv<D>;
    return t;
  }
};

}  // namespace chunkattn::cpu::internal

#endif  // CHUNKATTN_KERNELS_CPU_INTERNAL_KERNELS_IMPL_H_
