#include "tqkv/units.h"

#include <cctype>
#include <string>

namespace tqkv {
namespace {

using U128 = unsigned __int128;

constexpr const char* kSizeHelp =
    "a whole number of bytes, optionally with a unit: KB MB GB TB PB (powers of 1000), "
    "KiB MiB GiB TiB PiB or K M G T P (powers of 1024), e.g. 512MiB or 50GB";
constexpr const char* kDurationHelp =
    "a number with an optional unit ms, s, m, h or d (none: seconds), e.g. 90s, 1.5h, 7d";

// "DIGITS[.DIGITS]" at the start of `text`: the value as a fraction num / den (den = 10^k).
struct Decimal {
  U128 num = 0;
  U128 den = 1;
  size_t end = 0;  // first character after the number
};

bool ParseDecimal(std::string_view text, Decimal* out) {
  // 10^23 * 2^50 (PiB, the largest multiplier) < 2^127: num * multiplier cannot wrap.
  constexpr int kMaxDigits = 23;
  int digits = 0;
  size_t i = 0;
  bool any = false;
  auto take = [&](bool fraction) {
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') {
      if (++digits > kMaxDigits) return false;
      out->num = out->num * 10 + static_cast<unsigned>(text[i] - '0');
      if (fraction) out->den *= 10;
      ++i;
      any = true;
    }
    return true;
  };
  if (!take(false)) return false;
  if (!any) return false;  // no leading digit: "", ".5", "-1", "+1", "inf", "nan"
  if (i < text.size() && text[i] == '.') {
    ++i;
    const size_t before = i;
    if (!take(true) || i == before) return false;  // "1." is not a number
  }
  out->end = i;
  return true;
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Bytes per unit; 0 when the unit is not one.
U128 SizeMultiplier(std::string_view unit) {
  const std::string u = Lower(unit);
  if (u.empty() || u == "b") return 1;
  static constexpr char kPrefixes[] = "kmgtp";
  for (int p = 0; p < 5; ++p) {
    const char c = kPrefixes[p];
    U128 si = 1, iec = 1;
    for (int k = 0; k <= p; ++k) {
      si *= 1000;
      iec *= 1024;
    }
    if (u == std::string{c, 'b'}) return si;
    if (u == std::string{c} || u == std::string{c, 'i', 'b'}) return iec;
  }
  return 0;
}

// Nanoseconds per unit; 0 when the unit is not one.
U128 DurationMultiplier(std::string_view unit) {
  const std::string u = Lower(unit);
  constexpr U128 kSecond = 1'000'000'000;
  if (u.empty() || u == "s") return kSecond;
  if (u == "ms") return kSecond / 1000;
  if (u == "m") return 60 * kSecond;
  if (u == "h") return 3600 * kSecond;
  if (u == "d") return 86400 * kSecond;
  return 0;
}

std::string Quoted(std::string_view text) {
  std::string out = "\"";
  for (char c : text.substr(0, 64)) {
    const auto u = static_cast<unsigned char>(c);
    out += (u >= 0x20 && u < 0x7F) ? c : '?';
  }
  if (text.size() > 64) out += "...";
  return out + "\"";
}

}  // namespace

Result<uint64_t> ParseByteSize(std::string_view text, uint64_t min, uint64_t max) {
  Decimal d;
  const U128 mult = ParseDecimal(text, &d) ? SizeMultiplier(text.substr(d.end)) : 0;
  if (mult == 0) {
    return Status::InvalidArgument("not a byte size: " + Quoted(text) + " (expected " + kSizeHelp +
                                   ")");
  }
  const U128 scaled = d.num * mult;
  if (scaled % d.den != 0) {
    return Status::InvalidArgument("not a whole number of bytes: " + Quoted(text));
  }
  const U128 bytes = scaled / d.den;
  if (bytes < min || bytes > max) {
    return Status::InvalidArgument("byte size " + Quoted(text) + " out of range [" +
                                   std::to_string(min) + ", " + std::to_string(max) + "]");
  }
  return static_cast<uint64_t>(bytes);
}

Result<std::chrono::nanoseconds> ParseDuration(std::string_view text,
                                               std::chrono::nanoseconds min) {
  Decimal d;
  const U128 mult = ParseDecimal(text, &d) ? DurationMultiplier(text.substr(d.end)) : 0;
  if (mult == 0) {
    return Status::InvalidArgument("not a duration: " + Quoted(text) + " (expected " +
                                   kDurationHelp + ")");
  }
  const U128 ns = d.num * mult / d.den;  // sub-nanosecond digits are dropped
  if (ns > static_cast<U128>(kMaxDuration.count()) || ns < static_cast<U128>(min.count())) {
    return Status::InvalidArgument("duration " + Quoted(text) + " out of range [" +
                                   std::to_string(min.count() / 1'000'000'000) +
                                   " s, 100 years]");
  }
  return std::chrono::nanoseconds(static_cast<int64_t>(ns));
}

Result<uint64_t> ParseCount(std::string_view text, uint64_t min, uint64_t max) {
  Decimal d;
  if (!ParseDecimal(text, &d) || d.end != text.size() || d.den != 1) {
    return Status::InvalidArgument("not a count: " + Quoted(text) +
                                   " (expected decimal digits, e.g. 16)");
  }
  if (d.num < min || d.num > max) {
    return Status::InvalidArgument("count " + Quoted(text) + " out of range [" +
                                   std::to_string(min) + ", " + std::to_string(max) + "]");
  }
  return static_cast<uint64_t>(d.num);
}

}  // namespace tqkv
