#include "text/utf8.h"

#include <algorithm>
#include <cstdint>

namespace chunkattn {
namespace {

bool IsContinuation(uint8_t byte) { return (byte & 0xC0) == 0x80; }

// Bytes in the character `lead` starts (2 to 4), with the allowed range of the
// second byte; 0 when `lead` cannot start a multi-byte character (ASCII, a
// continuation byte, C0, C1 or F5..FF).
int SequenceLength(uint8_t lead, uint8_t* second_lo, uint8_t* second_hi) {
  *second_lo = 0x80;
  *second_hi = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) {
    if (lead == 0xE0) *second_lo = 0xA0;  // below: overlong
    if (lead == 0xED) *second_hi = 0x9F;  // above: surrogates
    return 3;
  }
  if (lead >= 0xF0 && lead <= 0xF4) {
    if (lead == 0xF0) *second_lo = 0x90;  // below: overlong
    if (lead == 0xF4) *second_hi = 0x8F;  // above: > U+10FFFF
    return 4;
  }
  return 0;
}

// Whether bytes [1, n) of the character starting at `seq` are acceptable
// continuation bytes (n <= its length).
bool ContinuationsOk(const uint8_t* seq, size_t n, uint8_t second_lo, uint8_t second_hi) {
  for (size_t k = 1; k < n; ++k) {
    if (k == 1 ? (seq[k] < second_lo || seq[k] > second_hi) : !IsContinuation(seq[k])) {
      return false;
    }
  }
  return true;
}

}  // namespace

bool IsValidUtf8(std::string_view text) {
  const auto* p = reinterpret_cast<const uint8_t*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    uint8_t lo, hi;
    const int len = SequenceLength(p[i], &lo, &hi);
    if (len == 0 || i + len > n || !ContinuationsOk(p + i, len, lo, hi)) return false;
    i += len;
  }
  return true;
}

size_t IncompleteUtf8SuffixLength(std::string_view bytes) {
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  const size_t n = bytes.size();
  // A lead byte is never a continuation byte, so at most one position can
  // start an incomplete character: find it among the last three bytes.
  for (size_t tail = std::min<size_t>(3, n); tail >= 1; --tail) {
    const uint8_t* seq = p + (n - tail);
    uint8_t lo, hi;
    const int len = SequenceLength(seq[0], &lo, &hi);
    if (len > static_cast<int>(tail) && ContinuationsOk(seq, tail, lo, hi)) return tail;
  }
  return 0;
}

size_t CommonUtf8PrefixLength(std::string_view a, std::string_view b) {
  size_t n = 0;
  const size_t limit = std::min(a.size(), b.size());
  while (n < limit && a[n] == b[n]) ++n;
  while (n > 0 && n < b.size() && IsContinuation(static_cast<uint8_t>(b[n]))) --n;
  return n;
}

}  // namespace chunkattn
