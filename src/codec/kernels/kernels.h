// Kernel layer of the codec: plain functions over spans, one table per SIMD level.
//
// The scalar reference (ref.cc) is the source of truth; every SIMD kernel produces bit-identical
// codes AND bit-identical decoded floats. That is possible because the reference fixes the order
// of every floating-point operation (no FMA contraction: the project builds with -ffp-contract=off):
//
//   Sum8(v[0..m)):  acc[k] = 0 for k in 0..7; for i in 0..m-1: acc[i % 8] += v[i] * v[i]
//                   (a product rounded to float, then added); then
//                   ((acc0 + acc4) + (acc2 + acc6)) + ((acc1 + acc5) + (acc3 + acc7)).
//   Fwht(y[0..m)):  unnormalised, in place, stages h = 1, 2, 4, ..., m/2 in that order; in each
//                   stage, for every pair (i, i + h) with (i & h) == 0: (a, b) -> (a + b, a - b).
//   MatVec(M, x):   y = 0; for i in 0..m-1: for j: y[j] = fma(M[j][i], x[i], y[j])   (std::fma,
//                   i.e. column-by-column accumulation; M given as its transpose, row-major).
//   KronMix(M, x):  m = q * B, M q*q given as its transpose Mt, row-major; for a in 0..q-1, b in
//                   0..B-1: acc = 0; for a' in 0..q-1: acc = fma(Mt[a'][a], x[a' * B + b], acc);
//                   y[a * B + b] = acc   (std::fma; y = (M (x) I_B) x).
//
// Encoding one subset vector x[0..m) (already converted to float and gathered):
//   ss = Sum8(x^2); norm = sqrtf(ss)
//   if norm == 0 or !isfinite(norm): every index 0; stored norm = +0 (zero vector) or NaN
//   (the quiet NaN 0x7FC00000, f16 0x7E00, so every table writes the same bytes).
//   Hadamard:  y = Fwht(signs1 * x)                       (sign multiply by +-1.0f is exact)
//   Hadamard2: y = Fwht(signs2 * Fwht(signs1 * x))
//   Haar:      y = MatVec(Q, x)
//   Kronecker: t = signs1 * x; Fwht of each block t[a * B .. a * B + B); y = KronMix(Q_q, t)
//   s = enc_scale / norm;  z[j] = y[j] * s                 (z ~ N(0,1) per coordinate)
//   idx[j] = number of thresholds t_k with t_k < z[j]      (strict; NaN gives 0)
//   stored norm = norm, or with norm correction norm * sqrtf(float(m) / Sum8(centroid[idx]^2))
//   stored as f32 (memcpy, little-endian) or f16 (FloatToHalf)
//   planes: plane p (p = 0..bits-1) is ceil(m/8) bytes; bit (j % 8) of byte j / 8 = bit p of idx[j]
//
// Decoding: n = stored norm (f16 -> HalfToFloat); a = n * dec_scale; v[j] = centroid[idx[j]] * a
//   Hadamard:  out = signs1 * Fwht(v)
//   Hadamard2: out = signs1 * Fwht(signs2 * Fwht(v))
//   Haar:      out = MatVec(Q^T, v)
//   Kronecker: u = KronMix(Q_q^T, v); Fwht of each block of u; out = signs1 * u
// enc_scale/dec_scale are per rotation kind (computed in double, rounded to float once):
//   Hadamard: 1 and 1/m;  Hadamard2: 1/sqrt(m) and 1/(m*sqrt(m));  Haar: sqrt(m) and 1/sqrt(m);
//   Kronecker: sqrt(m/B) and 1/sqrt(m*B).
#ifndef TQKV_SRC_CODEC_KERNELS_KERNELS_H_
#define TQKV_SRC_CODEC_KERNELS_KERNELS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tqkv/codec.h"
#include "tqkv/simd.h"
#include "tqkv/types.h"

namespace tqkv::kernels {

// Everything a kernel needs to encode or decode one subset; built once by the codec.
struct SubsetPlan {
  uint32_t dim = 0;           // m: channels of the subset
  uint32_t bits = 0;          // 1..8
  RotationKind rotation = RotationKind::kHadamard;
  uint32_t block = 0;         // Kronecker: B (a power of two dividing m)
  const float* signs1 = nullptr;     // m entries of +-1.0f (Hadamard, Hadamard2, Kronecker)
  const float* signs2 = nullptr;     // m entries (Hadamard2)
  // Q^T row-major: row i = column i of Q (encode). Haar: m*m; Kronecker: Q_q, q*q (q = m / B).
  const float* haar_t = nullptr;
  // Q row-major (decode uses Q^T x = sum_j x_j Q[j]). Haar: m*m; Kronecker: q*q.
  const float* haar = nullptr;
  const float* centroids = nullptr;  // 2^bits ascending (unit-variance domain)
  const float* thresholds = nullptr; // 2^bits - 1 midpoints: t_k = 0.5f * (c_k + c_{k+1})
  float enc_scale = 1.0f;
  float dec_scale = 1.0f;
  bool norm_correction = false;
  DType norm_dtype = DType::kF32;    // kF32 or kF16

