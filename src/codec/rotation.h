// Random rotations of one subset: Hadamard sign vectors, dense Haar matrices and the Kronecker
// kind's factors, generated deterministically from (kind, seed, dim) with the project's PRNG.
#ifndef TQKV_SRC_CODEC_ROTATION_H_
#define TQKV_SRC_CODEC_ROTATION_H_

#include <cstdint>
#include <vector>

#include "tqkv/codec.h"

namespace tqkv::codec {

struct Rotation {
  RotationKind kind = RotationKind::kHadamard;
  uint32_t dim = 0;
  uint32_t block = 0;         // Kronecker: B, the largest power of two dividing dim
  std::vector<float> signs1;  // Hadamard, Hadamard2, Kronecker: dim entries of +-1.0f
  std::vector<float> signs2;  // Hadamard2
  std::vector<float> q;       // Haar: Q, dim*dim row-major; Kronecker: Q_q, q*q (q = dim / B)
  std::vector<float> qt;      // the transpose of q, same shape
};

// B of the Kronecker kind: the largest power of two dividing m (m > 0).
inline uint32_t KroneckerBlock(uint32_t m) { return m & (~m + 1u); }

// Sign vector of Hadamard round `round` (0 or 1): bit i % 64 of the (i / 64)-th output of
// Prng(DeriveSeed(seed, round)); bit 1 -> -1.0f.
std::vector<float> HadamardSigns(uint64_t seed, uint32_t dim, uint32_t round);

// Haar-distributed orthogonal matrix Q (dim*dim, row-major, rounded to float): the Q factor of
// G = QR with R's diagonal positive, G[i][j] = the (i*dim + j)-th Gaussian of Prng(seed), computed
// by modified Gram-Schmidt over G's columns in double (with one re-orthogonalisation pass).
std::vector<float> HaarMatrix(uint64_t seed, uint32_t dim);

// Scales applied around the unnormalised transform of a subset of m channels, so that the
// rotated coordinates have unit variance (enc) and decode inverts it (dec); computed in double,
// rounded once. Shared by the CPU codec and the CUDA parameter builder.
void RotationScales(RotationKind kind, uint32_t m, float* enc, float* dec);

// Builds the rotation. kind must be kHadamard/kHadamard2 (dim a power of two), kHaar or
// kKronecker (signs1 = HadamardSigns(seed, dim, 0), q = HaarMatrix(seed, dim / B)).
Rotation MakeRotation(RotationKind kind, uint64_t seed, uint32_t dim);

}  // namespace tqkv::codec

#endif  // TQKV_SRC_CODEC_ROTATION_H_
