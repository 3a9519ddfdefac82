// Whether this build runs under a sanitizer: cmake/Common.cmake defines
// CHUNKATTN_SANITIZER_BUILD for every target of a CHUNKATTN_SANITIZE build
// (clang defines no __SANITIZE_*__ macros, so the build says it). Tests size
// their randomized work down there with SanitizerSlice: a sanitizer build
// looks for memory errors, undefined behaviour and races, which a slice of a
// walk meets as the whole walk does, at 2-15x the cost per step; the plain
// build runs the whole.
#ifndef CHUNKATTN_BASE_SANITIZER_H_
#define CHUNKATTN_BASE_SANITIZER_H_

#include <algorithm>

namespace chunkattn {

#if defined(CHUNKATTN_SANITIZER_BUILD)
inline constexpr bool kSanitizerBuild = true;
#else
inline constexpr bool kSanitizerBuild = false;
#endif

// `n` in the plain build; n / divisor (at least 1) in a sanitizer build.
constexpr int SanitizerSlice(int n, int divisor) { return kSanitizerBuild ? std::max(1, n / divisor) : n; }

}  // namespace chunkattn

#endif  // CHUNKATTN_BASE_SANITIZER_H_
