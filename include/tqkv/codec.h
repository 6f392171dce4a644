// The TurboQuant codec: pure math on head vectors. Knows no container, store or pipeline.
//
// A codec spec string ("tq3", "tq2.5,norm=f16", "tq:b=3,rot=haar,seed=7") is parsed once at the edge
// into a CodecSpec; Codec::Create resolves it for one head dimension into CodecParams (every value
// needed to decode, as stored in the container) and builds rotations and codebooks.
//
// "kl:B" is the transform codec (docs/codec.md §11): a per-group basis and bit allocation fitted
// at checkpoint time from the session itself, B bits per value for each vector's code.
//
// Encoded layout of one TurboQuant vector (docs/codec.md has the byte-level description):
//   norms:  one per subset, f32 or f16, subset order (outliers first when split)
//   planes: per subset, `bits` bit-planes of ceil(channels/8) bytes; plane p holds bit p of each index
//   qjl:    [f32 gamma][ceil(d/8) sign bytes] when qjl is on (unsplit codecs only)
#ifndef TQKV_INCLUDE_TQKV_CODEC_H_
#define TQKV_INCLUDE_TQKV_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tqkv/status.h"
#include "tqkv/types.h"

namespace tqkv {

class ThreadPool;

// Serialized in the container: never renumber.
enum class CodecKind : uint8_t { kRaw = 0, kTurboQuant = 1, kTransform = 2 };
enum class RotationKind : uint8_t {
  kAuto = 0,       // parse-time only: Hadamard for powers of two, Kronecker otherwise
  kHadamard = 1,   // H·D/sqrt(d): random signs, one round
  kHadamard2 = 2,  // two rounds with independent signs
  kHaar = 3,       // dense orthogonal: QR of a Gaussian matrix from the project's PRNG
  kKronecker = 4,  // (Q_q (x) H_B)·D: m = q·B, B the largest power of two dividing m, Q_q Haar
};
std::string_view RotationKindName(RotationKind k);

// What a spec string says, before the head dimension is known.
struct CodecSpec {
  CodecKind kind = CodecKind::kRaw;
  DType raw_dtype = DType::kF16;  // kRaw: stored element type
  uint8_t bits = 3;               // bits of the regular channels (or of all channels when unsplit)
  uint8_t outlier_bits = 0;       // 0: unsplit
  // Outlier channel count: exact when outlier_channels > 0, else head_dim * num / den.
  uint16_t outlier_channels = 0;
  uint16_t outlier_num = 1, outlier_den = 4;
  RotationKind rotation = RotationKind::kAuto;
  uint64_t seed = 0x7471'6b76'0000'0001ull;  // "tqkv" + 1
  DType norm_dtype = DType::kF32;             // kF32 or kF16
  bool norm_correction = false;
  bool qjl = false;  // TurboQuant_prod: (bits-1)-bit mse + 1-bit QJL residual
  // kTransform ("kl:B"): the budget B in thousandths of a bit per value (norm included); its
  // norm_dtype is f16 unless the spec says norm=f32.
  uint32_t kl_milli = 0;

