// Deterministic random numbers and elementary functions (the codec's rotations and codebooks, the
// synthetic KV data).
//
// Rotations, codebooks and synthetic data must regenerate bit-identically on any machine and
// compiler, so nothing here uses <random> distributions or libm transcendentals: only IEEE basic
// operations (+ - * / sqrt, exactly rounded), frexp/ldexp (exact) and fixed-length series, in a
// fixed evaluation order (the project compiles with -ffp-contract=off).
#ifndef TQKV_SRC_COMMON_PRNG_H_
#define TQKV_SRC_COMMON_PRNG_H_

#include <cstdint>

namespace tqkv {

// One SplitMix64 step: advances *state and returns the mixed output.
uint64_t SplitMix64(uint64_t* state);

// A seed for a sub-stream, e.g. DeriveSeed(spec_seed, subset_index): SplitMix64 mixing of both.
uint64_t DeriveSeed(uint64_t seed, uint64_t a);
uint64_t DeriveSeed(uint64_t seed, uint64_t a, uint64_t b, uint64_t c);

// xoshiro256** seeded by four SplitMix64 outputs of `seed`.
class Prng {
 public:
  explicit Prng(uint64_t seed);

  uint64_t Next();
  // Uniform in [0, 1) with 53 (double) or 24 (float) random bits.
  double UniformDouble() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }
  float UniformFloat() { return static_cast<float>(Next() >> 40) * 0x1.0p-24f; }
  // Standard normal by the Marsaglia polar method (pairs; the second value is kept for the next
  // call). Uses DetLog and std::sqrt only.
  double Gaussian();

 private:
  uint64_t s_[4];
  double spare_ = 0.0;
  bool has_spare_ = false;
};

// Natural logarithm for x > 0 (finite): frexp reduction to [sqrt(1/2), sqrt(2)), then
// 2*atanh((m-1)/(m+1)) by a 16-term series. Relative error ~1e-16. Returns -inf for 0, NaN for
// negative or NaN input.
double DetLog(double x);
// e^x: reduction by ln 2, 24-term Taylor series, ldexp. 0 below -745, +inf above 709.8.
double DetExp(double x);
// sin and cos of x (|x| < 1e9): reduction modulo 2*pi (two-part constant), Taylor series.
void DetSinCos(double x, double* s, double* c);

}  // namespace tqkv

#endif  // TQKV_SRC_COMMON_PRNG_H_
