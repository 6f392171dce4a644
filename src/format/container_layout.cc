// The container's byte layout: header encoding/decoding, preamble, footer, index records, order.
#include "format/container_layout.h"

#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

namespace tqkv::format {
namespace {

bool MulOverflows(uint64_t a, uint64_t b, uint64_t* out) {
  return __builtin_mul_overflow(a, b, out);
}

bool ValidDType(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

// Bounds-checked little-endian reads from a header body; the first failure sticks.
class BodyReader {
 public:
  BodyReader(std::span<const uint8_t> body, uint64_t base, std::string_view name)
      : body_(body), base_(base), name_(name) {}

  uint64_t offset() const { return base_ + pos_; }
  size_t remaining() const { return body_.size() - pos_; }
  const Status& status() const { return status_; }
  bool ok() const { return status_.ok(); }

  // True when `n` more bytes exist; else records Corruption for `what`.
  bool Need(uint64_t n, std::string_view what) {
    if (!ok()) return false;
    if (n > remaining()) {
      status_ = CorruptionAt(name_, std::string("header field ") + std::string(what), offset(),
                             std::to_string(n) + " bytes", std::to_string(remaining()) + " left");
      return false;
    }
    return true;
  }
  uint8_t U8(std::string_view what) { return Need(1, what) ? body_[pos_++] : 0; }
  uint16_t U16(std::string_view what) { return Take<uint16_t>(2, what, LoadU16); }
  uint32_t U32(std::string_view what) { return Take<uint32_t>(4, what, LoadU32); }
  uint64_t U64(std::string_view what) { return Take<uint64_t>(8, what, LoadU64); }
  float F32(std::string_view what) { return std::bit_cast<float>(U32(what)); }
  double F64(std::string_view what) { return std::bit_cast<double>(U64(what)); }
  std::span<const uint8_t> Bytes(uint64_t n, std::string_view what) {
    if (!Need(n, what)) return {};
    auto s = body_.subspan(pos_, n);
    pos_ += n;
    return s;
  }
  // A byte that must be 0 or 1.
  bool Bool(std::string_view what) {
    const uint64_t at = offset();
    const uint8_t v = U8(what);
    if (ok() && v > 1) Fail(what, at, "0 or 1", std::to_string(v));
    return v == 1;
  }
  void Fail(std::string_view what, uint64_t at, std::string_view expected, std::string_view got) {
    if (ok())
      status_ =
          CorruptionAt(name_, std::string("header field ") + std::string(what), at, expected, got);
  }

 private:
  template <typename T, typename F>
  T Take(size_t n, std::string_view what, F load) {
    if (!Need(n, what)) return 0;
    const T v = load(body_.data() + pos_);
    pos_ += n;
    return v;
  }

  std::span<const uint8_t> body_;
  uint64_t base_;
  std::string_view name_;
  size_t pos_ = 0;
  Status status_;
};

}  // namespace

uint64_t Checksum(std::span<const uint8_t> bytes) {
  return XXH3_64bits(bytes.data(), bytes.size());
}

void ByteWriter::U16(uint16_t v) {
  uint8_t b[2];
  StoreU16(b, v);
  out_->insert(out_->end(), b, b + 2);
}
void ByteWriter::U32(uint32_t v) {
  uint8_t b[4];
  StoreU32(b, v);
  out_->insert(out_->end(), b, b + 4);
}
void ByteWriter::U64(uint64_t v) {
  uint8_t b[8];
  StoreU64(b, v);
  out_->insert(out_->end(), b, b + 8);
}
void ByteWriter::F32(float v) { U32(std::bit_cast<uint32_t>(v)); }
void ByteWriter::F64(double v) { U64(std::bit_cast<uint64_t>(v)); }

std::string Hex(uint64_t v) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s = "0x";
  bool started = false;
  for (int shift = 60; shift >= 0; shift -= 4) {
    const unsigned d = (v >> shift) & 0xF;
    if (d != 0 || started || shift == 0) {
      s.push_back(kDigits[d]);
      started = true;
    }
  }
  return s;
}

Status CorruptionAt(std::string_view name, std::string_view what, uint64_t offset,
                    std::string_view expected, std::string_view got) {
  std::string msg;
  msg.append(name).append(": ").append(what).append(" at offset ").append(std::to_string(offset));
  msg.append(": expected ").append(expected).append(", got ").append(got);
  return Status::Corruption(std::move(msg));
}

namespace {

// Version 6's guard fields (docs/format.md §4): one entry per layer and tensor, every sum finite
// and not negative, a budget only with figures.
template <typename Bad>
Status ValidateCodecErrors(const ContainerHeader& h, const Bad& bad) {
  if (h.guard_stride == 0) {
    if (!h.codec_error.empty()) return bad("codec errors without a guard stride");
    if (h.allocated_bits != 0) return bad("allocated bits without codec errors");
    return Status::Ok();
  }
  if (h.codec_error.size() != uint64_t{h.geometry.layers} * 2) {
    return bad("codec errors: " + std::to_string(h.codec_error.size()) + " entries for " +
               std::to_string(h.geometry.layers) + " layers (expected 2 per layer)");
  }
  const auto valid = [](double v) { return std::isfinite(v) && v >= 0; };
  for (size_t i = 0; i < h.codec_error.size(); ++i) {
    const TensorCodecError& e = h.codec_error[i];
    if (!valid(e.err) || !valid(e.var) || !valid(e.energy)) {
      return bad("codec error of layer " + std::to_string(i / 2) + (i % 2 ? " V" : " K") +
                 ": sums must be finite and not negative");
    }
  }
  if (h.allocated_bits != 0 && !(std::isfinite(h.allocated_bits) && h.allocated_bits > 0 &&
                                 h.allocated_bits <= 64)) {
    return bad("allocated bits must be 0 or in (0, 64]");
  }
  return Status::Ok();
}

// Version 7's table (docs/format.md §4): one count per layer, each in [1, tokens], the largest
// equal to tokens (so every token a header names has its codes in the file, and the memory bound
// holds) and some below it (a table of tokens everywhere is no version 7).
template <typename Bad>
Status ValidateLayerTokens(const ContainerHeader& h, const Bad& bad) {
  if (h.layer_tokens.empty()) return Status::Ok();
  if (h.layer_tokens.size() != h.geometry.layers) {
    return bad("layer tokens: " + std::to_string(h.layer_tokens.size()) + " entries for " +
               std::to_string(h.geometry.layers) + " layers");
  }
  bool shorter = false, full = false;
  for (size_t l = 0; l < h.layer_tokens.size(); ++l) {
    const uint64_t n = h.layer_tokens[l];
    if (n == 0 || n > h.tokens) {
      return bad("layer " + std::to_string(l) + " holds " + std::to_string(n) +
                 " tokens (expected 1 to the session's " + std::to_string(h.tokens) + ")");
    }
    shorter |= n < h.tokens;
    full |= n == h.tokens;
  }
  if (!shorter) return bad("layer tokens: every layer holds all tokens (no table needed)");
  if (!full) {
    return bad("layer tokens: no layer holds the session's " + std::to_string(h.tokens) +
               " tokens (the largest count is the session's)");
  }
  return Status::Ok();
}

}  // namespace

Status ValidateHeader(const ContainerHeader& h) {
  auto bad = [](std::string why) { return Status::InvalidArgument("container header: " + why); };
  if (h.model.size() > kMaxModelBytes) {
    return bad("model name of " + std::to_string(h.model.size()) + " bytes (at most " +
               std::to_string(kMaxModelBytes) + ")");
  }
  const ModelGeometry& g = h.geometry;
  if (Status s = ValidateGeometry(g); !s.ok()) return bad(s.message());
  if (!ValidDType(h.source_dtype)) {
    return bad("source dtype " + std::to_string(static_cast<unsigned>(h.source_dtype)));
  }
  if (h.token_block == 0) return bad("token_block 0");
  if (!ValidPayloadAlignment(h.payload_alignment)) {
    return bad("payload alignment " + std::to_string(h.payload_alignment) +
               " (a power of two from 64 to 4096)");
  }
  if (h.codecs.empty()) return bad("no codecs");
  if (h.codecs.size() > std::numeric_limits<uint16_t>::max()) {
    return bad(std::to_string(h.codecs.size()) + " codecs (at most 65535)");
  }
  const uint64_t block = std::min<uint64_t>(h.tokens, h.token_block);
  CodecSetupCost setup;  // every codec is built on open: together they stay within the budget
  for (size_t i = 0; i < h.codecs.size(); ++i) {
    const CodecParams& c = h.codecs[i];
    Status s = ValidateCodecParams(c);
    if (!s.ok()) return bad("codec " + std::to_string(i) + ": " + s.message());
    const CodecSetupCost cost = SetupCostOf(c);  // valid params: each term is small
    setup.bytes += cost.bytes;
    setup.ops += cost.ops;
    if (setup.bytes > kMaxSetupBytes || setup.ops > kMaxSetupOps) {
      return bad("codecs 0.." + std::to_string(i) + " need " + std::to_string(setup.bytes) +
                 " bytes and " + std::to_string(setup.ops) + " operations to build (at most " +
                 std::to_string(kMaxSetupBytes) + " and " + std::to_string(kMaxSetupOps) + ")");
    }
    if (c.head_dim != g.head_dim) {
      return bad("codec " + std::to_string(i) + " head_dim " + std::to_string(c.head_dim) +
                 " differs from the geometry's " + std::to_string(g.head_dim));
    }
    // The largest chunks must have a size that fits 64 bits.
    uint64_t bytes = 0;
    if (MulOverflows(block, g.kv_heads, &bytes) || MulOverflows(bytes, CodeBytesOf(c), &bytes) ||
        MulOverflows(2ull * g.kv_heads, GroupMetaBytesOf(c), &bytes)) {
      return bad("codec " + std::to_string(i) + ": chunk size overflows 64 bits");
    }
  }
  if (h.layer_codec.size() != g.layers) {
    return bad("layer_codec has " + std::to_string(h.layer_codec.size()) + " entries for " +
               std::to_string(g.layers) + " layers");
  }
  for (size_t l = 0; l < h.layer_codec.size(); ++l) {
    if (h.layer_codec[l] >= h.codecs.size()) {
      return bad("layer " + std::to_string(l) + " uses codec " + std::to_string(h.layer_codec[l]) +
                 " of " + std::to_string(h.codecs.size()));
    }
  }
  if (!h.layer_codec_v.empty() && h.layer_codec_v.size() != g.layers) {
    return bad("layer_codec_v has " + std::to_string(h.layer_codec_v.size()) + " entries for " +
               std::to_string(g.layers) + " layers");
  }
  for (size_t l = 0; l < h.layer_codec_v.size(); ++l) {
    if (h.layer_codec_v[l] >= h.codecs.size()) {
      return bad("layer " + std::to_string(l) + " V uses codec " +
                 std::to_string(h.layer_codec_v[l]) + " of " + std::to_string(h.codecs.size()));
    }
  }
  if (h.key_mean_block != 0) {
    if (h.key_mean_dtype != DType::kF32 && h.key_mean_dtype != DType::kF16) {
      return bad("key mean dtype " + std::to_string(static_cast<unsigned>(h.key_mean_dtype)) +
                 " (f32 or f16)");
    }
    if (h.tokens == 0) return bad("key means without tokens");
    // blocks <= tokens, so tokens × (head_dim + 1) × kv_heads × 4 bounds the chunk's bytes.
    uint64_t bytes = 0;
    if (MulOverflows(h.tokens, uint64_t{g.head_dim} + 1, &bytes) ||
        MulOverflows(bytes, g.kv_heads, &bytes) || MulOverflows(bytes, 4, &bytes)) {
      return bad("key-means chunk size overflows 64 bits");
    }
  }
  TQKV_RETURN_IF_ERROR(ValidateCodecErrors(h, bad));
  if (h.engine_state.size() > kMaxEngineStateBytes) {
    return bad("engine state of " + std::to_string(h.engine_state.size()) + " bytes (at most " +
               std::to_string(kMaxEngineStateBytes) + ")");
  }
  TQKV_RETURN_IF_ERROR(ValidateLayerTokens(h, bad));
  if (uint64_t{h.exact_head} + h.exact_tail > MinLayerTokens(h)) {
    return bad("exact rows " + std::to_string(h.exact_head) + " + " +
               std::to_string(h.exact_tail) + " exceed the " + std::to_string(MinLayerTokens(h)) +
               (IsRagged(h) ? " tokens of the shortest layer" : " tokens"));
  }
  return Status::Ok();
}

std::vector<uint8_t> EncodeHeaderBody(const ContainerHeader& h) {
  std::vector<uint8_t> out;
  ByteWriter w(&out);
  w.U16(static_cast<uint16_t>(h.model.size()));
  w.Bytes({reinterpret_cast<const uint8_t*>(h.model.data()), h.model.size()});
  w.U32(h.geometry.layers);
  w.U32(h.geometry.kv_heads);
  w.U32(h.geometry.head_dim);
  w.U8(static_cast<uint8_t>(h.source_dtype));
  w.U64(h.tokens);
  w.U32(h.token_block);
  w.U16(static_cast<uint16_t>(h.codecs.size()));
  for (const CodecParams& c : h.codecs) {
    w.U8(static_cast<uint8_t>(c.kind));
    w.U8(static_cast<uint8_t>(c.raw_dtype));
    w.U8(static_cast<uint8_t>(c.norm_dtype));
    w.U8(c.norm_correction ? 1 : 0);
    w.U8(c.qjl ? 1 : 0);
    w.U8(static_cast<uint8_t>(c.subsets.size()));
    w.U16(0);  // reserved
    w.U32(c.head_dim);
    w.U64(c.qjl_seed);
    if (c.kind == CodecKind::kTransform) w.U32(c.code_bits);  // version 8
    for (const SubsetParams& s : c.subsets) {
      w.U16(s.channels);
      w.U8(s.bits);
      w.U8(static_cast<uint8_t>(s.rotation));
      w.U64(s.seed);
      w.U16(static_cast<uint16_t>(s.centroids.size()));
      for (float f : s.centroids) w.F32(f);
    }
  }
  for (uint16_t idx : h.layer_codec) w.U16(idx);
  const uint32_t version = ContainerVersionFor(h);
  if (version >= 2) {
    w.U32(h.exact_head);
    w.U32(h.exact_tail);
  }
  if (version >= 3) {
    w.U32(static_cast<uint32_t>(h.engine_state.size()));
    w.Bytes(h.engine_state);
  }
  if (version >= 4) {
    w.U32(h.key_mean_block);
    // Without key means (version 5 only) the dtype byte is 0 (docs/format.md §3).
    w.U8(h.key_mean_block == 0 ? 0 : static_cast<uint8_t>(h.key_mean_dtype));
  }
  if (version >= 5) {  // version 6 always has V's indices, maybe equal to K's
    for (uint16_t idx : h.layer_codec_v.empty() ? h.layer_codec : h.layer_codec_v) w.U16(idx);
  }
  if (version >= 6) {  // version 7 without figures: stride 0 and no codec_error bytes
    w.U32(h.guard_stride);
    w.F32(h.allocated_bits);
    for (const TensorCodecError& e : h.codec_error) {
      w.F64(e.err);
      w.F64(e.var);
      w.F64(e.energy);
    }
  }
  if (version >= 7) {  // version 8 has the table for every session: each entry `tokens` unless ragged
    for (uint32_t l = 0; l < h.geometry.layers; ++l) w.U64(LayerTokens(h, l));
  }
  if (version >= 9) w.U8(static_cast<uint8_t>(std::countr_zero(h.payload_alignment)));
  return out;
}

Result<ContainerHeader> DecodeHeaderBody(std::span<const uint8_t> body, uint64_t base,
                                         std::string_view name, uint32_t version) {
  BodyReader r(body, base, name);
  ContainerHeader h;
  const uint16_t model_len = r.U16("model length");
  if (r.ok() && model_len > kMaxModelBytes) {
    r.Fail("model length", r.offset() - 2, "at most " + std::to_string(kMaxModelBytes),
           std::to_string(model_len));
  }
  auto model = r.Bytes(model_len, "model");
  h.model.assign(model.begin(), model.end());
  h.geometry.layers = r.U32("layers");
  h.geometry.kv_heads = r.U32("kv_heads");
  h.geometry.head_dim = r.U32("head_dim");
  h.source_dtype = static_cast<DType>(r.U8("source dtype"));
  h.tokens = r.U64("tokens");
  h.token_block = r.U32("token_block");
  const uint16_t codec_count = r.U16("codec count");
  // Each codec record has at least 20 fixed bytes: the count cannot ask for more than is there.
  constexpr uint64_t kCodecFixedBytes = 20;
  if (!r.Need(uint64_t{codec_count} * kCodecFixedBytes, "codec records")) return r.status();
  h.codecs.reserve(codec_count);
  for (uint16_t i = 0; i < codec_count && r.ok(); ++i) {
    CodecParams c;
    c.kind = static_cast<CodecKind>(r.U8("codec kind"));
    c.raw_dtype = static_cast<DType>(r.U8("codec raw dtype"));
    c.norm_dtype = static_cast<DType>(r.U8("codec norm dtype"));
    c.norm_correction = r.Bool("codec norm_correction");
    c.qjl = r.Bool("codec qjl");
    const uint64_t subsets_at = r.offset();
    const uint8_t subset_count = r.U8("codec subset count");
    // A transform codec (version 8) stores its 8 codebooks as subset records.
    const uint8_t max_subsets = c.kind == CodecKind::kTransform && version >= 8 ? 8 : 2;
    if (r.ok() && subset_count > max_subsets) {
      r.Fail("codec subset count", subsets_at, "0.." + std::to_string(max_subsets),
             std::to_string(subset_count));
    }
    const uint64_t reserved_at = r.offset();
    const uint16_t reserved = r.U16("codec reserved");
    if (r.ok() && reserved != 0) r.Fail("codec reserved", reserved_at, "0", Hex(reserved));
    c.head_dim = r.U32("codec head_dim");
    c.qjl_seed = r.U64("codec qjl_seed");
    if (c.kind == CodecKind::kTransform && version >= 8) c.code_bits = r.U32("codec code bits");
    for (uint8_t j = 0; j < subset_count && r.ok(); ++j) {
      SubsetParams s;
      s.channels = r.U16("subset channels");
      s.bits = r.U8("subset bits");
      s.rotation = static_cast<RotationKind>(r.U8("subset rotation"));
      s.seed = r.U64("subset seed");
      const uint64_t count_at = r.offset();
      const uint16_t centroid_count = r.U16("subset centroid count");
      if (r.ok() && centroid_count > 256) {
        r.Fail("subset centroid count", count_at, "at most 256", std::to_string(centroid_count));
      }
      if (!r.Need(uint64_t{centroid_count} * 4, "subset centroids")) break;
      s.centroids.resize(centroid_count);
      for (float& f : s.centroids) f = r.F32("subset centroid");
      c.subsets.push_back(std::move(s));
    }
    h.codecs.push_back(std::move(c));
  }
  if (!r.Need(uint64_t{h.geometry.layers} * 2, "layer codec indices")) return r.status();
  h.layer_codec.resize(h.geometry.layers);
  for (uint16_t& idx : h.layer_codec) idx = r.U16("layer codec index");
  if (version >= 2) {
    h.exact_head = r.U32("exact head rows");
    h.exact_tail = r.U32("exact tail rows");
  }
  if (version >= 3) {
    const uint64_t len_at = r.offset();
    const uint32_t len = r.U32("engine state length");
    if (r.ok() && len > kMaxEngineStateBytes) {
      r.Fail("engine state length", len_at, "at most " + std::to_string(kMaxEngineStateBytes),
             std::to_string(len));
    }
    if (!r.Need(len, "engine state")) return r.status();
    auto state = r.Bytes(len, "engine state");
    h.engine_state.assign(state.begin(), state.end());
  }
  if (version >= 4) {
    const uint64_t block_at = r.offset();
    h.key_mean_block = r.U32("key mean block");
    // Version 4 exists for key means; version 5 may have none.
    if (r.ok() && h.key_mean_block == 0 && version == 4) {
      r.Fail("key mean block", block_at, "at least 1", "0");
    }
    const uint64_t dtype_at = r.offset();
    const uint8_t dtype = r.U8("key mean dtype");
    if (r.ok() && h.key_mean_block == 0 && dtype != 0) {
      r.Fail("key mean dtype", dtype_at, "0 without key means", std::to_string(dtype));
    }
    h.key_mean_dtype = h.key_mean_block == 0 ? DType::kF32 : static_cast<DType>(dtype);
  }
  if (version >= 5) {
    if (!r.Need(uint64_t{h.geometry.layers} * 2, "layer V codec indices")) return r.status();
    h.layer_codec_v.resize(h.geometry.layers);
    for (uint16_t& idx : h.layer_codec_v) idx = r.U16("layer V codec index");
  }
  if (version >= 6) {
    const uint64_t stride_at = r.offset();
    h.guard_stride = r.U32("guard stride");
    // Version 6 exists for the figures; version 7 may have none (stride 0, no codec_error).
    if (r.ok() && h.guard_stride == 0 && version == 6) {
      r.Fail("guard stride", stride_at, "at least 1", "0");
    }
    h.allocated_bits = r.F32("allocated bits");
    const uint64_t entries = h.guard_stride == 0 ? 0 : uint64_t{h.geometry.layers} * 2;
    if (!r.Need(entries * 24, "codec errors")) return r.status();
    h.codec_error.resize(entries);
    for (TensorCodecError& e : h.codec_error) {
      e.err = r.F64("codec error");
      e.var = r.F64("codec error varying energy");
      e.energy = r.F64("codec error energy");
    }
  }
  if (version >= 7) {
    if (!r.Need(uint64_t{h.geometry.layers} * 8, "layer tokens")) return r.status();
    h.layer_tokens.resize(h.geometry.layers);
    for (uint64_t& n : h.layer_tokens) n = r.U64("layer tokens");
    // Version 8 always has the table: one whose every entry is `tokens` is no ragged session.
    const bool all_full = std::all_of(h.layer_tokens.begin(), h.layer_tokens.end(),
                                      [&](uint64_t n) { return n == h.tokens; });
    if (version >= 8 && all_full) h.layer_tokens.clear();
  }
  if (version >= 9) {
    // log2 of the payload alignment: 6 (64) to 12 (4096; a version 9 needs less, checked later).
    const uint64_t at = r.offset();
    const uint8_t log2 = r.U8("payload alignment");
    if (r.ok() && (log2 < 6 || log2 > 12)) {
      r.Fail("payload alignment (log2)", at, "6..12", std::to_string(log2));
    }
    if (r.ok()) h.payload_alignment = uint32_t{1} << log2;
  }
  if (!r.ok()) return r.status();
  if (r.remaining() != 0) {
    return CorruptionAt(name, "header body end", r.offset(), "end of header",
                        std::to_string(r.remaining()) + " more bytes");
  }
  return h;
}

std::array<uint8_t, kPreambleBytes> EncodePreamble(uint32_t header_size, uint32_t version) {
  std::array<uint8_t, kPreambleBytes> p{};
  std::memcpy(p.data(), kMagic.data(), kMagic.size());
  StoreU32(p.data() + 8, version);
  StoreU32(p.data() + 12, 0);  // flags
  p[16] = kChecksumXxh3;
  // 17..19 reserved, zero
  StoreU32(p.data() + 20, header_size);
  // 24..31: header checksum, filled by the caller
  return p;
}

uint64_t HeaderChecksum(std::span<const uint8_t> preamble_and_body) {
  XXH3_state_t* state = XXH3_createState();
  if (state == nullptr) {  // cannot happen in practice; fall back to a copy
    std::vector<uint8_t> copy(preamble_and_body.begin(), preamble_and_body.end());
    std::memset(copy.data() + kHeaderChecksumOffset, 0, 8);
    return Checksum(copy);
  }
  static constexpr uint8_t kZero[8] = {};
  XXH3_64bits_reset(state);
  XXH3_64bits_update(state, preamble_and_body.data(), kHeaderChecksumOffset);
  XXH3_64bits_update(state, kZero, 8);
  XXH3_64bits_update(state, preamble_and_body.data() + kPreambleBytes,
                     preamble_and_body.size() - kPreambleBytes);
  const uint64_t h = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return h;
}

std::array<uint8_t, kFooterBytes> EncodeFooter(const Footer& f) {
  std::array<uint8_t, kFooterBytes> b{};
  StoreU64(b.data() + 0, f.index_offset);
  StoreU64(b.data() + 8, f.index_size);
  StoreU64(b.data() + 16, f.index_checksum);
  StoreU64(b.data() + 24, f.file_size);
  StoreU64(b.data() + 32, f.header_checksum);
  StoreU32(b.data() + 40, f.format_version);
  StoreU32(b.data() + 44, 0);  // reserved
  StoreU64(b.data() + 48, Checksum({b.data(), 48}));
  std::memcpy(b.data() + 56, kMagic.data(), kMagic.size());
  return b;
}

void EncodeIndexRecord(const ChunkEntry& e, uint8_t* out) {
  out[0] = static_cast<uint8_t>(e.type);
  out[1] = e.kv;
  StoreU16(out + 2, 0);  // reserved
  StoreU32(out + 4, e.layer);
  StoreU64(out + 8, e.token_begin);
  StoreU64(out + 16, e.token_count);
  StoreU64(out + 24, e.offset);
  StoreU64(out + 32, e.size);
  StoreU64(out + 40, e.checksum);
}

std::string DescribeChunk(ChunkType type, uint32_t layer, uint8_t kv, uint64_t token_begin,
                          uint64_t token_count) {
  std::string s = "layer " + std::to_string(layer);
  if (type == ChunkType::kGroupMeta) return s + " group-meta";
  if (type == ChunkType::kExactRows) return s + " exact-rows";
  if (type == ChunkType::kKeyMeans) return s + " key-means";
  if (type != ChunkType::kCodes) {
    return s + " type " + std::to_string(static_cast<unsigned>(type));
  }
  s += kv == 0 ? " K" : (kv == 1 ? " V" : " kv=" + std::to_string(kv));
  s += " tokens [" + std::to_string(token_begin) + ", +" + std::to_string(token_count) + ")";
  return s;
}

ChunkSequence::ChunkSequence(const ContainerHeader& header) : header_(&header) { Settle(); }

ChunkKey ChunkSequence::current() const {
  ChunkKey k;
  k.layer = layer_;
  if (phase_ == kMeta) {
    k.type = ChunkType::kGroupMeta;
    return k;
  }
  if (phase_ == kExact) {
    k.type = ChunkType::kExactRows;
    return k;
  }
  if (phase_ == kMeans) {
    k.type = ChunkType::kKeyMeans;
    return k;
  }
  k.type = ChunkType::kCodes;
  k.kv = phase_ == kK ? 0 : 1;
  k.token_begin = token_begin_;
  k.token_count =
      std::min<uint64_t>(header_->token_block, LayerTokens(*header_, layer_) - token_begin_);
  return k;
}

void ChunkSequence::Advance() {
  if (done()) return;
  if (phase_ == kMeta) {
    phase_ = kMeans;
  } else if (phase_ == kMeans) {
    phase_ = kK;
    token_begin_ = 0;
  } else if (phase_ == kExact) {
    phase_ = kMeta;
    ++layer_;
  } else {
    const uint64_t left = LayerTokens(*header_, layer_) - token_begin_;
    token_begin_ += std::min<uint64_t>(header_->token_block, left);
  }
  Settle();
}

// Moves past empty phases: a layer without group metadata, and K/V with no tokens left.
void ChunkSequence::Settle() {
  while (!done()) {
    if (phase_ == kMeta) {
      if (LayerGroupMetaBytes(*header_, layer_) > 0) return;
      phase_ = kMeans;
      continue;
    }
    if (phase_ == kMeans) {
      if (LayerHasKeyMeans(*header_, layer_)) return;
      phase_ = kK;
      token_begin_ = 0;
      continue;
    }
    if (phase_ == kExact) return;  // only entered when the header has exact rows
    if (token_begin_ < LayerTokens(*header_, layer_)) return;
    token_begin_ = 0;
    if (phase_ == kK) {
      phase_ = kV;
    } else if (HasExactRows(*header_)) {
      phase_ = kExact;
    } else {
      phase_ = kMeta;
      ++layer_;
    }
  }
}

Result<uint64_t> CountChunks(const ContainerHeader& h) {
  uint64_t total = 0;
  for (uint32_t l = 0; l < h.geometry.layers; ++l) {
    const uint64_t n = LayerTokens(h, l);
    const uint64_t blocks = n / h.token_block + (n % h.token_block != 0 ? 1 : 0);
    uint64_t per_layer = 0;
    if (MulOverflows(blocks, 2, &per_layer)) {
      return Status::InvalidArgument("chunk count overflows");
    }
    if (HasExactRows(h)) ++per_layer;  // the exact-rows chunk
    const uint64_t meta = (LayerGroupMetaBytes(h, l) > 0 ? 1 : 0) +
                          (LayerHasKeyMeans(h, l) ? 1 : 0);
    if (__builtin_add_overflow(total, per_layer + meta, &total) || per_layer + meta < meta) {
      return Status::InvalidArgument("chunk count overflows");
    }
  }
  return total;
}

}  // namespace tqkv::format