  bool operator==(const CodecSpec&) const = default;
};

// Parses "fp16", "bf16", "fp32", "tq2", "tq3", "tq4", "tq2.5", "tq3.5", optionally followed by
// ",key=value" modifiers, or the general "tq:key=value,...". Keys: b (bits), split (K@B or
// N/D@B, e.g. 32@4 or 1/4@4), rot (auto|hd|hd2|haar|kron), seed, norm (f32|f16), nc (0|1), qjl (0|1).
// Or the transform codec "kl:B[,norm=f16|f32]", B in [1, 8] with at most 3 decimals.
Result<CodecSpec> ParseCodecSpec(std::string_view spec);
// The shortest string that parses back to `spec` (a preset name where one matches).
std::string FormatCodecSpec(const CodecSpec& spec);

// The codecs "auto:B" chooses from (",from=" of the spec, docs/codec.md §10): TurboQuant's
// presets (the default), the transform codec kl:B at a few budgets, or both.
enum class AllocatorFamily : uint8_t { kTurboQuant = 0, kTransform = 1, kAll = 2 };
// What "auto:B" plans a checkpoint with before it chooses (KvCodecSpec::k and v of such a spec):
// its candidates take key means, so the plan must have them.
inline constexpr std::string_view kAllocatorPlanCodec = "tq3";

// Separate codecs for keys and values (docs/codec.md §2). k == v for a plain spec.
struct KvCodecSpec {
  CodecSpec k, v;
  // "auto:B": the checkpoint picks each layer's K and V codec for B bits per value, every byte
  // counted (CheckpointOptions::allocate_bits, docs/codec.md §10); k and v are then
  // kAllocatorPlanCodec.
  double auto_bits = 0;
  AllocatorFamily auto_from = AllocatorFamily::kTurboQuant;  // "auto:B,from=tq|kl|all"
  bool same() const { return k == v; }
  bool operator==(const KvCodecSpec&) const = default;
};
// Parses "auto:B[,from=tq|kl|all]" (B bits per value, 0 < B <= 64: the bit allocator), a plain spec (both
// tensors) or a K/V spec: the preset family "kAvB" (A, B each 1..8,
// 2.5 or 3.5: K as tqA, V as tqB, e.g. k4v2, k3.5v2.5) or the general "k:SPEC/v:SPEC" (each a
// plain spec, e.g. "k:tq4,norm=f16/v:tq2"). '/' in a plain spec is always followed by a digit, so
// the "/v:" that ends the K part is unambiguous.
Result<KvCodecSpec> ParseKvCodecSpec(std::string_view spec);
// The shortest string that parses back: the plain spec when k == v, else "kAvB" where both are
// presets, else "k:SPEC/v:SPEC".
std::string FormatKvCodecSpec(const KvCodecSpec& spec);
// Joins two labels (FormatCodecSpec or CodecLabel strings) the way FormatKvCodecSpec does.
std::string JoinKvLabels(const std::string& k, const std::string& v);

// One subset of channels with its own rotation and codebook. A transform codec (kTransform) holds
// its codebooks here instead: subset j is the Gaussian Lloyd-Max codebook of j + 1 bits
// (channels = head_dim, rotation kAuto meaning none, seed 0).
struct SubsetParams {
  uint16_t channels = 0;
  uint8_t bits = 0;  // index bits (mse part)
  RotationKind rotation = RotationKind::kHadamard;
  uint64_t seed = 0;               // rotation seed of this subset (derived from the spec's seed)
  std::vector<float> centroids;    // 2^bits, ascending, unit-variance domain (x sqrt(channels))

  bool operator==(const SubsetParams&) const = default;
};

// Everything needed to decode, resolved for one head dimension. Stored verbatim in the container.
struct CodecParams {
  CodecKind kind = CodecKind::kRaw;
  uint32_t head_dim = 0;
  DType raw_dtype = DType::kF16;
  std::vector<SubsetParams> subsets;  // 1 (unsplit) or 2 (outliers, rest)
  DType norm_dtype = DType::kF32;
  bool norm_correction = false;
  bool qjl = false;
  uint64_t qjl_seed = 0;
  uint32_t code_bits = 0;  // kTransform: index bits per vector (the group's allocation sums to it)

  bool split() const { return kind == CodecKind::kTurboQuant && subsets.size() == 2; }
  bool operator==(const CodecParams&) const = default;
};

// Sizes and checks that need no Codec instance (the container reader uses them on stored params).
size_t CodeBytesOf(const CodecParams& params);
size_t GroupMetaBytesOf(const CodecParams& params);
// InvalidArgument unless the params are self-consistent: known kinds, 1..8 bits, subsets that
// cover head_dim, 2^bits finite ascending centroids, rotation valid for the subset size (at most
// MaxRotationChannels), QJL only up to kMaxQjlHeadDim.
Status ValidateCodecParams(const CodecParams& params);
// The human-readable name of stored parameters ("tq3", "tq2.5", "tq:b=3,rot=haar", "fp16"): the
// spec they were resolved from, seeds aside, formatted by FormatCodecSpec.
std::string CodecLabel(const CodecParams& params);

// The label of a layer's K and V codecs (JoinKvLabels of their CodecLabel).
std::string KvCodecLabel(const CodecParams& k, const CodecParams& v);

// What building a codec from its params costs before a single vector is decoded: the limits that
// keep a small, checksum-valid container from asking for unbounded memory or time
// (docs/format.md "Resource limits").
struct CodecSetupCost {
  uint64_t bytes = 0;  // tables the codec holds: signs, dense matrices, codebooks
  uint64_t ops = 0;    // multiply-adds and PRNG draws to build them
};
// One row per rotation kind: the largest subset it rotates and what building it costs. Hadamard
// kinds keep O(d) signs; Haar keeps a dense d x d matrix (and its transpose) generated by
// Gram-Schmidt in O(d^3). 0 for kinds that are not stored rotations.
uint32_t MaxRotationChannels(RotationKind kind);
CodecSetupCost RotationSetupCost(RotationKind kind, uint32_t channels);
// The QJL matrix is dense (head_dim x head_dim Gaussians).
inline constexpr uint32_t kMaxQjlHeadDim = 512;
// A transform codec's head_dim: a multiple of 8 from 16 to this (its classes are multiples of 8).
inline constexpr uint32_t kMaxTransformHeadDim = 256;
// Every table of one codec (subset rotations, codebooks, QJL matrix). Params must be valid.
CodecSetupCost SetupCostOf(const CodecParams& params);
// All codecs of one container together (they are built when it is opened) stay within these.
inline constexpr uint64_t kMaxSetupBytes = uint64_t{64} << 20;
inline constexpr uint64_t kMaxSetupOps = uint64_t{1} << 27;

class Codec {
 public:
  // Resolves the spec for head_dim (>= 16 for TurboQuant), builds rotations and codebooks.
  static Result<std::unique_ptr<Codec>> Create(const CodecSpec& spec, uint32_t head_dim);
  // From stored parameters (a container's codec record): uses the stored centroids as they are.
  static Result<std::unique_ptr<Codec>> FromParams(const CodecParams& params);
  virtual ~Codec() = default;

