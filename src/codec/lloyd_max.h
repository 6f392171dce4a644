// Lloyd-Max scalar quantizers for one coordinate of a random unit vector in R^m, in the
// unit-variance domain z = x * sqrt(m): density f(z) ~ (1 - z^2/m)^((m-3)/2) on |z| < sqrt(m)
// (docs/turboquant.md §1.1, §2.1). As m grows this tends to N(0, 1).
#ifndef TQKV_SRC_CODEC_LLOYD_MAX_H_
#define TQKV_SRC_CODEC_LLOYD_MAX_H_

#include <cstdint>
#include <memory>
#include <vector>

namespace tqkv::codec {

struct Codebook {
  uint32_t dim = 0;
  uint32_t bits = 0;
  std::vector<double> centroids;  // 2^bits, ascending, symmetric about 0 (unit-variance domain)
  double mse = 0.0;  // E(z - c(z))^2 = D_mse for unit vectors (E|x - x~|^2 with |x| = 1)
  int iterations = 0;
};

// SolveLloydMax's codebook for dimension m >= 3 and 1 <= bits <= 8, cached; m = 2^20 (the
// Gaussian limit the transform codec uses) from a table of its results (lloyd_max_gaussian.inc).
// Thread-safe. Null for arguments out of range.
std::shared_ptr<const Codebook> LloydMaxCodebook(uint32_t m, uint32_t bits);
// Solves: piecewise linear density on a 2^18-interval grid over [-L, L], L = min(sqrt(m), 16);
// exact integrals of f, z f, z^2 f per interval; Lloyd iterations from equiprobable quantiles
// until max |delta c| < 1e-12 (at most 100000 iterations). Deterministic. Null for arguments out
// of range.
std::shared_ptr<const Codebook> SolveLloydMax(uint32_t m, uint32_t bits);

}  // namespace tqkv::codec

#endif  // TQKV_SRC_CODEC_LLOYD_MAX_H_
