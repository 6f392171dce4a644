#include "model/ggml_types.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "tqkv/types.h"

namespace tqkv::model {
namespace {

constexpr GgmlTypeTraits kTraits[] = {
    {GgmlType::kF32, "f32", 1, 4, false},
    {GgmlType::kF16, "f16", 1, 2, false},
    {GgmlType::kQ4_0, "q4_0", kQkBlock, sizeof(BlockQ4_0), true},
    {GgmlType::kQ4_1, "q4_1", kQkBlock, sizeof(BlockQ4_1), true},
    {GgmlType::kQ8_0, "q8_0", kQkBlock, sizeof(BlockQ8_0), true},
    {GgmlType::kBF16, "bf16", 1, 2, false},
};

// Names of ggml ids we do not support, for clearer errors.
std::string_view KnownUnsupportedName(uint32_t id) {
  switch (id) {
    case 6:
      return "q5_0";
    case 7:
      return "q5_1";
    case 9:
      return "q8_1";
    case 10:
      return "q2_k";
    case 11:
      return "q3_k";
    case 12:
      return "q4_k";
    case 13:
      return "q5_k";
    case 14:
      return "q6_k";
    case 15:
      return "q8_k";
    default:
      return {};
  }
}

}  // namespace

std::optional<GgmlTypeTraits> FindGgmlType(uint32_t id) {
  for (const auto& t : kTraits) {
    if (static_cast<uint32_t>(t.type) == id) return t;
  }
  return std::nullopt;
}

GgmlTypeTraits GgmlTraits(GgmlType type) { return *FindGgmlType(static_cast<uint32_t>(type)); }

std::string_view GgmlTypeName(uint32_t id) {
  if (auto t = FindGgmlType(id)) return t->name;
  std::string_view n = KnownUnsupportedName(id);
  return n.empty() ? std::string_view("unknown") : n;
}

std::optional<uint64_t> GgmlRowBytes(GgmlType type, uint64_t elems) {
  const GgmlTypeTraits t = GgmlTraits(type);
  if (elems % t.block_elems != 0) return std::nullopt;
  return elems / t.block_elems * t.block_bytes;
}

void DequantizeRow(GgmlType type, const void* row, size_t elems, float* out) {
  const uint8_t* p = static_cast<const uint8_t*>(row);
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(out, p, elems * 4);
      return;
    case GgmlType::kF16:
      for (size_t i = 0; i < elems; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = HalfToFloat(h);
      }
      return;
    case GgmlType::kBF16:
      for (size_t i = 0; i < elems; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = BF16ToFloat(h);
      }
      return;
    case GgmlType::kQ4_0:
      for (size_t b = 0; b < elems / kQkBlock; ++b) {
        BlockQ4_0 blk;
        std::memcpy(&blk, p + b * sizeof(blk), sizeof(blk));
        const float d = HalfToFloat(blk.d);
        for (int j = 0; j < 16; ++j) {
          out[b * 32 + j] = d * static_cast<float>((blk.qs[j] & 0x0F) - 8);
          out[b * 32 + j + 16] = d * static_cast<float>((blk.qs[j] >> 4) - 8);
        }
      }
      return;
    case GgmlType::kQ4_1:
      for (size_t b = 0; b < elems / kQkBlock; ++b) {
        BlockQ4_1 blk;
        std::memcpy(&blk, p + b * sizeof(blk), sizeof(blk));
        const float d = HalfToFloat(blk.d);
        const float m = HalfToFloat(blk.m);
        for (int j = 0; j < 16; ++j) {
          out[b * 32 + j] = d * static_cast<float>(blk.qs[j] & 0x0F) + m;
          out[b * 32 + j + 16] = d * static_cast<float>(blk.qs[j] >> 4) + m;
        }
      }
      return;
    case GgmlType::kQ8_0:
      for (size_t b = 0; b < elems / kQkBlock; ++b) {
        BlockQ8_0 blk;
        std::memcpy(&blk, p + b * sizeof(blk), sizeof(blk));
        const float d = HalfToFloat(blk.d);
        for (int j = 0; j < 32; ++j) out[b * 32 + j] = d * static_cast<float>(blk.qs[j]);
      }
      return;
  }
}

void QuantizeRowQ4_0(const float* x, size_t elems, void* out) {
  uint8_t* o = static_cast<uint8_t*>(out);
  for (size_t b = 0; b < elems / kQkBlock; ++b) {
    const float* xb = x + b * 32;
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 32; ++j) {
      if (std::fabs(xb[j]) > amax) {
        amax = std::fabs(xb[j]);
        max = xb[j];
      }
    }
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    BlockQ4_0 blk;
    blk.d = FloatToHalf(d);
    for (int j = 0; j < 16; ++j) {
      const int q0 = std::min(15, static_cast<int>(xb[j] * id + 8.5f));
      const int q1 = std::min(15, static_cast<int>(xb[j + 16] * id + 8.5f));
      blk.qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
    std::memcpy(o + b * sizeof(blk), &blk, sizeof(blk));
  }
}

void QuantizeRowQ4_1(const float* x, size_t elems, void* out) {
  uint8_t* o = static_cast<uint8_t*>(out);
  for (size_t b = 0; b < elems / kQkBlock; ++b) {
    const float* xb = x + b * 32;
    float mn = xb[0], mx = xb[0];
    for (int j = 1; j < 32; ++j) {
      mn = std::min(mn, xb[j]);
      mx = std::max(mx, xb[j]);
    }
    const float d = (mx - mn) / 15.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    BlockQ4_1 blk;
    blk.d = FloatToHalf(d);
    blk.m = FloatToHalf(mn);
    for (int j = 0; j < 16; ++j) {
      const int q0 = std::min(15, static_cast<int>((xb[j] - mn) * id + 0.5f));
      const int q1 = std::min(15, static_cast<int>((xb[j + 16] - mn) * id + 0.5f));
      blk.qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
    std::memcpy(o + b * sizeof(blk), &blk, sizeof(blk));
  }
}

void QuantizeRowQ8_0(const float* x, size_t elems, void* out) {
  uint8_t* o = static_cast<uint8_t*>(out);
  for (size_t b = 0; b < elems / kQkBlock; ++b) {
    const float* xb = x + b * 32;
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(xb[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    BlockQ8_0 blk;
    blk.d = FloatToHalf(d);
    for (int j = 0; j < 32; ++j) blk.qs[j] = static_cast<int8_t>(std::lround(xb[j] * id));
    std::memcpy(o + b * sizeof(blk), &blk, sizeof(blk));
  }
}

void QuantizeRow(GgmlType type, const float* x, size_t elems, void* out) {
  uint8_t* o = static_cast<uint8_t*>(out);
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(o, x, elems * 4);
      return;
    case GgmlType::kF16:
      for (size_t i = 0; i < elems; ++i) {
        const uint16_t h = FloatToHalf(x[i]);
        std::memcpy(o + 2 * i, &h, 2);
      }
      return;
    case GgmlType::kBF16:
      for (size_t i = 0; i < elems; ++i) {
        const uint16_t h = FloatToBF16(x[i]);
        std::memcpy(o + 2 * i, &h, 2);
      }
      return;
    case GgmlType::kQ4_0:
      QuantizeRowQ4_0(x, elems, out);
      return;
    case GgmlType::kQ4_1:
      QuantizeRowQ4_1(x, elems, out);
      return;
    case GgmlType::kQ8_0:
      QuantizeRowQ8_0(x, elems, out);
      return;
  }
}

}  // namespace tqkv::model
