#include "codec/rotation.h"

#include <cmath>

#include "common/prng.h"

namespace tqkv::codec {

std::vector<float> HadamardSigns(uint64_t seed, uint32_t dim, uint32_t round) {
  Prng prng(DeriveSeed(seed, round));
  std::vector<float> signs(dim);
  uint64_t word = 0;
  for (uint32_t i = 0; i < dim; ++i) {
    if (i % 64 == 0) word = prng.Next();
    signs[i] = ((word >> (i % 64)) & 1u) ? -1.0f : 1.0f;
  }
  return signs;
}

std::vector<float> HaarMatrix(uint64_t seed, uint32_t dim) {
  const size_t m = dim;
  Prng prng(seed);
  // Column-major working copy: a[j * m + i] = G[i][j], so column j is contiguous.
  std::vector<double> a(m * m);
  for (size_t i = 0; i < m; ++i) {
    for (size_t j = 0; j < m; ++j) a[j * m + i] = prng.Gaussian();
  }
  for (size_t j = 0; j < m; ++j) {
    double* v = &a[j * m];
    // Two passes of modified Gram-Schmidt against the finished columns: the second pass removes
    // the rounding residue of the first, so Q is orthogonal to ~1e-15 for any input conditioning.
    for (int pass = 0; pass < 2; ++pass) {
      for (size_t k = 0; k < j; ++k) {
        const double* qk = &a[k * m];
        double dot = 0.0;
        for (size_t i = 0; i < m; ++i) dot += qk[i] * v[i];
        for (size_t i = 0; i < m; ++i) v[i] -= dot * qk[i];
      }
    }
    double ss = 0.0;
    for (size_t i = 0; i < m; ++i) ss += v[i] * v[i];
    // R[j][j] = sqrt(ss) > 0 by construction: Q is the sign-fixed (Haar) factor. A Gaussian matrix
    // is singular with probability 0; ss == 0 cannot happen with a working PRNG.
    const double inv = 1.0 / std::sqrt(ss);
    for (size_t i = 0; i < m; ++i) v[i] *= inv;
  }
  std::vector<float> q(m * m);
  for (size_t i = 0; i < m; ++i) {
    for (size_t j = 0; j < m; ++j) q[i * m + j] = static_cast<float>(a[j * m + i]);
  }
  return q;
}

Rotation MakeRotation(RotationKind kind, uint64_t seed, uint32_t dim) {
  Rotation r;
  r.kind = kind;
  r.dim = dim;
  switch (kind) {
    case RotationKind::kHadamard2:
      r.signs2 = HadamardSigns(seed, dim, 1);
      [[fallthrough]];
    case RotationKind::kHadamard:
      r.signs1 = HadamardSigns(seed, dim, 0);
      break;
    case RotationKind::kHaar:
    case RotationKind::kKronecker: {
      uint32_t n = dim;
      if (kind == RotationKind::kKronecker) {
        r.block = KroneckerBlock(dim);
        r.signs1 = HadamardSigns(seed, dim, 0);
        n = dim / r.block;
      }
      r.q = HaarMatrix(seed, n);
      r.qt.resize(r.q.size());
      for (size_t i = 0; i < n; ++i) {
        for (size_t j = 0; j < n; ++j) r.qt[j * n + i] = r.q[i * n + j];
      }
      break;
    }
    case RotationKind::kAuto:
      break;
  }
  return r;
}

void RotationScales(RotationKind kind, uint32_t m, float* enc, float* dec) {
  const double md = m;
  switch (kind) {
    case RotationKind::kHadamard:
      *enc = 1.0f;
      *dec = static_cast<float>(1.0 / md);
      break;
    case RotationKind::kHadamard2:
      *enc = static_cast<float>(1.0 / std::sqrt(md));
      *dec = static_cast<float>(1.0 / (md * std::sqrt(md)));
      break;
    case RotationKind::kKronecker: {
      // The block FWHTs are unnormalised: |y| = sqrt(B) |x|.
      const double b = KroneckerBlock(m);
      *enc = static_cast<float>(std::sqrt(md / b));
      *dec = static_cast<float>(1.0 / std::sqrt(md * b));
      break;
    }
    default:
      *enc = static_cast<float>(std::sqrt(md));
      *dec = static_cast<float>(1.0 / std::sqrt(md));
      break;
  }
}

}  // namespace tqkv::codec
