// Strict parsers for the sizes, durations and counts users give tqkv (CLI options, store URI
// options). Every one of them goes through here, so one spelling means one value everywhere.
//
// Byte sizes: a whole number or a decimal fraction, then an optional unit (case-insensitive):
//   B or none: bytes; KB MB GB TB PB: powers of 1000 (SI); KiB MiB GiB TiB PiB: powers of 1024
//   (IEC); K M G T P alone: powers of 1024 as well (the reading of dd and of store URIs, where
//   "chunk=64k" must be a multiple of 4096). The result must be a whole number of bytes in range.
// Durations: a number, then ms, s, m, h or d (none: seconds); at most kMaxDuration.
// Counts: decimal digits only (no sign, unit, exponent or fraction).
// No sign, exponent, hexadecimal, whitespace, "inf" or "nan" is accepted anywhere: those are
// errors (InvalidArgument naming the text and what was expected), never a silent 0 or wrap.
#ifndef TQKV_INCLUDE_TQKV_UNITS_H_
#define TQKV_INCLUDE_TQKV_UNITS_H_

#include <chrono>
#include <cstdint>
#include <limits>
#include <string_view>

#include "tqkv/status.h"

namespace tqkv {

// Longest duration accepted: 100 years of 365 days (well inside int64 nanoseconds since 1970).
inline constexpr std::chrono::nanoseconds kMaxDuration =
    std::chrono::hours(24) * 365 * 100;

// "1048576", "64k", "512MiB", "1.5GB", "10TB" -> bytes in [min, max]; InvalidArgument otherwise.
Result<uint64_t> ParseByteSize(std::string_view text, uint64_t min = 0,
                               uint64_t max = std::numeric_limits<uint64_t>::max());

// "90s", "1.5h", "7d", "250ms", "3600" -> nanoseconds in [min, kMaxDuration].
Result<std::chrono::nanoseconds> ParseDuration(
    std::string_view text, std::chrono::nanoseconds min = std::chrono::nanoseconds(0));

// "16" -> 16 when in [min, max]; InvalidArgument otherwise (also for "-1", "1e9", "0x10").
Result<uint64_t> ParseCount(std::string_view text, uint64_t min, uint64_t max);

}  // namespace tqkv

#endif  // TQKV_INCLUDE_TQKV_UNITS_H_
