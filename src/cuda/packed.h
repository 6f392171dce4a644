// Packed layouts and index math shared by the CUDA kernels (.cu) and the host (.cc, tests).
//
// Compiled as C++ by g++ and as CUDA by nvcc: plain structs of fixed-width fields (static_assert'd
// sizes, as ggml shares its block structs with its kernels), and __host__ __device__ inline functions. Nothing here includes a
// tqkv or CUDA header, so the host side builds and is tested without a GPU.
//
// Codes (include/tqkv/codec.h): per vector, the norm of each subset (f32 or f16, subset order),
// then each subset's `bits` bit-planes of ceil(m/8) bytes; bit (j % 8) of plane byte j / 8 is bit p
// of element j's index. Codes chunks are head-major: [kv_head][token][code_bytes].
//
// Warp mapping used by the kernels: one warp per vector; element j of a subset of m channels lives
// in lane j % 32, register j / 32 ("strided"). Then plane p's 32-bit word w (bytes 4w..4w+3) is the
// ballot over register w, and Sum8's accumulator k (i % 8 == k) is fed by lanes k, k+8, k+16, k+24.
#ifndef TQKV_SRC_CUDA_PACKED_H_
#define TQKV_SRC_CUDA_PACKED_H_

#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define TQKV_HD __host__ __device__ __forceinline__
#else
#define TQKV_HD inline
#endif