  size_t plane_bytes() const { return (dim + 7) / 8; }
  size_t planes_bytes() const { return bits * plane_bytes(); }
};

// A split codec's two subsets (subset 0: the outlier channels the group mask marks) and where
// their bytes sit within one code.
struct SplitPlan {
  SubsetPlan sub[2];
  size_t norm_offset[2] = {0, 0};
  size_t planes_offset[2] = {0, 0};
};

// One Hadamard block of the transform codec's decode row (docs/codec.md §11): its columns
// [offset, offset + dim) of the row, dim a power of two >= 8, and its dim signs.
struct TransformBlock {
  size_t offset = 0;
  uint32_t dim = 0;
  const float* signs = nullptr;
};

// Where a transform codec block's indices are: its Hadamard plan (Vectorised or not) and the
// offset of its bit planes within a code.
struct TransformCodeBlock {
  const SubsetPlan* plan = nullptr;
  size_t planes_offset = 0;
};

struct KernelTable {
  const char* name;
  // dst[i] = float(src[i]) for n elements.
  void (*to_f32)(const void* src, DType dtype, size_t n, float* dst);
  // dst[i] = dtype(src[i]) for n elements, round to nearest even.
  void (*from_f32)(const float* src, size_t n, DType dtype, void* dst);
  // Encodes n vectors: vector i is x + i * x_stride (plan.dim floats); its norm goes to
  // norm_out + i * code_stride (4 or 2 bytes) and its planes to planes_out + i * code_stride.
  void (*encode)(const SubsetPlan& plan, const float* x, size_t x_stride, size_t n,
                 uint8_t* norm_out, uint8_t* planes_out, size_t code_stride);
  // Inverse of encode: vector i goes to out + i * out_stride (plan.dim floats).
  void (*decode)(const SubsetPlan& plan, const uint8_t* norm_in, const uint8_t* planes_in,
                 size_t code_stride, size_t n, float* out, size_t out_stride);
  // Split codecs, n vectors of d floats (vector i at x + i * x_stride): the channels the mask
  // marks (ceil(d/8) bytes, bit c % 8 of byte c / 8; exactly m0 set, none >= d), ascending, go to
  // out0 + i * m0, the others, ascending, to out1 + i * m1. Pure data movement. out0 and out1 need
  // kSplitSlack floats of room after their last vector (SIMD tables store whole registers).
  void (*split_gather)(const float* x, size_t x_stride, size_t n, const uint8_t* mask, size_t d,
                       float* out0, size_t m0, float* out1, size_t m1);
  // The inverse: channel c of vector i from in0/in1 as above (the same slack, for reads).
  void (*split_scatter)(const float* in0, size_t m0, const float* in1, size_t m1, size_t n,
                        const uint8_t* mask, size_t d, float* x, size_t x_stride);
  // Split codecs, fused per vector (d = sub[0].dim + sub[1].dim channels; vector i at
  // x + i * x_stride elements of dtype): the same bytes as to_f32, split_gather and encode of
  // each subset, vector i's subset s going to code + i * code_stride + norm_offset[s] /
  // planes_offset[s].
  void (*split_encode)(const SplitPlan& plan, const void* x, DType dtype, size_t x_stride,
                       size_t n, const uint8_t* mask, uint8_t* code, size_t code_stride);
  // The inverse: the same elements as decode of each subset, split_scatter and from_f32.
  void (*split_decode)(const SplitPlan& plan, const uint8_t* code, size_t code_stride, size_t n,
                       const uint8_t* mask, void* x, DType dtype, size_t x_stride);
  // SelectGroupMeta's channel energies: for i = 0..n-1 in order, energy[c] += double(x_ic)^2 for
  // every channel c < d, x_ic channel c of vector i (at x + i * stride elements of dtype)
  // converted to float; the product of two floats' doubles is exact, so each step is one
  // rounding of the add, and every table gives the same sums bit for bit.
  void (*channel_energy)(const void* x, DType dtype, size_t n, size_t stride, size_t d,
                         double* energy);
  // Mean-removed keys: x_i[j] += scale[i] * mean[j] for n vectors of d floats (vector i at
  // x + i * x_stride); the product is rounded, then added (no fma), so every table agrees bit
  // for bit with the reference and with the CUDA decoder.
  void (*add_scaled)(const float* mean, const float* scale, size_t n, size_t d, float* x,
                     size_t x_stride);
  // Optional (null: EncodeFrom / DecodeTo below go through to_f32 / from_f32 and a float buffer):
  // encode with the conversion fused, vector i of dtype at x + i * x_stride elements; the same
  // bytes as to_f32 of each vector, then encode.
  void (*encode_from)(const SubsetPlan& plan, const void* x, DType dtype, size_t x_stride,
                      size_t n, uint8_t* norm_out, uint8_t* planes_out, size_t code_stride);
  // Optional: decode, then (mean not null) add_scaled(mean, scale, ...), then from_f32 to vector
  // i at out + i * out_stride elements of dtype, without a float buffer between them.
  void (*decode_to)(const SubsetPlan& plan, const uint8_t* norm_in, const uint8_t* planes_in,
                    size_t code_stride, size_t n, const float* mean, const float* scale,
                    void* out, DType dtype, size_t out_stride);
  // The transform codec's assembly (docs/codec.md §11): for n vectors and d channels,
  // out[i * out_stride + c] = a[c] * norms[i] + b[c] * row[i * row_stride + from[c]], each product
  // rounded, then the sum (no fma). from[c] < row_stride.
  void (*gather_affine)(const float* row, size_t row_stride, const uint32_t* from, const float* a,
                        const float* b, const float* norms, size_t n, size_t d, float* out,
                        size_t out_stride);
  // Optional, both or neither (null: the transform codec decodes each block, then gather_affine):
  // dequantize is decode of a Hadamard plan without its rotation, v[j] = centroid[idx[j]] * a
  // (a = stored norm * dec_scale), vector i to out + i * out_stride.
  void (*dequantize)(const SubsetPlan& plan, const uint8_t* norm_in, const uint8_t* planes_in,
                     size_t code_stride, size_t n, float* out, size_t out_stride);
  // Then for n rows (row i at row + i * row_stride, changed in place): each block's columns
  // become Fwht(v) * signs, as decode rotates them; then gather_affine of the rows into out.
  void (*transform_assemble)(float* row, size_t row_stride, const TransformBlock* blocks,
                             size_t nblocks, const uint32_t* from, const float* a, const float* b,
                             const float* norms, size_t n, size_t d, float* out,
                             size_t out_stride);
  // Optional (null: the two above, add_scaled and from_f32): the transform codec's whole decode
  // of n codes (code i at code + i * code_stride, norms[i] its stored norm as a float), the same
  // elements as dequantize of each block k (*code_blocks[k].plan, its planes at
  // code_blocks[k].planes_offset, into row positions blocks[k].offset..), transform_assemble
  // with row_stride d, add_scaled (mean not null), then from_f32 to vector i at
  // out + i * out_stride elements of dtype, without a float buffer between them. False, having
  // written nothing, for a shape it does not take: the caller then goes the route above.
  bool (*transform_decode)(const uint8_t* code, size_t code_stride,
                           const TransformCodeBlock* code_blocks, const TransformBlock* blocks,
                           size_t nblocks, const uint32_t* from, const float* a, const float* b,
                           const float* norms, size_t n, size_t d, const float* mean,
                           const float* scale, void* out, DType dtype, size_t out_stride);
  // The transform codec's block encode (every table; NEON: the reference's), encode with every
  // vector's norm taken as 1 (nothing divided by it, no norm stored): the planes of vector i
  // (x + i * x_stride, plan.dim floats) to planes_out + i * code_stride, the same bits as the
  // reference's rotation, enc_scale multiply, Quantize and PackPlanes.
  void (*encode_unit)(const SubsetPlan& plan, const float* x, size_t x_stride, size_t n,
                      uint8_t* planes_out, size_t code_stride);
  // The transform codec's whitening (every table) of n vectors of d floats
  // (vector i at x + i * x_stride): norms[i] = sqrt(Sum8(x_i^2)), then for r < rows
  // w[i * w_stride + r] = (x_i[channel[r]] / norms[i] - mean[r]) / scale[r], each operation
  // rounded as written, or 0 where scale[r] is not above 0 (channel[r] < d).
  void (*whiten)(const float* x, size_t x_stride, size_t n, size_t d, const uint32_t* channel,
                 const float* mean, const float* scale, size_t rows, float* norms, float* w,
                 size_t w_stride);
  // The transform codec's unit-vector moments (every table). For i = 0..n-1
  // in order, vector i of d floats at x + i * x_stride with n_i = sqrt(Sum8(x_i^2)) finite and
  // above 0 (others are skipped): u = double(x_ic / n_i) (the quotient in float), s1[c] += u,
  // s2[c] += u * u (the product rounded, then the add) for c < d, ++*count and
  // *largest = max(*largest, n_i).
  void (*unit_moments)(const float* x, size_t x_stride, size_t n, size_t d, double* s1,
                       double* s2, size_t* count, float* largest);
};
inline constexpr size_t kSplitSlack = 8;

// Encode n vectors of any dtype with table k: its encode_from, or to_f32 + encode in batches.
void EncodeFrom(const KernelTable& k, const SubsetPlan& plan, const void* x, DType dtype,
                size_t x_stride, size_t n, uint8_t* norm_out, uint8_t* planes_out,
                size_t code_stride);
// Decode n vectors to any dtype with table k (mean/scale: null, or the key means to add): its
// decode_to, or decode + add_scaled + from_f32 in batches. Both routes give the same bytes.
void DecodeTo(const KernelTable& k, const SubsetPlan& plan, const uint8_t* norm_in,
              const uint8_t* planes_in, size_t code_stride, size_t n, const float* mean,
              const float* scale, void* out, DType dtype, size_t out_stride);

// Split codecs batch-wise through table k: kSplitChunk vectors converted and gathered, then each
// subset encoded (or decoded, scattered and converted) by k's kernels. The split_encode /
// split_decode of tables without a fused route for the plan.
void SplitEncodeBatched(const KernelTable& k, const SplitPlan& sp, const void* x, DType dtype,
                        size_t x_stride, size_t n, const uint8_t* mask, uint8_t* code,
                        size_t code_stride);
void SplitDecodeBatched(const KernelTable& k, const SplitPlan& sp, const uint8_t* code,
                        size_t code_stride, size_t n, const uint8_t* mask, void* x, DType dtype,
                        size_t x_stride);

// Scalar reference: always built.
const KernelTable& ScalarKernels();
// AVX2+FMA+F16C kernels, or null when not built or not supported by this CPU. They handle any plan
// (falling back to the reference internally for shapes they do not vectorise).
const KernelTable* Avx2Kernels();
// AVX-512 (F, BW, VL, DQ) kernels, or null when this CPU lacks them; shapes they do not vectorise
// go to the AVX2 kernels. Two builds of them give the same bits: on Intel CPUs the one whose FWHT
// does every in-register stage as an fma (`avx512-fma8`), elsewhere the one that moves a stage to
// the adders (`avx512`, faster on AMD Zen 4).
const KernelTable* Avx512Kernels();
// Both AVX-512 tables, the one Avx512Kernels() picks first (tests, benchmarks); empty without
// AVX-512.
std::vector<const KernelTable*> Avx512KernelVariants();
// Arm NEON kernels: the table on AArch64 (NEON is part of the base ISA), null elsewhere. They handle
// any plan as the AVX2 table does.
const KernelTable* NeonKernels();
const KernelTable& KernelsFor(SimdLevel level);
// The table for ActiveSimdLevel().
const KernelTable& ActiveKernels();

// Reference primitives (also used by the codec outside the hot path and by tests).
namespace ref {
float Sum8Squares(const float* v, size_t m);
void Fwht(float* y, size_t m);  // m a power of two
void MatVecT(const float* mt, const float* x, size_t m, float* y);  // y = M x, mt = M^T row-major
// y = (M (x) I_block) x for m = q * block, mt = M^T (q*q row-major); y and x must not overlap.
void KronMix(const float* mt, const float* x, size_t q, size_t block, float* y);
uint32_t Quantize(float z, const float* thresholds, uint32_t bits);
void GatherAffine(const float* row, size_t row_stride, const uint32_t* from, const float* a,
                  const float* b, const float* norms, size_t n, size_t d, float* out,
                  size_t out_stride);
void Dequantize(const SubsetPlan& plan, const uint8_t* norm_in, const uint8_t* planes_in,
                size_t code_stride, size_t n, float* out, size_t out_stride);
void TransformAssemble(float* row, size_t row_stride, const TransformBlock* blocks, size_t nblocks,
                       const uint32_t* from, const float* a, const float* b, const float* norms,
                       size_t n, size_t d, float* out, size_t out_stride);
void PackPlanes(const uint8_t* idx, size_t m, uint32_t bits, uint8_t* planes);
void UnpackPlanes(const uint8_t* planes, size_t m, uint32_t bits, uint8_t* idx);
}  // namespace ref

}  // namespace tqkv::kernels

#endif  // TQKV_SRC_CODEC_KERNELS_KERNELS_H_
