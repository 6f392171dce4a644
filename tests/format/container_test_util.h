// Test helpers for the container: in-memory objects, hand-built codec params, a reference writer
// loop that produces chunks in container order independently of the library's ChunkSequence.
#ifndef TQKV_TESTS_FORMAT_CONTAINER_TEST_UTIL_H_
#define TQKV_TESTS_FORMAT_CONTAINER_TEST_UTIL_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "format/container_layout.h"
#include "format/container_parse.h"
#include "format/container_testing.h"
#include "tqkv/codec.h"
#include "tqkv/container.h"
#include "tqkv/store.h"

namespace tqkv::testing_format {

// A WritableObject over a vector; optionally fails once `fail_after` bytes were appended.
class MemoryWritable final : public WritableObject {
 public:
  Status Append(std::span<const uint8_t> src) override {
    if (bytes.size() + src.size() > fail_after) return Status::NoSpace("memory writable: full");
    bytes.insert(bytes.end(), src.begin(), src.end());
    return Status::Ok();
  }
  Status Commit() override { return Status::Ok(); }
  Status Abort() override {
    bytes.clear();
    return Status::Ok();
  }
  uint64_t BytesWritten() const override { return bytes.size(); }

  std::vector<uint8_t> bytes;
  uint64_t fail_after = UINT64_MAX;
};

// A ReadableObject over a span; records the largest single read and the bytes read.
class MemoryReadable final : public ReadableObject {
 public:
  explicit MemoryReadable(std::span<const uint8_t> data) : data_(data) {}
  uint64_t Size() const override { return data_.size(); }
  Status ReadAt(uint64_t offset, std::span<uint8_t> dst) override {
    max_read = std::max<uint64_t>(max_read, dst.size());
    bytes_read += dst.size();
    if (offset > data_.size() || dst.size() > data_.size() - offset) {
      return Status::Corruption("memory readable: read past the end at offset " +
                                std::to_string(offset));
    }
    if (!dst.empty()) std::memcpy(dst.data(), data_.data() + offset, dst.size());
    return Status::Ok();
  }
  Status ReadBatch(std::span<const ReadRequest> reqs) override {
    for (const ReadRequest& r : reqs) TQKV_RETURN_IF_ERROR(ReadAt(r.offset, r.dst));
    return Status::Ok();
  }

  uint64_t max_read = 0;
  uint64_t bytes_read = 0;

