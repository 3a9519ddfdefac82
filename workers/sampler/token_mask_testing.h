// Test helpers for token masks (SampleInput::allowed): random masks of the
// shapes a grammar gives, and the row a mask must be equivalent to.
#ifndef CHUNKATTN_WORKERS_SAMPLER_TOKEN_MASK_TESTING_H_
#define CHUNKATTN_WORKERS_SAMPLER_TOKEN_MASK_TESTING_H_

#include <algorithm>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "workers/sampler/sampler.h"

namespace chunkattn::sampler_testing {

// Whether `mask` allows token t (an empty mask allows all).
inline bool MaskAllows(const std::vector<uint32_t>& mask, int t) {
  const size_t w = static_cast<size_t>(t) / 32;
  return mask.empty() || (w < mask.size() && ((mask[w] >> (t % 32)) & 1u) != 0);
}

// A mask for `vocab` tokens that allows at least one of them: dense (7/8 of
// the tokens), sparse (1 to 5 tokens), all ones (bits past the vocabulary
// set too) or random words; a third of them shorter than the vocabulary's
// words, so the tokens past them are not allowed.
inline std::vector<uint32_t> RandomTokenMask(int vocab, std::mt19937& rng) {
  const size_t words = (static_cast<size_t>(vocab) + 31) / 32;
  std::vector<uint32_t> mask(words, 0);
  auto allow = [&mask](int t) { mask[t / 32] |= uint32_t{1} << (t % 32); };
  switch (rng() % 4) {
    case 0:
      for (int t = 0; t < vocab; ++t) {
        if (rng() % 8 != 0) allow(t);
      }
      break;
    case 1:
      for (int k = 1 + static_cast<int>(rng() % 5); k > 0; --k) allow(static_cast<int>(rng() % vocab));
      break;
    case 2:
      std::fill(mask.begin(), mask.end(), ~uint32_t{0});
      break;
    default:
      for (uint32_t& w : mask) w = static_cast<uint32_t>(rng());
      break;
  }
  if (words > 1 && rng() % 3 == 0) mask.resize(1 + rng() % (words - 1));
  if (!AllowsSomeToken(mask, vocab)) {
    allow(static_cast<int>(rng() % std::min<size_t>(vocab, mask.size() * 32)));
  }
  return mask;
}

// `row` with every token `mask` does not allow at -inf: what a sampler given
// the mask must see.
inline std::vector<float> MaskedByHand(std::vector<float> row, const std::vector<uint32_t>& mask) {
  for (int t = 0; t < static_cast<int>(row.size()); ++t) {
    if (!MaskAllows(mask, t)) row[t] = -std::numeric_limits<float>::infinity();
  }
  return row;
}

}  // namespace chunkattn::sampler_testing

#endif  // CHUNKATTN_WORKERS_SAMPLER_TOKEN_MASK_TESTING_H_