  virtual const CodecParams& params() const = 0;
  uint32_t head_dim() const { return params().head_dim; }
  // Bytes of one encoded vector.
  virtual size_t code_bytes() const = 0;
  // Bytes of per-group metadata (the outlier channel mask of a split codec), else 0.
  virtual size_t group_meta_bytes() const = 0;
  // Every stored bit (norms, per-group metadata amortised over the group) per value.
  double BitsPerValue(size_t vectors_per_group) const;

  // Group metadata from the group's vectors: the outlier channels with the largest L2 norm over
  // the n vectors (original basis), as a bitmask of ceil(d/8) bytes. No-op when unsplit.
  // Split codecs: meta must be exactly group_meta_bytes(); ties go to the lower channel index and
  // a channel with a NaN energy ranks first.
  // x: n vectors of head_dim elements of `dtype`, `stride` elements apart.
  virtual Status SelectGroupMeta(const void* x, DType dtype, size_t n, size_t stride,
                                 std::span<uint8_t> meta) const = 0;

  // The check Decode makes of a group's metadata, alone: a split codec's mask must have exactly
  // group_meta_bytes() bytes and mark exactly its outlier channels, none past head_dim; unsplit
  // codecs have none to check. VerifyObject applies it to every stored mask, so that a
  // container that verifies also decodes.
  virtual Status CheckGroupMeta(std::span<const uint8_t> meta) const = 0;

  // Encodes n vectors (x as above) into out: n * code_bytes() bytes. `pool` may be null.
  // meta: the group's mask from SelectGroupMeta (split codecs; exactly K channels marked).
  // Zero vectors (or ones whose f32 sum of squares underflows) decode to zeros; a vector with any
  // inf/NaN element (or an f32 sum of squares that overflows) decodes to all-NaN, that vector only.
  // Bad arguments (sizes, stride < head_dim, dtype, meta) give InvalidArgument before any work.
  virtual Status Encode(const void* x, DType dtype, size_t n, size_t stride,
                        std::span<const uint8_t> meta, std::span<uint8_t> out,
                        ThreadPool* pool = nullptr) const = 0;
  // Decodes n codes (n * code_bytes() bytes) into n vectors of `dtype`, `stride` elements apart.
  virtual Status Decode(std::span<const uint8_t> codes, size_t n, std::span<const uint8_t> meta,
                        void* out, DType dtype, size_t stride,
                        ThreadPool* pool = nullptr) const = 0;
  // Decode, then x_ij = x_ij + scale_i · mean_j on every decoded f32 vector i (the product
  // rounded to f32, then the sum), before the conversion to `dtype`: how mean-removed keys decode
  // (docs/format.md §5). mean: head_dim values; scale: n values. TurboQuant only: a raw codec
  // answers InvalidArgument.
  virtual Status DecodeAdd(std::span<const uint8_t> codes, size_t n, std::span<const uint8_t> meta,
                           std::span<const float> mean, std::span<const float> scale, void* out,
                           DType dtype, size_t stride, ThreadPool* pool = nullptr) const;
};

}  // namespace tqkv

#endif  // TQKV_INCLUDE_TQKV_CODEC_H_