namespace tqkv::cuda {

// Element types as the kernels see them (not the serialized tqkv::DType values).
enum GpuDType : uint32_t { kGpuF32 = 0, kGpuF16 = 1, kGpuBF16 = 2 };
enum GpuRotation : uint32_t {  // RotationKind
  kGpuHadamard = 1,
  kGpuHadamard2 = 2,
  kGpuHaar = 3,
  kGpuKronecker = 4,
};
enum GpuCodecKind : uint32_t { kGpuRaw = 0, kGpuTurboQuant = 1, kGpuTransform = 2 };

inline constexpr uint32_t kGpuNoTable = 0xFFFFFFFFu;  // table offset of an absent array
inline constexpr uint32_t kGpuMaxHeadDim = 256;         // 8 registers per lane
inline constexpr uint32_t kGpuWarp = 32;

// One subset's parameters; float arrays are offsets (in floats) into the codec's table.
struct GpuSubset {
  uint32_t dim;            // m
  uint32_t bits;           // 1..8
  uint32_t rotation;       // GpuRotation
  uint32_t block;          // kGpuKronecker: B (m = q * B); else 0
  float enc_scale;
  float dec_scale;
  uint32_t norm_offset;    // bytes within one code
  uint32_t planes_offset;  // bytes within one code
  // Table offsets or kGpuNoTable. haar/haar_t: Q and Q^T, m*m (Haar) or q*q (Kronecker).
  uint32_t signs1, signs2, haar, haar_t, centroids, thresholds;
};
static_assert(sizeof(GpuSubset) == 56, "GpuSubset is passed by value to kernels: keep it packed");

// A codec as the kernels need it. Passed by value as a kernel parameter.
struct GpuCodecParams {
  uint32_t kind;             // GpuCodecKind
  uint32_t head_dim;
  uint32_t code_bytes;       // bytes of one encoded vector
  uint32_t meta_bytes;       // group metadata (outlier mask) bytes per (kv, head), 0 when unsplit
  uint32_t num_subsets;      // 1 or 2 (TurboQuant); 0 (raw)
  uint32_t norm_dtype;       // kGpuF32 or kGpuF16
  uint32_t norm_correction;  // 0/1
  uint32_t raw_dtype;        // raw codec: stored element type
  GpuSubset subsets[2];
  uint32_t table_floats;     // size of the table
  uint32_t reserved;
  const float* table;        // device (or host, for emulation) pointer to the table
};
static_assert(sizeof(GpuSubset) * 2 + 10 * 4 + sizeof(void*) == sizeof(GpuCodecParams),
              "GpuCodecParams layout");

// Where decoded vectors go: one layer's K or V tensor in the caller's layout (tqkv::KvLayout with
// each head's channels contiguous). Element (token t, head h, channel c) is at
//   unpaged (block_tokens == 0): t * token_stride + h * head_stride + c
//   paged:   block_ids[t / block_tokens] * block_stride + (t % block_tokens) * token_stride + ...
// Canonical [tokens][kv_heads][head_dim]: token_stride kv_heads * head_dim, head_stride head_dim;
// vLLM's paged [blocks][block_size][kv_heads][head_dim] adds block_stride and a block table.
struct GpuDst {
  void* base;
  const int64_t* block_ids;  // paged only (device pointer), one per block_tokens tokens
  int64_t token_stride;      // elements
  int64_t head_stride;
  int64_t block_stride;
  uint64_t block_tokens;     // 0: not paged
  uint32_t dtype;            // GpuDType of the output
  uint32_t reserved;
};
static_assert(sizeof(GpuDst) == 56, "GpuDst is passed by value to kernels");

// The canonical layout's strides for kv_heads x head_dim.
TQKV_HD GpuDst CanonicalDst(void* base, uint32_t kv_heads, uint32_t head_dim, uint32_t dtype) {
  GpuDst d{};
  d.base = base;
  d.token_stride = static_cast<int64_t>(kv_heads) * head_dim;
  d.head_stride = head_dim;
  d.dtype = dtype;
  return d;
}

// Element offset (not bytes) of (token, head, channel) in the destination.
TQKV_HD uint64_t DstElementOffset(const GpuDst& d, uint64_t token, uint32_t head, uint32_t c) {
  const int64_t row = d.block_tokens == 0
                          ? static_cast<int64_t>(token) * d.token_stride
                          : d.block_ids[token / d.block_tokens] * d.block_stride +
                                static_cast<int64_t>(token % d.block_tokens) * d.token_stride;
  return static_cast<uint64_t>(row + static_cast<int64_t>(head) * d.head_stride + c);
}

// Registers per lane for a head_dim (the kernels' template parameter): 2, 4 or 8.
TQKV_HD uint32_t RegsForHeadDim(uint32_t head_dim) {
  const uint32_t e = (head_dim + kGpuWarp - 1) / kGpuWarp;
  return e <= 2 ? 2u : e <= 4 ? 4u : 8u;
}

// Split codecs: the position of channel c in "subset order" (outliers ascending, then the rest
// ascending), from the group's outlier mask (ceil(d/8) bytes, bit c % 8 of byte c / 8) and the
// outlier count k. Unsplit (mask null): c.
TQKV_HD uint32_t ChannelSlot(const uint8_t* mask, uint32_t c, uint32_t k) {
  if (mask == nullptr) return c;
  uint32_t rank = 0;  // set bits below c
  for (uint32_t b = 0; b < c / 8; ++b) {
    uint32_t v = mask[b];
    v = v - ((v >> 1) & 0x55u);
    v = (v & 0x33u) + ((v >> 2) & 0x33u);
    rank += (v + (v >> 4)) & 0x0Fu;
  }
  const uint32_t low = mask[c / 8] & ((1u << (c % 8)) - 1u);
  for (uint32_t v = low; v != 0; v &= v - 1) ++rank;
  const bool set = (mask[c / 8] >> (c % 8)) & 1u;
  return set ? rank : k + (c - rank);
}

// Bit-exact ports of tqkv/types.h's conversions (HalfToFloat, FloatToHalf, FloatToBF16) so device
// results match the CPU codec byte for byte, NaN payloads included.
TQKV_HD uint32_t FloatBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
#endif
}
TQKV_HD float BitsFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  memcpy(&f, &u, 4);
  return f;
#endif
}

TQKV_HD float HalfBitsToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant & 0x3FFu) << 13;
    }
  } else if (exp == 0x1F) {
    bits = sign | 0x7F800000u | mant << 13 | (mant ? 0x400000u : 0u);
  } else {
    bits = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  return BitsFloat(bits);
}

