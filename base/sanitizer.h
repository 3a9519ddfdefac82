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

// Whether this build runs under ThreadSanitizer, which looks for races in how
// work is split between threads, not for what each thread computes: a test
// sweeping shapes and dtypes may run a corner of its sweep there (the split
// is the same code for every dtype and head dim).
#if defined(__SANITIZE_THREAD__)
inline constexpr bool kThreadSanitizerBuild = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
inline constexpr bool kThreadSanitizerBuild = true;
#else
inline constexpr bool kThreadSanitizerBuild = false;
#endif
#else
inline constexpr bool kThreadSanitizerBuild = false;
#endif

// `n` in the plain build; n / divisor (at least 1) in a sanitizer build.
constexpr int SanitizerSlice(int n, int divisor) { return kSanitizerBuild ? std::max(1, n / divisor) : n; }

}  // namespace chunkattn

#endif  // CHUNKATTN_BASE_SANITIZER_H_
