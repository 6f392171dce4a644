// The .tqkv container: a byte layout, no I/O of its own (docs/format.md is the byte-level spec).
//
//   [header block][layer 0: meta, key means, K chunks, V chunks, exact rows][layer 1 ...]...
//   [index][footer]
// Every chunk payload starts at a multiple of the container's payload alignment: 4 KiB (O_DIRECT)
// by default, down to 64 bytes for small sessions (format version 9). Each chunk, the header and the index carry
// an XXH3-64 checksum; the fixed-size footer at the end holds the index's offset, size and checksum
// and repeats the magic, so truncation is caught. Packed codes are stored verbatim.
#ifndef TQKV_INCLUDE_TQKV_CONTAINER_H_
#define TQKV_INCLUDE_TQKV_CONTAINER_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tqkv/codec.h"
#include "tqkv/geometry.h"
#include "tqkv/status.h"
#include "tqkv/object.h"

namespace tqkv {

// Version 2 adds exact rows (ContainerHeader::exact_head/exact_tail), version 3 an engine state
// (ContainerHeader::engine_state), version 4 mean-removed keys (ContainerHeader::key_mean_block);
// version 5 separate K and V codecs (ContainerHeader::layer_codec_v), version 6 the codec's
// measured error per layer and tensor (ContainerHeader::guard_stride, codec_error) and the
// allocator's budget (allocated_bits), version 7 a token count per layer (ragged sessions,
// ContainerHeader::layer_tokens), version 8 the transform codec (CodecKind::kTransform, whose
// record adds code_bits; layer_tokens always present, ragged or not), version 9 a payload
// alignment other than 4 KiB (ContainerHeader::payload_alignment);
// a writer emits the lowest version that holds the session, so files without the newer features
// stay readable by older readers.
inline constexpr uint32_t kContainerVersion = 9;
// The largest engine state a header may carry (docs/format.md §4): 64 MiB, about 2 million cells
// of a llama.cpp sequence state's metadata.
inline constexpr uint64_t kMaxEngineStateBytes = 64ull << 20;
inline constexpr uint32_t kContainerMinReadableVersion = 1;
// The default payload alignment (versions 1 to 8 know no other) and the block every read of a
// chunk extent is aligned to (O_DIRECT, io_uring, cuFile).
inline constexpr uint64_t kContainerAlignment = 4096;
// The smallest payload alignment (format version 9): a cache line.
inline constexpr uint64_t kContainerMinAlignment = 64;
// Whether `a` can be a container's payload alignment: a power of two in [64, 4096].
inline constexpr bool ValidPayloadAlignment(uint64_t a) {
  return a >= kContainerMinAlignment && a <= kContainerAlignment && (a & (a - 1)) == 0;
}

// Serialized: never renumber.
enum class ChunkType : uint8_t {
  kGroupMeta = 1,  // per layer: the group metadata of every (K/V, head), codec order; present
                   // when K's or V's codec has some ([K heads][K meta] then [V heads][V meta])
  kCodes = 2,      // codes of tokens [token_begin, token_begin + token_count), all heads,
                   // head-major: [kv_head][token][code_bytes] (a head's codes are contiguous,
                   // so one Codec::Decode call per head writes straight into the canonical layout)
  kExactRows = 3,  // version 2, per layer after its V codes: the exact values (source dtype) of
                   // the tokens [0, exact_head) and [tokens - exact_tail, tokens), for K then V,
                   // each range head-major: [kv_head][token][head_dim]
  kKeyMeans = 4,   // version 4, per layer with key means, after its group metadata: the keys'
                   // block means [kv_head][mean block][head_dim], then each key's coefficient
                   // [kv_head][token], all key_mean_dtype
};

// One tensor's codec error as measured at checkpoint time (format version 6, docs/format.md §4):
// sums over the sampled vectors of one layer's K or V, every KV head.
struct TensorCodecError {
  double err = 0;     // Σ ‖x − x̂‖², x̂ what a decoder restores (key means added back)
  double var = 0;     // Σ ‖x − m_h‖², m_h the mean of head h's sampled vectors
  double energy = 0;  // Σ ‖x‖²
  bool operator==(const TensorCodecError&) const = default;
};
// err / var, the guard's figure: 0 when err is 0; when var is 0 (nothing varies) err / energy,
// +inf if energy is 0 too.
double RelativeError(const TensorCodecError& e);
// The guard's threshold on RelativeError: above it a layer's tensor decodes to mostly noise
// (docs/codec.md §9 says how it was chosen).
inline constexpr double kGuardThreshold = 0.5;
// Entries 2·layer + kv of `errors` whose RelativeError exceeds `threshold`.
std::vector<uint32_t> GuardExceeded(const std::vector<TensorCodecError>& errors, double threshold);
// The share of the energy that is the heads' means: 1 − var / energy (0 without energy).
double SharedFraction(const TensorCodecError& e);

struct ContainerHeader {
  std::string model;            // free text, e.g. "qwen2.5-7b"
  ModelGeometry geometry;
  DType source_dtype = DType::kF16;  // element type the session had when checkpointed
  uint64_t tokens = 0;
  uint32_t token_block = 0;     // tokens per kCodes chunk (the last one of a tensor may be shorter)
  std::vector<CodecParams> codecs;   // distinct codecs, at least one
  std::vector<uint16_t> layer_codec; // per layer: index into codecs (per-layer overrides); K's
                                     // codec, and V's unless layer_codec_v says otherwise
  // Version 5: per layer, V's index into codecs. Empty (or equal to layer_codec): V uses
  // layer_codec. Readers of versions 1..4 leave it empty.
  std::vector<uint16_t> layer_codec_v;
  // Tokens at the start (attention sinks) and the end (the most recent) also stored exactly, in
  // source_dtype; restore overwrites their decoded values. exact_head + exact_tail <= the fewest
  // tokens of a layer (MinLayerTokens).
  uint32_t exact_head = 0;
  uint32_t exact_tail = 0;
  // Version 3: bytes an inference engine needs besides the K/V tensors to take the session back
  // (e.g. a llama.cpp sequence state's cells, layer types and tokens, docs/format.md §13). Opaque
  // to the container; empty when there is none. At most kMaxEngineStateBytes.
  std::vector<uint8_t> engine_state;
  // Mean-removed keys (version 4; 0: none). In every layer with a TurboQuant codec, the K codes
  // of token t and KV head h hold k − α·μ, μ the mean of h's keys over the block of
  // key_mean_block tokens holding t and α the key's coefficient (so that |k − α·μ| <= |k|), both
  // stored in the layer's key-means chunk as key_mean_dtype (f32 or f16); decoders add α·μ back
  // in f32 before converting. Needs tokens >= 1.
  uint32_t key_mean_block = 0;
  DType key_mean_dtype = DType::kF32;
  // Version 6: the codec's error measured on tokens t with t % guard_stride == 0 (0: not
  // recorded), per layer K then V (2 × layers entries), and the bits/value budget the codecs were
  // allocated for (0: chosen by the caller).
  uint32_t guard_stride = 0;
  std::vector<TensorCodecError> codec_error;
  float allocated_bits = 0;
  // Version 7: per layer, the tokens it holds, [0, layer_tokens[l]), each in [1, tokens], the
  // largest equal to tokens and some below (a llama.cpp sliding-window layer holds its window).
  // Empty: every layer holds `tokens`. Read it through LayerTokens.
  std::vector<uint64_t> layer_tokens;
  // Version 9: each payload (and the header block's end) is aligned to this, a power of two in
  // [64, 4096] (ValidPayloadAlignment). 4096 (every older file) needs no version 9.
  uint32_t payload_alignment = kContainerAlignment;
};

// The one rule for how many tokens layer `layer` holds: [0, LayerTokens) of the session.
inline uint64_t LayerTokens(const ContainerHeader& h, uint32_t layer) {
  return h.layer_tokens.empty() ? h.tokens : h.layer_tokens[layer];
}
// Layer-tokens the session holds: Σ LayerTokens over its layers (layers × tokens unless ragged).
inline uint64_t HeldTokens(const ContainerHeader& h) {
  if (h.layer_tokens.empty()) return uint64_t{h.geometry.layers} * h.tokens;
  uint64_t n = 0;
  for (uint64_t t : h.layer_tokens) n += t;
  return n;
}
// The bytes of the session's K and V tensors at `dtype` (what its ratio is measured against).
inline uint64_t SessionTensorBytes(const ContainerHeader& h, DType dtype) {
  return 2 * HeldTokens(h) * h.geometry.token_elems() * DTypeSize(dtype);
}
// Whether some layer holds fewer tokens than the session (format version 7).
inline bool IsRagged(const ContainerHeader& h) { return !h.layer_tokens.empty(); }
// The fewest tokens a layer holds (tokens when not ragged): exact rows fit every layer.
inline uint64_t MinLayerTokens(const ContainerHeader& h) {
  uint64_t n = h.tokens;
  for (uint64_t t : h.layer_tokens) n = t < n ? t : n;
  return n;
}

// The codec index of `layer`'s K (kv 0) or V (kv 1) tensor. layer < layers; the header must
// have layer_codec_v empty or of the layer count.
inline uint16_t LayerCodecIndex(const ContainerHeader& h, uint32_t layer, uint8_t kv) {
  return kv == 0 || h.layer_codec_v.empty() ? h.layer_codec[layer] : h.layer_codec_v[layer];
}
// Whether some layer's V codec differs from its K codec (format version 5).
inline bool HasSeparateKvCodecs(const ContainerHeader& h) {
  return !h.layer_codec_v.empty() && h.layer_codec_v != h.layer_codec;
}

// Bytes of `layer`'s group-meta chunk: KV heads x (K's + V's group metadata); 0: no such chunk.
inline uint64_t LayerGroupMetaBytes(const ContainerHeader& h, uint32_t layer) {
  return uint64_t{h.geometry.kv_heads} * (GroupMetaBytesOf(h.codecs[LayerCodecIndex(h, layer, 0)]) +
                                          GroupMetaBytesOf(h.codecs[LayerCodecIndex(h, layer, 1)]));
}

// Whether keys coded by a codec of this kind are mean-removed when the header has key means: every
// lossy kind (TurboQuant, kl), never raw. The one rule for writers, the guard and readers.
inline bool KindTakesKeyMeans(CodecKind kind) { return kind != CodecKind::kRaw; }

// Whether `layer`'s K codes are mean-removed (the header has key means and the layer's K codec
// takes them). The header must be valid (layer_codec in range).
inline bool LayerHasKeyMeans(const ContainerHeader& h, uint32_t layer) {
  return h.key_mean_block != 0 && KindTakesKeyMeans(h.codecs[h.layer_codec[layer]].kind);
}
// Mean blocks per KV head of `layer`: ceil(LayerTokens / key_mean_block); 0 without key means.
inline uint64_t KeyMeanBlocks(const ContainerHeader& h, uint32_t layer) {
  const uint64_t n = LayerTokens(h, layer);
  return h.key_mean_block == 0 ? 0 : n / h.key_mean_block + (n % h.key_mean_block != 0);
}
// Values in `layer`'s key-means chunk (means, then coefficients); the header must be valid.
inline uint64_t KeyMeanValues(const ContainerHeader& h, uint32_t layer) {
  return (KeyMeanBlocks(h, layer) * h.geometry.head_dim + LayerTokens(h, layer)) *
         h.geometry.kv_heads;
}

// The exact rows' token ranges in the order their chunk stores them (for K, then again for V):
// [0, exact_head), then [n - exact_tail, n), n = LayerTokens(h, layer); each range head-major.
struct TokenRange {
  uint64_t begin = 0, count = 0;
};
inline std::array<TokenRange, 2> ExactRanges(const ContainerHeader& h, uint32_t layer) {
  const uint64_t n = LayerTokens(h, layer);
  return {TokenRange{0, h.exact_head}, TokenRange{n - h.exact_tail, h.exact_tail}};
}

inline bool HasExactRows(const ContainerHeader& h) { return h.exact_head != 0 || h.exact_tail != 0; }

// The format version a header needs: 9 with a payload alignment other than 4096, 8 with a transform codec (kl:B), 7 with a per-layer token count, 6 with codec errors, else 5 with separate K/V codecs, else 4
// with key means, else 3 with an engine state, else 2 with exact rows, else 1.
inline uint32_t ContainerVersionFor(const ContainerHeader& h) {
  if (h.payload_alignment != kContainerAlignment) return 9;
  for (const CodecParams& c : h.codecs) {
    if (c.kind == CodecKind::kTransform) return 8;
  }
  if (IsRagged(h)) return 7;
  if (h.guard_stride != 0 || h.allocated_bits != 0) return 6;
  if (HasSeparateKvCodecs(h)) return 5;
  if (h.key_mean_block != 0) return 4;
  return !h.engine_state.empty() ? 3 : HasExactRows(h) ? 2 : 1;
}

struct ChunkEntry {
  ChunkType type = ChunkType::kCodes;
  uint32_t layer = 0;
  uint8_t kv = 0;               // 0 = K, 1 = V (kCodes only; 0 for the per-layer chunk types)
  uint64_t token_begin = 0;
  uint64_t token_count = 0;
  uint64_t offset = 0;          // payload offset in the file, a multiple of payload_alignment
  uint64_t size = 0;            // payload bytes (unpadded)
  uint64_t checksum = 0;        // XXH3-64 of the payload
};

// Writes a container to a WritableObject (which the caller commits). Chunks must come in
// container order: for each layer, its meta chunk (when the layer's codec has group metadata),
// its key-means chunk (LayerHasKeyMeans), then its K chunks by token, then its V chunks by
// token, then its exact-rows chunk (when the header has exact rows).
// Create: InvalidArgument for an invalid header (codec params, layer_codec size/range, token_block,
// geometry, model name over 256 bytes). AddChunk: `key` gives type, layer, kv, token_begin and
// token_count (a meta chunk has kv 0, token_begin 0, token_count 0; code chunks cover
// [0, tokens) in token_block steps); its offset, size and checksum are ignored (the writer
// assigns them). A chunk out of order or of a size other than ExpectedChunkBytes is refused with
// InvalidArgument and nothing is written, so the right chunk can still follow. An Append error is
// returned and sticks: every later call returns it. Finish: InvalidArgument while chunks are missing.
class ContainerWriter {
 public:
  static Result<std::unique_ptr<ContainerWriter>> Create(WritableObject* out,
                                                         const ContainerHeader& header);
  virtual ~ContainerWriter() = default;
  virtual Status AddChunk(const ChunkEntry& key, std::span<const uint8_t> payload) = 0;
  // Writes index and footer. The object is complete afterwards (not yet committed).
  virtual Status Finish() = 0;
  virtual uint64_t BytesWritten() const = 0;
};

// One chunk to read: chunks()[index] into `dst`, which holds exactly ChunkExtent(index) bytes.
struct ChunkRead {
  size_t index = 0;
  std::span<uint8_t> dst;
};

// Parses and verifies header, index and footer; chunk payloads are verified as they are read.
// Never trusts a size field: a hostile file gets Corruption naming the object and offset, never
// a crash or an allocation larger than the file.
//
// The one read path of every restore (host buffer, per-layer callback, GPU): a chunk is read as
// its extent (ChunkExtent) and accepted only after VerifyChunkExtent, which checks its size, its
// checksum and its zero padding. ReadChunks does both for a batch; a path that moves the bytes by
// other means (cuFile into device memory) calls VerifyChunkExtent on a host copy before using them.
class ContainerReader {
 public:
  // `name` names the object in error messages.
  static Result<std::unique_ptr<ContainerReader>> Open(ReadableObject* in, std::string name);
  virtual ~ContainerReader() = default;
  virtual const ContainerHeader& header() const = 0;
  virtual const std::vector<ChunkEntry>& chunks() const = 0;
  virtual uint64_t file_bytes() const = 0;

