// The online-softmax state of attention over a set of keys, and its merge.
//
// For one query q and keys/values {(k_t, v_t)}, with scores s_t = scale * q.k_t:
//   m = max_t s_t,   n = sum_t exp(s_t - m),   o = sum_t exp(s_t - m) v_t   (o is NOT divided by n)
// and attention = o / n. States over disjoint key sets merge associatively and
// commutatively (Eqn 2 of the ChunkAttention paper), which is what lets the
// chunk-first phase, split KV and prefix/suffix (cascade) attention compose.
// The empty state is (o = 0, m = -inf, n = 0) and is the identity of Merge.
#ifndef CHUNKATTN_KERNELS_API_ATTENTION_STATE_H_
#define CHUNKATTN_KERNELS_API_ATTENTION_STATE_H_

#include <cmath>
#include <limits>

#include "kernels/api/kv_layout.h"  // CHUNKATTN_HOST_DEVICE

namespace chunkattn {

inline constexpr float kEmptyStateMax = -std::numeric_limits<float>::infinity();

// Merges state b = (o_b[0..d), m_b, n_b) into state a = (o_a[0..d), *m_a, *n_a).
// Either may be empty. o_a and o_b may not alias.
template <typename T>
CHUNKATTN_HOST_DEVICE inline void MergeState(T* o_a, T* m_a, T* n_a, const T* o_b, T m_b, T n_b,
                                             int d) {
  if (n_b == T(0)) return;  // b empty
  if (*n_a == T(0)) {       // a empty
    for (int i = 0; i < d; ++i) o_a[i] = o_b[i];
    *m_a = m_b;
    *n_a = n_b;
    return;
  }
  const T m = *m_a > m_b ? *m_a : m_b;
  const T x = std::exp(m_b - m);   // weight of b
  const T y = std::exp(*m_a - m);  // weight of a
  for (int i = 0; i < d; ++i) o_a[i] = x * o_b[i] + y * o_a[i];
  *n_a = x * n_b + y * *n_a;
  *m_a = m;
}

}  // namespace chunkattn

#endif  // CHUNKATTN_KERNELS_API_ATTENTION_STATE_H_