 private:
  std::span<const uint8_t> data_;
};

inline std::vector<float> Centroids(uint8_t bits) {
  const size_t n = size_t{1} << bits;
  std::vector<float> c(n);
  for (size_t i = 0; i < n; ++i) c[i] = -2.0f + 4.0f * (static_cast<float>(i) + 0.5f) / n;
  return c;
}

inline CodecParams RawParams(uint32_t d, DType t = DType::kF16) {
  CodecParams p;
  p.kind = CodecKind::kRaw;
  p.head_dim = d;
  p.raw_dtype = t;
  return p;
}

// Unsplit TurboQuant: one subset of d channels (d a power of two: Hadamard).
inline CodecParams TqParams(uint32_t d, uint8_t bits, bool qjl = false) {
  CodecParams p;
  p.kind = CodecKind::kTurboQuant;
  p.head_dim = d;
  SubsetParams s;
  s.channels = static_cast<uint16_t>(d);
  s.bits = bits;
  s.rotation = RotationKind::kHadamard;
  s.seed = 0x1234'5678'9abc'def0ull + bits;
  s.centroids = Centroids(bits);
  p.subsets.push_back(s);
  p.norm_dtype = DType::kF16;
  p.norm_correction = true;
  p.qjl = qjl;
  p.qjl_seed = qjl ? 0xfeed'beefull : 0;
  return p;
}

// The transform codec kl with `code_bits` index bits per vector and an f16 norm.
inline CodecParams KlParams(uint32_t d, uint32_t code_bits) {
  CodecParams p;
  p.kind = CodecKind::kTransform;
  p.head_dim = d;
  p.norm_dtype = DType::kF16;
  p.code_bits = code_bits;
  for (uint8_t b = 1; b <= 8; ++b) {
    SubsetParams s;
    s.channels = static_cast<uint16_t>(d);
    s.bits = b;
    s.rotation = RotationKind::kAuto;
    s.centroids = Centroids(b);
    p.subsets.push_back(s);
  }
  return p;
}

// Split TurboQuant: d/4 outlier channels at 4 bits (Hadamard), the rest at 2 bits (Haar).
inline CodecParams SplitParams(uint32_t d) {
  CodecParams p;
  p.kind = CodecKind::kTurboQuant;
  p.head_dim = d;
  SubsetParams out;
  out.channels = static_cast<uint16_t>(d / 4);
  out.bits = 4;
  out.rotation = RotationKind::kHadamard;
  out.seed = 11;
  out.centroids = Centroids(4);
  SubsetParams rest;
  rest.channels = static_cast<uint16_t>(d - d / 4);
  rest.bits = 2;
  rest.rotation = RotationKind::kHaar;
  rest.seed = 12;
  rest.centroids = Centroids(2);
  p.subsets = {out, rest};
  p.norm_dtype = DType::kF32;
  return p;
}

inline ContainerHeader MakeHeader(ModelGeometry g, uint64_t tokens, uint32_t token_block,
                                  std::vector<CodecParams> codecs,
                                  std::vector<uint16_t> layer_codec) {
  ContainerHeader h;
  h.model = "test-model";
  h.geometry = g;
  h.source_dtype = DType::kBF16;
  h.tokens = tokens;
  h.token_block = token_block;
  h.codecs = std::move(codecs);
  h.layer_codec = std::move(layer_codec);
  return h;
}

// The small container of the exhaustive tests: 2 layers, 1 KV head, d=16, 40 tokens, blocks of
// 16; layer 0 raw f16, layer 1 split TurboQuant (with a group-meta chunk).
inline ContainerHeader SmallHeader() {
  return MakeHeader({2, 1, 16}, 40, 16, {RawParams(16), SplitParams(16)}, {0, 1});
}

// SmallHeader with exact rows (format version 2): tokens [0, 2) and [37, 40).
inline ContainerHeader SmallExactHeader() {
  ContainerHeader h = SmallHeader();
  h.exact_head = 2;
  h.exact_tail = 3;
  return h;
}

// SmallExactHeader with key means over 16-token blocks in f16 (format version 4): layer 1
// (TurboQuant) gets a key-means chunk of (3 × 16 + 40) × 1 head × 2 bytes = 176; layer 0 (raw)
// none.
inline ContainerHeader SmallCenteredHeader() {
  ContainerHeader h = SmallExactHeader();
  h.key_mean_block = 16;
  h.key_mean_dtype = DType::kF16;
  return h;
}

// Separate K and V codecs (format version 5): layer 0 K raw f16 and V split TurboQuant, layer 1
// the other way round; both layers then have a group-meta chunk (16 bits of V's or K's mask, 2
// bytes). No key means: version 5 stores key_mean_block 0.
inline ContainerHeader SmallKvHeader() {
  ContainerHeader h = SmallHeader();
  h.layer_codec_v = {1, 0};
  return h;
}

// SmallKvHeader with SmallCenteredHeader's exact rows and key means (layer 1's K is TurboQuant).
inline ContainerHeader SmallKvCenteredHeader() {
  ContainerHeader h = SmallCenteredHeader();
  h.layer_codec_v = {1, 0};
  return h;
}

// Format version 6: SmallHeader with the guard's figures (every 2nd token; layer 0 K, V, layer 1
// K, V), no budget.
inline ContainerHeader SmallGuardHeader() {
  ContainerHeader h = SmallHeader();
  h.guard_stride = 2;
  h.codec_error = {{1.5, 3.0, 12.0}, {0.25, 8.0, 9.0}, {0.0, 0.0, 0.0}, {96.0, 1.0, 400.0}};
  return h;
}

// SmallGuardHeader with separate K/V codecs, key means and a budget.
inline ContainerHeader SmallGuardAllocatedHeader() {
  ContainerHeader h = SmallCenteredHeader();
  h.layer_codec_v = {1, 0};
  h.guard_stride = 1;
  h.codec_error = SmallGuardHeader().codec_error;
  h.allocated_bits = 3.5f;
  return h;
}

// Deterministic payload bytes (never all-zero, so a misplaced zero page is caught).
inline std::vector<uint8_t> Payload(size_t n, uint64_t seed) {
  std::vector<uint8_t> v(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& b : v) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    b = static_cast<uint8_t>(x);
  }
  return v;
}

