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

std::string ReplaceInvalidUtf8(std::string_view bytes) {
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  const size_t n = bytes.size();
  std::string out;
  out.reserve(n);
  size_t i = 0;
  while (i < n) {
    if (p[i] < 0x80) {
      out.push_back(static_cast<char>(p[i++]));
      continue;
    }
    uint8_t lo, hi;
    const int len = SequenceLength(p[i], &lo, &hi);
    // The longest prefix of a character that is still acceptable.
    size_t good = len == 0 ? 0 : 1;
    while (good > 0 && good < static_cast<size_t>(len) && i + good < n &&
           ContinuationsOk(p + i, good + 1, lo, hi)) {
      ++good;
    }
    if (len > 0 && good == static_cast<size_t>(len)) {
      out.append(bytes.data() + i, len);
      i += len;
    } else {
      out += "\xEF\xBF\xBD";
      i += std::max<size_t>(good, 1);
    }
  }
  return out;
}

std::pair<char32_t, int> CodePointAt(std::string_view text, size_t i) {
  const auto b = static_cast<uint8_t>(text[i]);
  if (b < 0x80) return {b, 1};
  const int len = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
  char32_t cp = b & (0xFF >> (len + 1));
  for (int k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<uint8_t>(text[i + k]) & 0x3F);
  return {cp, len};
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
    return;
  }
  const int len = cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
  static constexpr uint8_t kLead[] = {0, 0, 0xC0, 0xE0, 0xF0};
  char buf[4];
  for (int k = len - 1; k > 0; --k, cp >>= 6) buf[k] = static_cast<char>(0x80 | (cp & 0x3F));
  buf[0] = static_cast<char>(kLead[len] | cp);
  out->append(buf, len);
}

size_t CommonUtf8PrefixLength(std::string_view a, std::string_view b) {
  size_t n = 0;
  const size_t limit = std::min(a.size(), b.size());
  while (n < limit && a[n] == b[n]) ++n;
  while (n > 0 && n < b.size() && IsContinuation(static_cast<uint8_t>(b[n]))) --n;
  return n;
}

}  // namespace chunkattn
