#include "common/prng.h"

#include <array>
#include <cmath>
#include <limits>

namespace tqkv {
namespace {

inline uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

constexpr double kLn2Hi = 6.93147180369123816490e-01;  // ln 2, high 32 bits of the mantissa
constexpr double kLn2Lo = 1.90821492927058770002e-10;  // ln 2 - kLn2Hi
constexpr double kLn2 = 0.6931471805599453094;
constexpr double kTwoPiHi = 6.28318530717958623200e+00;  // 2*pi rounded to double
constexpr double kTwoPiLo = 2.44929359829470635446e-16;  // 2*pi - kTwoPiHi
constexpr double kPi = 3.14159265358979323846;

}  // namespace

uint64_t SplitMix64(uint64_t* state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t DeriveSeed(uint64_t seed, uint64_t a) {
  uint64_t s = seed;
  const uint64_t h = SplitMix64(&s);
  s = h ^ (a * 0xD1B54A32D192ED03ull + 0x8CB92BA72F3D8DD7ull);
  return SplitMix64(&s);
}

uint64_t DeriveSeed(uint64_t seed, uint64_t a, uint64_t b, uint64_t c) {
  return DeriveSeed(DeriveSeed(DeriveSeed(seed, a), b), c);
}

Prng::Prng(uint64_t seed) {
  uint64_t sm = seed;
  for (auto& w : s_) w = SplitMix64(&sm);
}

uint64_t Prng::Next() {
  const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = Rotl(s_[3], 45);
  return result;
}

double Prng::Gaussian() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  double u, v, s;
  do {
    u = 2.0 * UniformDouble() - 1.0;
    v = 2.0 * UniformDouble() - 1.0;
    s = u * u + v * v;
  } while (s >= 1.0 || s == 0.0);
  const double mul = std::sqrt(-2.0 * DetLog(s) / s);
  spare_ = v * mul;
  has_spare_ = true;
  return u * mul;
}

double DetLog(double x) {
  if (std::isnan(x) || x < 0.0) return std::numeric_limits<double>::quiet_NaN();
  if (x == 0.0) return -std::numeric_limits<double>::infinity();
  if (std::isinf(x)) return x;
  int e = 0;
  double m = std::frexp(x, &e);  // x = m * 2^e, m in [0.5, 1)
  if (m < 0.70710678118654752440) {
    m *= 2.0;
    e -= 1;
  }
  // log(m) = 2 atanh(t), t = (m - 1) / (m + 1), |t| <= 0.1716: 16 odd terms reach < 1e-25.
  const double t = (m - 1.0) / (m + 1.0);
  const double t2 = t * t;
  // 1/(2k+1) for k = 0..15, computed once by IEEE division (the same bits as dividing inline).
  static const auto kInvOdd = [] {
    std::array<double, 16> a{};
    for (int k = 0; k < 16; ++k) a[k] = 1.0 / (2 * k + 1);
    return a;
  }();
  double sum = 0.0;
  for (int k = 15; k >= 0; --k) sum = sum * t2 + kInvOdd[k];
  const double log_m = 2.0 * t * sum;
  const double de = static_cast<double>(e);
  return (de * kLn2Hi + log_m) + de * kLn2Lo;
}

double DetExp(double x) {
  if (std::isnan(x)) return x;
  if (x < -745.2) return 0.0;
  if (x > 709.78) return std::numeric_limits<double>::infinity();
  const double k = std::floor(x / kLn2 + 0.5);
  const double r = (x - k * kLn2Hi) - k * kLn2Lo;  // |r| <= 0.35
  double sum = 1.0;
  for (int n = 24; n >= 1; --n) sum = 1.0 + sum * r / n;
  return std::ldexp(sum, static_cast<int>(k));
}

void DetSinCos(double x, double* s, double* c) {
  const double k = std::floor(x / kTwoPiHi + 0.5);
  double r = (x - k * kTwoPiHi) - k * kTwoPiLo;  // about [-pi, pi]
  // Reduce to [-pi/2, pi/2] using sin(pi - r) = sin r, cos(pi - r) = -cos r.
  double csign = 1.0;
  if (r > kPi / 2) {
    r = kPi - r;
    csign = -1.0;
  } else if (r < -kPi / 2) {
    r = -kPi - r;
    csign = -1.0;
  }
  const double r2 = r * r;
  // Taylor series to x^27 / x^26: truncation < 1e-17 for |r| <= pi/2.
  // Reciprocals of the Taylor denominators (2n)(2n+1) and (2n-1)(2n), by IEEE division once.
  static const auto kInv = [] {
    std::array<std::array<double, 2>, 14> a{};
    for (int n = 1; n <= 13; ++n) {
      a[n][0] = 1.0 / ((2 * n) * (2 * n + 1));
      a[n][1] = 1.0 / ((2 * n - 1) * (2 * n));
    }
    return a;
  }();
  double sn = 0.0, cs = 0.0;
  for (int n = 13; n >= 1; --n) {
    sn = 1.0 - sn * r2 * kInv[n][0];
    cs = 1.0 - cs * r2 * kInv[n][1];
  }
  *s = r * sn;
  *c = csign * cs;
}

}  // namespace tqkv
