// Checked arithmetic for sizes computed from user input or file fields: a product that does not
// fit is an error (ResourceExhausted naming what was being sized), never a wrapped, small buffer.
#ifndef TQKV_INCLUDE_TQKV_CHECKED_H_
#define TQKV_INCLUDE_TQKV_CHECKED_H_

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <string_view>

#include "tqkv/status.h"

namespace tqkv {

// *out = a * b; false (and *out unspecified) when the product does not fit 64 bits.
inline bool CheckedMul(uint64_t a, uint64_t b, uint64_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}

// The product of `factors` as a byte count no allocator could refuse for its size alone (at most
// PTRDIFF_MAX); ResourceExhausted "<what>: a x b x ... bytes do not fit in memory" otherwise.
inline Result<uint64_t> SizeProduct(std::string_view what, std::initializer_list<uint64_t> factors) {
  uint64_t p = 1;
  bool fits = true;
  for (uint64_t f : factors) fits = fits && CheckedMul(p, f, &p);
  if (fits && p <= static_cast<uint64_t>(std::numeric_limits<std::ptrdiff_t>::max())) return p;
  std::string msg(what);
  msg += ": ";
  bool first = true;
  for (uint64_t f : factors) {
    msg += (first ? "" : " x ") + std::to_string(f);
    first = false;
  }
  return Status::ResourceExhausted(msg + " bytes do not fit in memory");
}

}  // namespace tqkv

#endif  // TQKV_INCLUDE_TQKV_CHECKED_H_
