// PackCodecParams and the host emulation of the kernels (see params.h).
#include "cuda/params.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "codec/codec_internal.h"
#include "codec/plan.h"

namespace tqkv::cuda {
namespace {

uint32_t Append(std::vector<float>& table, const std::vector<float>& v) {
  if (v.empty()) return kGpuNoTable;
  const auto at = static_cast<uint32_t>(table.size());
  table.insert(table.end(), v.begin(), v.end());
  return at;
}

// An emulated warp: reg e of lane l holds element e * 32 + l (zero when >= m).
struct Warp {
  float v[8][32];
};

// Sum8 in the kernel's order: lane k < 8 owns acc[k] and adds element k + 8t at step t, taken from
// lane k + 8 (t % 4), register t / 4; then the fixed tree.
float WarpSum8Squares(const Warp& w, uint32_t m) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const uint32_t steps = (m + 7) / 8;
  for (uint32_t t = 0; t < steps; ++t) {
    for (uint32_t k = 0; k < 8; ++k) {
      if (k + 8 * t >= m) continue;
      const float x = w.v[t / 4][k + 8 * (t % 4)];
      const float p = x * x;
      acc[k] = acc[k] + p;
    }
  }
  return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

// FWHT in the kernel's form: stages h < 32 across lanes (lane ^ h), h >= 32 across registers.
void WarpFwht(Warp& w, uint32_t m) {
  for (uint32_t h = 1; h < m; h <<= 1) {
    if (h < 32) {
      for (uint32_t e = 0; e < 8; ++e) {
        float nv[32];
        for (uint32_t l = 0; l < 32; ++l) {
          const float own = w.v[e][l], other = w.v[e][l ^ h];
          nv[l] = (l & h) == 0 ? own + other : other - own;
        }
        std::memcpy(w.v[e], nv, sizeof(nv));
      }
    } else {
      const uint32_t hh = h / 32;
      for (uint32_t e = 0; e < 8; ++e) {
        if (e & hh) continue;
        for (uint32_t l = 0; l < 32; ++l) {
          const float a = w.v[e][l], b = w.v[e + hh][l];
          w.v[e][l] = a + b;
          w.v[e + hh][l] = a - b;
        }
      }
    }
  }
}

// y = M x with mt = M^T row-major: element i broadcast from lane i % 32, register i / 32.
void WarpMatVecT(const float* mt, const Warp& x, uint32_t m, Warp& y) {
  std::memset(&y, 0, sizeof(y));
  for (uint32_t i = 0; i < m; ++i) {
    const float xi = x.v[i / 32][i % 32];
    for (uint32_t e = 0; e < 8; ++e) {
      for (uint32_t l = 0; l < 32; ++l) {
        const uint32_t j = e * 32 + l;
        if (j < m) y.v[e][l] = std::fma(mt[i * m + j], xi, y.v[e][l]);
      }
    }
  }
}

// The Kronecker mix y = (M (x) I_B) x, mt = M^T (q*q): the kernels' fma order (warp.cuh).
void WarpKronMix(const float* mt, const Warp& x, uint32_t m, uint32_t block, Warp& y) {
  std::memset(&y, 0, sizeof(y));
  const uint32_t q = m / block;
  for (uint32_t j = 0; j < m; ++j) {
    const uint32_t a = j / block, b = j % block;
    float acc = 0.0f;
    for (uint32_t a2 = 0; a2 < q; ++a2) {
      const uint32_t i = a2 * block + b;
      acc = std::fma(mt[a2 * q + a], x.v[i / 32][i % 32], acc);
    }
    y.v[j / 32][j % 32] = acc;
  }
}

float Table(const GpuCodecParams& p, uint32_t off, uint32_t i) { return p.table[off + i]; }

// kl: the fixed table of packed.h (codebooks, each block size's signs, the block scales).
Result<PackedCodec> PackTransform(const CodecParams& params, PackedCodec out) {
  GpuCodecParams& p = out.params;
  p.kind = kGpuTransform;
  p.norm_dtype = ToGpuDType(params.norm_dtype);
  out.table.assign(kGpuKlTableFloats, 0.0f);
  for (uint32_t b = 1; b <= kGpuKlMaxBits; ++b) {
    const std::vector<float>& c = params.subsets[b - 1].centroids;
    if (c.size() != (size_t{1} << b)) return Status::Internal("kl codebook of the wrong size");
    std::copy(c.begin(), c.end(), out.table.begin() + KlCentroidsAt(b));
  }
  for (uint32_t m = 8; m <= kGpuMaxHeadDim; m <<= 1) {
    const codec::KlBlockRotation r = codec::KlRotationOf(m);
    std::copy(r.signs.begin(), r.signs.end(), out.table.begin() + KlSignsAt(m));
    out.table[KlScaleAt(m)] = r.scale;
  }
  p.table_floats = static_cast<uint32_t>(out.table.size());
  p.table = out.table.data();
  return out;
}

// The kl kernel for one vector (decode.cu): the group's layout from its metadata, each block
// decoded as a TurboQuant subset into a row, then x_c = a_c * N + b_c * row[p_c] and the key
// mean, every product rounded to f32.
void EmulateKlDecode(const GpuCodecParams& p, const uint8_t* code, const uint8_t* meta, void* out,
                     uint32_t out_dtype, const uint8_t* mean_row, uint32_t mean_dtype,
                     float alpha) {
  const uint32_t d = p.head_dim;
  uint32_t counts[kGpuKlMaxBits + 1] = {};
  bool ok = true;
  for (uint32_t c = 0; c < d; ++c) {
    ok = ok && KlChannelOk(meta, d, c);
    if (meta[c] <= kGpuKlMaxBits) ++counts[meta[c]];
  }
  const uint32_t g_bits = KlNormScaleBits(meta, d);
  if (!ok || !KlGroupOk(g_bits, counts, KlCodeBits(p))) {
    for (uint32_t c = 0; c < d; ++c) StoreElement(out, out_dtype, c, BitsFloat(kNanNormF32));
    return;
  }
  const float n = LoadNormBytes(code, p.norm_dtype);
  float row[kGpuMaxHeadDim] = {};
  uint32_t r = 0, plane = p.norm_dtype == kGpuF16 ? 2u : 4u;
  for (uint32_t b = 1; b <= kGpuKlMaxBits; ++b) {
    for (uint32_t m = kGpuMaxHeadDim; m >= 8; m >>= 1) {
      if ((counts[b] & m) == 0) continue;
      const float a = n * Table(p, KlScaleAt(m), 0);
      const uint32_t pb = m / 8;
      Warp w;
      std::memset(&w, 0, sizeof(w));
      for (uint32_t j = 0; j < m; ++j) {
        uint32_t idx = 0;
        for (uint32_t q = 0; q < b; ++q) idx |= ((code[plane + q * pb + j / 8] >> (j % 8)) & 1u) << q;
        w.v[j / 32][j % 32] = Table(p, KlCentroidsAt(b), idx) * a;
      }
      WarpFwht(w, m);
      for (uint32_t j = 0; j < m; ++j) row[r + j] = w.v[j / 32][j % 32] * Table(p, KlSignsAt(m), j);
      r += m;
      plane += b * pb;
    }
  }
  uint32_t next[kGpuKlMaxBits + 1] = {};  // row position of each class's next channel
  for (uint32_t b = 2; b <= kGpuKlMaxBits; ++b) next[b] = next[b - 1] + counts[b - 1];
  const float g = BitsFloat(g_bits);
  for (uint32_t c = 0; c < d; ++c) {
    const uint32_t b = meta[c];
    const float ac = KlMean(meta, d, c) * g;
    const float bc = b == 0 ? 0.0f : KlScale(meta, d, c) * g;
    const float base = ac * n;
    const float step = bc * row[b == 0 ? 0 : next[b]++];
    float x = base + step;
    if (mean_row != nullptr) x += alpha * LoadKeyMean(mean_row, mean_dtype, c);
    StoreElement(out, out_dtype, c, x);
  }
}

}  // namespace

GpuDType ToGpuDType(DType t) {
  switch (t) {
    case DType::kF16: return kGpuF16;
    case DType::kBF16: return kGpuBF16;
    default: return kGpuF32;
  }
}

Result<PackedCodec> PackCodecParams(const CodecParams& params) {
  TQKV_RETURN_IF_ERROR(ValidateCodecParams(params));
  if (params.qjl) return Status::Unsupported("GPU kernels: qjl=1 codecs are not supported");
  if (params.head_dim > kGpuMaxHeadDim) {
    return Status::Unsupported("GPU kernels: head_dim " + std::to_string(params.head_dim) +
                               " > " + std::to_string(kGpuMaxHeadDim));
  }
  PackedCodec out;
  GpuCodecParams& p = out.params;
  std::memset(&p, 0, sizeof(p));
  p.head_dim = params.head_dim;
  p.code_bytes = static_cast<uint32_t>(CodeBytesOf(params));
  p.meta_bytes = static_cast<uint32_t>(GroupMetaBytesOf(params));
  p.raw_dtype = ToGpuDType(params.raw_dtype);
  if (params.kind == CodecKind::kRaw) {
    p.kind = kGpuRaw;
    return out;
  }
  if (params.kind == CodecKind::kTransform) return PackTransform(params, std::move(out));
  p.kind = kGpuTurboQuant;
  // Every value below comes from the codec's own plan (src/codec/plan.h), not a second derivation.
  const codec::CodecPlan plan = codec::CodecPlan::Build(params);
  p.num_subsets = static_cast<uint32_t>(plan.subsets().size());
  p.norm_dtype = ToGpuDType(plan.norm_dtype());
  p.norm_correction = plan.norm_correction() ? 1u : 0u;
  for (uint32_t s = 0; s < p.num_subsets; ++s) {
    const codec::PlannedSubset& ps = plan.subsets()[s];
    GpuSubset& g = p.subsets[s];
    g.dim = ps.channels;
    g.bits = ps.bits;
    g.rotation = static_cast<uint32_t>(ps.rotation.kind);
    g.block = ps.rotation.block;
    g.enc_scale = ps.enc_scale;
    g.dec_scale = ps.dec_scale;
    g.norm_offset = static_cast<uint32_t>(ps.norm_offset);
    g.planes_offset = static_cast<uint32_t>(ps.planes_offset);
    g.signs1 = Append(out.table, ps.rotation.signs1);
    g.signs2 = Append(out.table, ps.rotation.signs2);
    g.haar = Append(out.table, ps.rotation.q);
    g.haar_t = Append(out.table, ps.rotation.qt);
    g.centroids = Append(out.table, ps.centroids);
    g.thresholds = Append(out.table, ps.thresholds);
  }
  p.table_floats = static_cast<uint32_t>(out.table.size());
  p.table = out.table.data();
  return out;
}

void EmulateDecodeVector(const GpuCodecParams& p, const uint8_t* code, const uint8_t* mask,
                         void* out, uint32_t out_dtype, const uint8_t* mean_row,
                         uint32_t mean_dtype, float alpha) {
  const uint32_t d = p.head_dim;
  if (p.kind == kGpuRaw) {
    for (uint32_t c = 0; c < d; ++c) StoreElement(out, out_dtype, c, LoadElement(code, p.raw_dtype, c));
    return;
  }
  if (p.kind == kGpuTransform) {
    EmulateKlDecode(p, code, mask, out, out_dtype, mean_row, mean_dtype, alpha);
    return;
  }
  float slots[kGpuMaxHeadDim];  // the kernel's per-warp shared buffer, subset order
  uint32_t base = 0;
  for (uint32_t s = 0; s < p.num_subsets; ++s) {
    const GpuSubset& g = p.subsets[s];
    const uint32_t m = g.dim, pb = (m + 7) / 8;
    const float a = LoadNormBytes(code + g.norm_offset, p.norm_dtype) * g.dec_scale;
    Warp w;
    std::memset(&w, 0, sizeof(w));
    for (uint32_t j = 0; j < m; ++j) {
      uint32_t idx = 0;
      for (uint32_t b = 0; b < g.bits; ++b) {
        idx |= ((code[g.planes_offset + b * pb + j / 8] >> (j % 8)) & 1u) << b;
      }
      w.v[j / 32][j % 32] = Table(p, g.centroids, idx) * a;
    }
    Warp o;
    if (g.rotation == kGpuHaar) {
      WarpMatVecT(p.table + g.haar, w, m, o);
    } else if (g.rotation == kGpuKronecker) {
      WarpKronMix(p.table + g.haar, w, m, g.block, o);
      WarpFwht(o, g.block);
      for (uint32_t j = 0; j < m; ++j) o.v[j / 32][j % 32] *= Table(p, g.signs1, j);
    } else {
      WarpFwht(w, m);
      if (g.rotation == kGpuHadamard2) {
        for (uint32_t j = 0; j < m; ++j) w.v[j / 32][j % 32] *= Table(p, g.signs2, j);
        WarpFwht(w, m);
      }
      for (uint32_t j = 0; j < m; ++j) {
        o.v[j / 32][j % 32] = w.v[j / 32][j % 32] * Table(p, g.signs1, j);
      }
    }
    for (uint32_t j = 0; j < m; ++j) slots[base + j] = o.v[j / 32][j % 32];
    base += m;
  }
  const uint32_t k = p.num_subsets == 2 ? p.subsets[0].dim : 0;
  const uint8_t* m = p.num_subsets == 2 ? mask : nullptr;
  if (mean_row != nullptr) {
    for (uint32_t c = 0; c < d; ++c) {
      const float am = alpha * LoadKeyMean(mean_row, mean_dtype, c);
      slots[ChannelSlot(m, c, k)] += am;
    }
  }
  for (uint32_t c = 0; c < d; ++c) StoreElement(out, out_dtype, c, slots[ChannelSlot(m, c, k)]);
}

void EmulateEncodeVector(const GpuCodecParams& p, const void* x, uint32_t in_dtype,
                         const uint8_t* mask, uint8_t* code) {
  const uint32_t d = p.head_dim;
  if (p.kind == kGpuRaw) {
    for (uint32_t c = 0; c < d; ++c) StoreElement(code, p.raw_dtype, c, LoadElement(x, in_dtype, c));
    return;
  }
  float slots[kGpuMaxHeadDim];
  const uint32_t k = p.num_subsets == 2 ? p.subsets[0].dim : 0;
  for (uint32_t c = 0; c < d; ++c) {
    slots[ChannelSlot(p.num_subsets == 2 ? mask : nullptr, c, k)] = LoadElement(x, in_dtype, c);
  }
  float stored[2];
  uint32_t base = 0;
  for (uint32_t s = 0; s < p.num_subsets; ++s) {
    const GpuSubset& g = p.subsets[s];
    const uint32_t m = g.dim, pb = (m + 7) / 8;
    Warp xw;
    std::memset(&xw, 0, sizeof(xw));
    for (uint32_t j = 0; j < m; ++j) xw.v[j / 32][j % 32] = slots[base + j];
    base += m;
    const float norm = std::sqrt(WarpSum8Squares(xw, m));
    uint8_t idx[kGpuMaxHeadDim] = {};
    if (norm == 0.0f || !std::isfinite(norm)) {
      stored[s] = norm == 0.0f ? 0.0f : BitsFloat(kNanNormF32);
    } else {
      Warp y;
      if (g.rotation == kGpuHaar) {
        WarpMatVecT(p.table + g.haar_t, xw, m, y);
      } else if (g.rotation == kGpuKronecker) {
        Warp t = xw;
        for (uint32_t j = 0; j < m; ++j) t.v[j / 32][j % 32] *= Table(p, g.signs1, j);
        WarpFwht(t, g.block);
        WarpKronMix(p.table + g.haar_t, t, m, g.block, y);
      } else {
        y = xw;
        for (uint32_t j = 0; j < m; ++j) y.v[j / 32][j % 32] *= Table(p, g.signs1, j);
        WarpFwht(y, m);
        if (g.rotation == kGpuHadamard2) {
          for (uint32_t j = 0; j < m; ++j) y.v[j / 32][j % 32] *= Table(p, g.signs2, j);
          WarpFwht(y, m);
        }
      }
      const float sc = g.enc_scale / norm;
      const uint32_t count = (1u << g.bits) - 1;
      for (uint32_t j = 0; j < m; ++j) {
        const float z = y.v[j / 32][j % 32] * sc;
        uint32_t lo = 0, hi = count;  // binary search: count of thresholds < z (NaN: 0)
        while (lo < hi) {
          const uint32_t mid = (lo + hi) / 2;
          if (Table(p, g.thresholds, mid) < z) lo = mid + 1; else hi = mid;
        }
        idx[j] = static_cast<uint8_t>(lo);
      }
      stored[s] = norm;
      if (p.norm_correction) {
        Warp cw;
        std::memset(&cw, 0, sizeof(cw));
        for (uint32_t j = 0; j < m; ++j) cw.v[j / 32][j % 32] = Table(p, g.centroids, idx[j]);
        stored[s] = norm * std::sqrt(static_cast<float>(m) / WarpSum8Squares(cw, m));
      }
    }
    // Planes through the kernel's ballot words: word w of plane b = bits of elements 32w..32w+31.
    for (uint32_t b = 0; b < g.bits; ++b) {
      for (uint32_t wd = 0; wd < (m + 31) / 32; ++wd) {
        uint32_t word = 0;
        for (uint32_t l = 0; l < 32; ++l) {
          const uint32_t j = wd * 32 + l;
          if (j < m && ((idx[j] >> b) & 1u)) word |= 1u << l;
        }
        for (uint32_t q = 0; q < 4; ++q) {
          if (wd * 4 + q < pb) code[g.planes_offset + b * pb + wd * 4 + q] = uint8_t(word >> (8 * q));
        }
      }
    }
  }
  bool any_nan = false;
  for (uint32_t s = 0; s < p.num_subsets; ++s) any_nan |= std::isnan(stored[s]);
  for (uint32_t s = 0; s < p.num_subsets; ++s) {
    uint8_t* np = code + p.subsets[s].norm_offset;
    if (any_nan) {
      StoreNormBytes(BitsFloat(kNanNormF32), p.norm_dtype, np);  // f16: 0x7E00
    } else {
      StoreNormBytes(stored[s], p.norm_dtype, np);
    }
  }
}

}  // namespace tqkv::cuda