// Tokens of layer l: its entry of the version-7 table, else the session's (docs/format.md §4).
inline uint64_t TokensOf(const ContainerHeader& h, uint32_t l) {
  return h.layer_tokens.empty() ? h.tokens : h.layer_tokens[l];
}

// Version 7: SmallCenteredHeader (exact rows 2 + 3, key means per 16 tokens) whose layer 1 holds
// 21 of the 40 tokens: its K and V take chunks [0, 16) [16, 21), its key means 2 blocks and 21
// coefficients; no guard figures (version 7 allows guard_stride 0).
inline ContainerHeader SmallRaggedHeader() {
  ContainerHeader h = SmallCenteredHeader();
  h.layer_tokens = {40, 21};
  return h;
}

// The chunk keys in container order, spelled out here independently of the library.
inline std::vector<ChunkEntry> ExpectedKeys(const ContainerHeader& h) {
  std::vector<ChunkEntry> keys;
  for (uint32_t l = 0; l < h.geometry.layers; ++l) {
    const uint64_t n = TokensOf(h, l);
    const uint16_t v_codec = h.layer_codec_v.empty() ? h.layer_codec[l] : h.layer_codec_v[l];
    if (GroupMetaBytesOf(h.codecs[h.layer_codec[l]]) + GroupMetaBytesOf(h.codecs[v_codec]) > 0) {
      ChunkEntry e;
      e.type = ChunkType::kGroupMeta;
      e.layer = l;
      keys.push_back(e);
    }
    if (h.key_mean_block > 0 && h.codecs[h.layer_codec[l]].kind != CodecKind::kRaw) {
      ChunkEntry e;
      e.type = ChunkType::kKeyMeans;
      e.layer = l;
      keys.push_back(e);
    }
    for (uint8_t kv = 0; kv < 2; ++kv) {
      for (uint64_t t = 0; t < n; t += h.token_block) {
        ChunkEntry e;
        e.type = ChunkType::kCodes;
        e.layer = l;
        e.kv = kv;
        e.token_begin = t;
        e.token_count = std::min<uint64_t>(h.token_block, n - t);
        keys.push_back(e);
      }
    }
    if (h.exact_head + h.exact_tail > 0) {
      ChunkEntry e;
      e.type = ChunkType::kExactRows;
      e.layer = l;
      keys.push_back(e);
    }
  }
  return keys;
}

inline uint64_t ChunkBytes(const ContainerHeader& h, const ChunkEntry& e) {
  const uint16_t v_codec =
      h.layer_codec_v.empty() ? h.layer_codec[e.layer] : h.layer_codec_v[e.layer];
  const CodecParams& c = h.codecs[e.kv == 1 ? v_codec : h.layer_codec[e.layer]];
  if (e.type == ChunkType::kGroupMeta) {  // K's heads, then V's
    return uint64_t{h.geometry.kv_heads} *
           (GroupMetaBytesOf(h.codecs[h.layer_codec[e.layer]]) + GroupMetaBytesOf(h.codecs[v_codec]));
  }
  if (e.type == ChunkType::kExactRows) {
    return 2ull * (h.exact_head + h.exact_tail) * h.geometry.kv_heads * h.geometry.head_dim *
           DTypeSize(h.source_dtype);
  }
  if (e.type == ChunkType::kKeyMeans) {  // means [head][block][d], then coefficients [head][token]
    const uint64_t n = TokensOf(h, e.layer);
    const uint64_t blocks = (n + h.key_mean_block - 1) / h.key_mean_block;
    return (blocks * h.geometry.head_dim + n) * h.geometry.kv_heads *
           DTypeSize(h.key_mean_dtype);
  }
  return e.token_count * h.geometry.kv_heads * CodeBytesOf(c);
}