namespace tqkv {

Result<uint64_t> ExpectedChunkBytes(const ContainerHeader& header, const ChunkEntry& entry) {
  if (entry.layer >= header.geometry.layers || entry.layer >= header.layer_codec.size()) {
    return Status::InvalidArgument("chunk layer " + std::to_string(entry.layer) + " of " +
                                   std::to_string(header.geometry.layers));
  }
  if (!header.layer_codec_v.empty() && entry.layer >= header.layer_codec_v.size()) {
    return Status::InvalidArgument("chunk layer " + std::to_string(entry.layer) + " has no V codec");
  }
  const uint16_t idx = LayerCodecIndex(header, entry.layer, entry.kv == 1 ? 1 : 0);
  const uint16_t v_idx = LayerCodecIndex(header, entry.layer, 1);
  if (idx >= header.codecs.size() || v_idx >= header.codecs.size()) {
    return Status::InvalidArgument("layer " + std::to_string(entry.layer) + " codec index " +
                                   std::to_string(std::max(idx, v_idx)) + " out of range");
  }
  const CodecParams& c = header.codecs[idx];
  uint64_t bytes = 0;
  switch (entry.type) {
    case ChunkType::kGroupMeta: {
      const uint64_t meta = GroupMetaBytesOf(header.codecs[header.layer_codec[entry.layer]]) +
                            GroupMetaBytesOf(header.codecs[v_idx]);
      if (meta == 0) {
        return Status::InvalidArgument("layer " + std::to_string(entry.layer) +
                                       " has no group metadata");
      }
      if (__builtin_mul_overflow(uint64_t{header.geometry.kv_heads}, meta, &bytes)) {
        return Status::InvalidArgument("group-meta chunk size overflows");
      }
      return bytes;
    }
    case ChunkType::kCodes:
      if (__builtin_mul_overflow(entry.token_count, uint64_t{header.geometry.kv_heads}, &bytes) ||
          __builtin_mul_overflow(bytes, uint64_t{CodeBytesOf(c)}, &bytes)) {
        return Status::InvalidArgument("code chunk size overflows");
      }
      return bytes;
    case ChunkType::kKeyMeans: {
      if (!LayerHasKeyMeans(header, entry.layer)) {
        return Status::InvalidArgument("layer " + std::to_string(entry.layer) +
                                       " has no key means");
      }
      uint64_t values = 0;
      if (__builtin_mul_overflow(LayerTokens(header, entry.layer),
                                 uint64_t{header.geometry.head_dim} + 1, &values) ||
          __builtin_mul_overflow(values, uint64_t{header.geometry.kv_heads}, &values) ||
          __builtin_mul_overflow(values, uint64_t{4}, &values)) {
        return Status::InvalidArgument("key-means chunk size overflows");
      }
      return KeyMeanValues(header, entry.layer) * DTypeSize(header.key_mean_dtype);
    }
    case ChunkType::kExactRows: {
      const uint64_t rows = uint64_t{header.exact_head} + header.exact_tail;
      if (rows == 0) {
        return Status::InvalidArgument("the header has no exact rows");
      }
      if (__builtin_mul_overflow(2 * rows, uint64_t{header.geometry.kv_heads}, &bytes) ||
          __builtin_mul_overflow(bytes, uint64_t{header.geometry.head_dim}, &bytes) ||
          __builtin_mul_overflow(bytes, uint64_t{DTypeSize(header.source_dtype)}, &bytes)) {
        return Status::InvalidArgument("exact-rows chunk size overflows");
      }
      return bytes;
    }
  }
  return Status::InvalidArgument("chunk type " + std::to_string(static_cast<unsigned>(entry.type)));
}

double RelativeError(const TensorCodecError& e) {
  if (e.err == 0) return 0;
  if (e.var > 0) return e.err / e.var;
  // Nothing varies (one token, or identical ones): no order of attention scores to upset, so the
  // error is weighed against the vectors themselves.
  return e.energy > 0 ? e.err / e.energy : std::numeric_limits<double>::infinity();
}

std::vector<uint32_t> GuardExceeded(const std::vector<TensorCodecError>& errors,
                                    double threshold) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < errors.size(); ++i) {
    if (!(RelativeError(errors[i]) <= threshold)) out.push_back(static_cast<uint32_t>(i));
  }
  return out;
}

double SharedFraction(const TensorCodecError& e) {
  return e.energy > 0 ? std::max(0.0, 1.0 - e.var / e.energy) : 0.0;
}

}  // namespace tqkv