  // Chunk i's extent, what a read of it fetches: the whole 4 KiB blocks around its payload,
  // [floor_4096(offset), min(ceil_4096(offset + size), index offset)), so O_DIRECT reads land
  // straight in a 4 KiB-aligned buffer. It holds the payload (at PayloadOffsetInExtent), all of
  // the zero padding after it and, below 4 KiB alignment (version 9), maybe bytes of neighbouring
  // chunks (extents may overlap). With 4 KiB alignment it is [offset, next payload). The last
  // chunk's ends at its payload: the index follows directly. i < chunks().size().
  virtual uint64_t ChunkExtent(size_t i) const = 0;
  // File offset of chunk i's extent (a multiple of 4096), and where its payload starts in it.
  virtual uint64_t ChunkExtentOffset(size_t i) const = 0;
  virtual uint64_t PayloadOffsetInExtent(size_t i) const = 0;
  // The largest ChunkExtent; 0 without chunks.
  virtual uint64_t MaxChunkExtent() const = 0;
  // Corruption unless `extent` (chunk i's ChunkExtent bytes as read) has the payload's checksum
  // at PayloadOffsetInExtent, followed by zero padding up to the next payload; InvalidArgument
  // for i out of range or a span of another size.
  virtual Status VerifyChunkExtent(size_t i, std::span<const uint8_t> extent) const = 0;
  // Reads the extents of `reads` in one ReadBatch (io_uring keeps them in flight), then verifies
  // each with VerifyChunkExtent; returns the first error (InvalidArgument as VerifyChunkExtent).
  virtual Status ReadChunks(std::span<const ChunkRead> reads) = 0;
  // ReadChunks without the verification: the bytes are not to be used before VerifyChunkExtent
  // accepts them (a pipeline that checksums on another thread while the next batch is read).
  virtual Status ReadChunkExtents(std::span<const ChunkRead> reads) = 0;

  // Verifies a payload alone (entry.size bytes, no padding) against its entry.
  virtual Status VerifyChunk(const ChunkEntry& entry, std::span<const uint8_t> payload) const = 0;
  // Reads one chunk's payload into dst (entry.size bytes) and verifies it, and checks that the
  // zero padding after it is intact. `entry` must be one of chunks() (else InvalidArgument).
  // The const methods are thread-safe; the reading ones are as thread-safe as the object's reads.
  virtual Status ReadChunk(const ChunkEntry& entry, std::span<uint8_t> dst) = 0;
};

// Expected payload bytes of a chunk, derived from header and codecs (for validation by callers).
Result<uint64_t> ExpectedChunkBytes(const ContainerHeader& header, const ChunkEntry& entry);

}  // namespace tqkv

#endif  // TQKV_INCLUDE_TQKV_CONTAINER_H_