// A group-meta chunk's payload that decoders accept: per KV head of K then of V, a split codec's
// mask marks exactly its outlier channels (which ones depends on the seed).
inline std::vector<uint8_t> ValidMasks(const ContainerHeader& h, const ChunkEntry& e, uint64_t seed) {
  std::vector<uint8_t> out;
  std::vector<uint8_t> pick = Payload(h.geometry.head_dim, seed);
  for (int kv = 0; kv < 2; ++kv) {
    const uint16_t c = kv == 0 || h.layer_codec_v.empty() ? h.layer_codec[e.layer]
                                                          : h.layer_codec_v[e.layer];
    const CodecParams& p = h.codecs[c];
    const size_t bytes = GroupMetaBytesOf(p);
    if (p.kind == CodecKind::kTransform) {  // bits dealt to bundles of 8; small means; scales > 0
      for (uint32_t head = 0; head < h.geometry.kv_heads; ++head) {
        std::vector<uint8_t> meta(bytes, 0);
        const uint32_t d = p.head_dim, bundles = d / 8;
        for (uint32_t left = p.code_bits / 8, u = head % bundles; left > 0; u = (u + 1) % bundles) {
          if (meta[8 * u] == 8) continue;
          for (uint32_t j = 0; j < 8; ++j) ++meta[8 * u + j];
          --left;
        }
        for (uint32_t c = 0; c < d; ++c) {
          const uint16_t mean = FloatToHalf(0.01f * static_cast<float>(pick[c] % 16) - 0.08f);
          const uint16_t scale = FloatToHalf(0.02f + 0.01f * static_cast<float>(pick[c] % 8));
          std::memcpy(&meta[d + 2 * c], &mean, 2);
          std::memcpy(&meta[3 * d + 2 * c], &scale, 2);
        }
        const float g = 1.0f;
        std::memcpy(&meta[5 * d], &g, 4);
        out.insert(out.end(), meta.begin(), meta.end());
      }
      continue;
    }
    for (uint32_t head = 0; head < h.geometry.kv_heads && bytes > 0; ++head) {
      std::vector<uint8_t> mask(bytes, 0);
      // Channels in the order of their pseudo-random key, the first `channels` marked.
      std::vector<uint32_t> order(p.head_dim);
      for (uint32_t i = 0; i < p.head_dim; ++i) order[i] = i;
      std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
        return static_cast<uint8_t>(pick[a] + head) < static_cast<uint8_t>(pick[b] + head);
      });
      for (uint32_t i = 0; i < p.subsets[0].channels; ++i) {
        mask[order[i] / 8] |= static_cast<uint8_t>(1u << (order[i] % 8));
      }
      out.insert(out.end(), mask.begin(), mask.end());
    }
  }
  return out;
}

struct WrittenContainer {
  std::vector<uint8_t> file;
  std::vector<ChunkEntry> keys;
  std::vector<std::vector<uint8_t>> payloads;
  Status status;
};

inline WrittenContainer WriteContainer(const ContainerHeader& h, uint64_t seed = 1) {
  WrittenContainer w;
  MemoryWritable out;
  auto writer = ContainerWriter::Create(&out, h);
  if (!writer.ok()) {
    w.status = writer.status();
    return w;
  }
  w.keys = ExpectedKeys(h);
  for (size_t i = 0; i < w.keys.size(); ++i) {
    w.payloads.push_back(w.keys[i].type == ChunkType::kGroupMeta
                             ? ValidMasks(h, w.keys[i], seed + i)
                             : Payload(ChunkBytes(h, w.keys[i]), seed + i));
    w.status = (*writer)->AddChunk(w.keys[i], w.payloads.back());
    if (!w.status.ok()) return w;
  }
  w.status = (*writer)->Finish();
  if (w.status.ok() && (*writer)->BytesWritten() != out.bytes.size()) {
    w.status = Status::Internal("BytesWritten " + std::to_string((*writer)->BytesWritten()) +
                                " != " + std::to_string(out.bytes.size()));
  }
  w.file = std::move(out.bytes);
  return w;
}

// Opens `file` and reads and verifies every chunk, as a restore would.
inline Status OpenAndReadAll(std::span<const uint8_t> file) {
  MemoryReadable in(file);
  auto reader = ContainerReader::Open(&in, "t.tqkv");
  if (!reader.ok()) return reader.status();
  std::vector<uint8_t> buf;
  for (const ChunkEntry& e : (*reader)->chunks()) {
    buf.resize(e.size);
    TQKV_RETURN_IF_ERROR((*reader)->ReadChunk(e, buf));
  }
  return Status::Ok();
}

// Recomputes every structural checksum (see ResignContainerForTesting).
inline void Resign(std::vector<uint8_t>& f) { format::ResignContainerForTesting(f); }

}  // namespace tqkv::testing_format

#endif  // TQKV_TESTS_FORMAT_CONTAINER_TEST_UTIL_H_