TQKV_HD uint16_t FloatToHalfBits(float f) {
  const uint32_t x = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t abs = x & 0x7FFFFFFFu;
  if (abs >= 0x7F800000u) {
    if (abs == 0x7F800000u) return sign | 0x7C00u;
    return static_cast<uint16_t>(sign | 0x7E00u | ((abs >> 13) & 0x3FFu));
  }
  if (abs >= 0x477FF000u) return sign | 0x7C00u;
  if (abs < 0x38800000u) {
    if (abs < 0x33000000u) return sign;
    const uint32_t e = abs >> 23;
    const uint32_t m = (abs & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126 - e;
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return static_cast<uint16_t>(sign | r);
  }
  uint32_t r = abs - 0x38000000u;
  const uint32_t rem = r & 0x1FFFu;
  r >>= 13;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
  return static_cast<uint16_t>(sign | r);
}

TQKV_HD float BF16BitsToFloat(uint16_t b) { return BitsFloat(static_cast<uint32_t>(b) << 16); }
TQKV_HD uint16_t FloatToBF16Bits(float f) {
  const uint32_t x = FloatBits(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  const uint32_t rounding = 0x7FFFu + ((x >> 16) & 1u);
  return static_cast<uint16_t>((x + rounding) >> 16);
}

// Loads element i of a typed array as float / stores a float as element i (GpuDType).
TQKV_HD float LoadElement(const void* p, uint32_t dtype, uint64_t i) {
  if (dtype == kGpuF32) return static_cast<const float*>(p)[i];
  const uint16_t h = static_cast<const uint16_t*>(p)[i];
  return dtype == kGpuF16 ? HalfBitsToFloat(h) : BF16BitsToFloat(h);
}
TQKV_HD void StoreElement(void* p, uint32_t dtype, uint64_t i, float v) {
  if (dtype == kGpuF32) {
    static_cast<float*>(p)[i] = v;
  } else {
    static_cast<uint16_t*>(p)[i] = dtype == kGpuF16 ? FloatToHalfBits(v) : FloatToBF16Bits(v);
  }
}

// Norm bytes of subset s of a code (unaligned: codes are packed back to back).
TQKV_HD float LoadNormBytes(const uint8_t* p, uint32_t norm_dtype) {
  if (norm_dtype == kGpuF16) return HalfBitsToFloat(static_cast<uint16_t>(p[0] | (p[1] << 8)));
  return BitsFloat(static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
                   static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24);
}
TQKV_HD void StoreNormBytes(float v, uint32_t norm_dtype, uint8_t* p) {
  if (norm_dtype == kGpuF16) {
    const uint16_t h = FloatToHalfBits(v);
    p[0] = static_cast<uint8_t>(h);
    p[1] = static_cast<uint8_t>(h >> 8);
  } else {
    const uint32_t u = FloatBits(v);
    for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(u >> (8 * i));
  }
}

// Mean-removed keys (docs/format.md §5): one layer's key-means chunk in device memory, the means
// [kv_head][mean block][head_dim] at `means`, then the coefficients [kv_head][token] at
// `alphas`, all of dtype (kGpuF32 or kGpuF16); means null for none. Passed by value to the
// decode kernel.
struct GpuKeyMeans {
  const uint8_t* means;
  const uint8_t* alphas;
  uint32_t dtype;
  uint32_t block;   // tokens per mean
  uint64_t blocks;  // mean blocks per head
  uint64_t tokens;  // the session's tokens: coefficients per head
};
static_assert(sizeof(GpuKeyMeans) == 40, "GpuKeyMeans is passed by value to kernels");

// The mean row of (absolute token, head): head_dim values of m.dtype.
TQKV_HD const uint8_t* KeyMeanRow(const GpuKeyMeans& m, uint64_t token, uint32_t head,
                                  uint32_t head_dim) {
  const uint64_t size = m.dtype == kGpuF16 ? 2 : 4;
  return m.means + ((static_cast<uint64_t>(head) * m.blocks + token / m.block) * head_dim) * size;
}
// The coefficient α of (absolute token, head).
TQKV_HD float KeyMeanAlpha(const GpuKeyMeans& m, uint64_t token, uint32_t head) {
  const uint64_t size = m.dtype == kGpuF16 ? 2 : 4;
  return LoadNormBytes(m.alphas + (static_cast<uint64_t>(head) * m.tokens + token) * size, m.dtype);
}
// Channel c of a mean row as f32. The decoders add α·μ_c (the product rounded, then the sum) to
// the decoded f32 value before the conversion.
TQKV_HD float LoadKeyMean(const uint8_t* row, uint32_t dtype, uint32_t c) {
  return LoadNormBytes(row + c * (dtype == kGpuF16 ? 2u : 4u), dtype);
}

// The transform codec kl:B (docs/codec.md §11), decoded from its group metadata as stored:
// u8 bits[d], f16 mean[d], f16 scale[d], f32 g. Its table (no subsets): the Lloyd-Max codebooks
// of 1..8 bits (2^b floats each), then the signs of each block size m = 8, 16, ..., 256 (m
// floats each), then the six block scales float(1 / sqrt(m)).
inline constexpr uint32_t kGpuKlMaxBits = 8;
inline constexpr uint32_t kGpuKlTableFloats = 510 + 504 + 6;
TQKV_HD uint32_t KlCentroidsAt(uint32_t bits) { return (1u << bits) - 2u; }
TQKV_HD uint32_t KlSignsAt(uint32_t m) { return 510u + m - 8u; }
TQKV_HD uint32_t KlScaleAt(uint32_t m) {
  uint32_t at = 1014u;
  for (uint32_t s = 8; s < m; s <<= 1) ++at;
  return at;
}

TQKV_HD uint32_t LoadU16Le(const uint8_t* p) { return static_cast<uint32_t>(p[0] | (p[1] << 8)); }
TQKV_HD float KlMean(const uint8_t* meta, uint32_t d, uint32_t c) {
  return HalfBitsToFloat(static_cast<uint16_t>(LoadU16Le(meta + d + 2 * c)));
}
TQKV_HD float KlScale(const uint8_t* meta, uint32_t d, uint32_t c) {
  return HalfBitsToFloat(static_cast<uint16_t>(LoadU16Le(meta + 3 * d + 2 * c)));
}
TQKV_HD uint32_t KlNormScaleBits(const uint8_t* meta, uint32_t d) {
  const uint8_t* p = meta + 5 * d;
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
}
// Codec::CheckGroupMeta's structural rules, which the kernels also apply (a metadata they refuse
// decodes to NaN and is never read beyond the code; the restore refuses it on the host first,
// where alone the overflow bound of docs/codec.md §11 is checked): channel c
// has at most 8 bits, a finite mean and a finite non-negative scale...
TQKV_HD bool KlChannelOk(const uint8_t* meta, uint32_t d, uint32_t c) {
  const uint32_t m = LoadU16Le(meta + d + 2 * c), s = LoadU16Le(meta + 3 * d + 2 * c);
  return meta[c] <= kGpuKlMaxBits && (m & 0x7C00u) != 0x7C00u && (s & 0x7C00u) != 0x7C00u &&
         (s & 0x8000u) == 0;
}
// ... g is a normal power of two, and with counts[b] the channels of b bits: the bits sum to
// code_bits and every class of b >= 1 bits is a multiple of 8 channels.
TQKV_HD bool KlGroupOk(uint32_t g_bits, const uint32_t (&counts)[kGpuKlMaxBits + 1],
                       uint32_t code_bits) {
  const uint32_t e = (g_bits >> 23) & 0xFFu;
  bool ok = (g_bits & 0x807FFFFFu) == 0 && e >= 1 && e <= 254;
  uint32_t total = 0;
  for (uint32_t b = 1; b <= kGpuKlMaxBits; ++b) {
    total += b * counts[b];
    ok = ok && counts[b] % 8 == 0;
  }
  return ok && total == code_bits;
}
// The index bits of one kl code: its bytes after the norm.
TQKV_HD uint32_t KlCodeBits(const GpuCodecParams& p) {
  return (p.code_bytes - (p.norm_dtype == kGpuF16 ? 2u : 4u)) * 8u;
}

// The quiet NaN norm bytes every codec writes for a non-finite vector (kernels.h).
inline constexpr uint32_t kNanNormF32 = 0x7FC00000u;
inline constexpr uint16_t kNanNormF16 = 0x7E00u;

}  // namespace tqkv::cuda

#endif  // TQKV_SRC_CUDA_PACKED_H_
