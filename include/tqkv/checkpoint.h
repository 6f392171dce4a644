// Checkpoint a session's KV cache to a store, and restore it: the pipelines
//   checkpoint: source -> select group metadata -> encode -> container writer -> store (atomic)
//   restore:    store -> container reader (verify) -> decode -> sink (host memory or per layer)
// Reads run ahead of decoding (several chunks in flight) so a restore takes about
// max(read time, decode time), not their sum.
#ifndef TQKV_INCLUDE_TQKV_CHECKPOINT_H_
#define TQKV_INCLUDE_TQKV_CHECKPOINT_H_

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tqkv/codec.h"
#include "tqkv/container.h"
#include "tqkv/kv_cache.h"
#include "tqkv/kv_layout.h"
#include "tqkv/kv_source.h"
#include "tqkv/status.h"
#include "tqkv/store.h"

namespace tqkv {

class ThreadPool;

struct LayerCodec {
  uint32_t layer = 0;
  CodecSpec spec;                   // K's codec, and V's unless v_spec is set
  std::optional<CodecSpec> v_spec;  // V's codec where it differs (e.g. "0:k4v2")
};

inline constexpr uint32_t kKeyMeanPerSession = 0xFFFFFFFFu;
inline constexpr uint32_t kDefaultKeyMeanBlock = 128;

struct CheckpointOptions {
  CodecSpec codec;                          // default codec for every layer (K, and V unless v_codec)
  std::optional<CodecSpec> v_codec;         // V's default where it differs (format version 5)
  // > 0: the bit allocator ("auto:B", docs/codec.md §10) picks each layer's K and V codec from
  // tq2, tq2.5, tq3, tq3.5 and tq4 for at most this many bits per value, every byte of the
  // container counted, by the errors measured on the session; codec, v_codec and layer_overrides
  // are then unused (overrides are refused). The choice is stored (format version 6).
  double allocate_bits = 0;
  AllocatorFamily allocate_from = AllocatorFamily::kTurboQuant;  // its candidates (kl:B: kTransform)
  std::vector<LayerCodec> layer_overrides;  // e.g. first and last layers at more bits
  uint32_t token_block = 0;                 // tokens per chunk; 0: about 2 MiB chunks
  ThreadPool* pool = nullptr;               // encode threads; null: the calling thread
  // Tokens also stored exactly (source dtype) besides their codes: the first `exact_head`
  // (attention sinks) and the last `exact_tail` (the most recent, which the next tokens attend to
  // most). Clamped to the session. Costs 2 x layers x (first + last) x kv_heads x head_dim
  // elements; docs/accuracy.md measures what it buys.
  uint32_t exact_head = 0;  // ContainerHeader::exact_head after clamping
  uint32_t exact_tail = 0;
  // Stored verbatim in the header (ContainerHeader::engine_state, format version 3): what an
  // engine needs to take the session back, e.g. EncodeLlamaEngineState (include/tqkv/llama_state.h).
  std::vector<uint8_t> engine_state;
  // Mean-removed keys (docs/format.md §5, format version 4): the K codes of every TurboQuant
  // layer hold k − α·μ, μ the mean of the head's keys over blocks of this many tokens and α a
  // per-key coefficient (both stored exactly as key_mean_dtype); restore adds α·μ back. 0: off;
  // at least the session's length (e.g. kKeyMeanPerSession): one mean per session.
  // docs/accuracy.md measures the default.
  uint32_t key_mean_block = kDefaultKeyMeanBlock;
  DType key_mean_dtype = DType::kF16;  // f16 or f32
  // The guard (format version 6, docs/codec.md §9): measure each layer's K and V codec error on
  // every GuardStride-th token and store it; off: not recorded (the lowest version as before).
  bool guard = true;
  // Refuse the checkpoint (InvalidArgument, nothing left in the store) when some layer's K or V
  // relative error exceeds guard_threshold; otherwise CheckpointStats::guard_exceeded says so.
  bool strict = false;
  double guard_threshold = kGuardThreshold;
  // Where payloads start (ContainerHeader::payload_alignment): a power of two from 64 to 4096.
  // 4096 suits big sessions read chunk by chunk with O_DIRECT; a small one (a vLLM chunk) wastes
  // up to 4 KiB of padding per chunk, 64 nearly nothing (format version 9, docs/format.md §5).
  uint32_t alignment = kContainerAlignment;
};

struct CheckpointStats {
  uint64_t bytes_written = 0;   // the whole container
  uint64_t fp16_bytes = 0;      // the session's tensors at FP16
  double seconds = 0;           // wall time, first byte produced to committed
  double encode_seconds = 0;    // time spent selecting metadata and encoding
  double write_seconds = 0;     // time spent in Append and Commit
  double source_seconds = 0;    // time spent producing the session (KvSource::ReadLayer)
  double guard_seconds = 0;     // time spent measuring codec errors (reading layers included)
  // As stored (ContainerHeader::guard_stride / codec_error, [layer][K, V]); empty without guard.
  uint32_t guard_stride = 0;
  std::vector<TensorCodecError> codec_error;
  std::vector<uint32_t> guard_exceeded;  // entries 2·layer + kv over options.guard_threshold
  // With allocate_bits: the codec chosen per layer, [layer][K, V] labels ("tq3.5").
  std::vector<std::array<std::string, 2>> allocated;
};

// A guard figure for people: 3 significant digits ("96.5", "0.0339"), "inf".
std::string FormatGuardFigure(double v);
// "layer 0 K: 96.5 > 0.5, layer 1 K: 2.4 > 0.5" for the GuardExceeded entries.
std::string DescribeGuardExceeded(const std::vector<TensorCodecError>& errors,
                                  const std::vector<uint32_t>& exceeded, double threshold);

// Encodes and writes the session under `key`, published atomically. On any failure nothing
// readable is left under `key` (a previous object with the key stays as it was).
Result<CheckpointStats> Checkpoint(KvSource& source, const CheckpointOptions& options, Store& store,
                                   std::string_view key);
Result<CheckpointStats> Checkpoint(const KvCache& cache, const CheckpointOptions& options,
                                   Store& store, std::string_view key);

struct RestoreOptions {
  DType dtype = DType::kF16;          // element type of the restored tensors
  ThreadPool* pool = nullptr;         // decode threads; null: the calling thread
  // Read-ahead budget: host memory of huge pages, kept after the restore for the next one (at
  // most 2 GiB across restores, docs/store.md §4).
  uint64_t inflight_bytes = 64 << 20;
  // Batches read at once (reader threads). One store batch ends with its slowest piece: others
  // already queued keep the disk busy through that tail and through a lane's wake-up when the
  // cores are busy (docs/lab/benchmarks-log.md 2.5: 4 lanes, 64 MiB, qd 16, measured while reads went
  // through the page cache; 2.5a).
  uint32_t read_lanes = 4;
  // When set, the stored geometry must equal it (else InvalidArgument saying what differs).
  const ModelGeometry* expect_geometry = nullptr;
  // When set, the stored model string must equal it (else InvalidArgument), checked with the
  // geometry before a byte of the destination is written: an engine's identity of the session.
  std::optional<std::string> expect_model;
  bool drop_cache = false;            // evict the object from the page cache before reading
  // Restore(): allocate the destination and write every byte of it before the restore clock
  // starts, as an inference server restores into KV memory that is already mapped (first-touch
  // page faults are then not part of the restore). RestoreStats::alloc_seconds gets that time.
  bool prefault = false;
  // RestoreInto and Restore: called on the restoring thread as soon as layer `layer` of the
  // destination is decoded and verified, in layer order, so a caller can start on layer 0 before
  // the rest arrives. An error return stops the restore with that error.
  std::function<Status(uint32_t layer)> layer_ready;
};

struct RestoreStats {
  uint64_t bytes_read = 0;      // bytes moved from the store
  ReadPathBytes read_path;      // of those, how they moved (ReadableObject::PathBytes)
  uint64_t fp16_bytes = 0;      // the session's tensors at FP16
  uint64_t tokens = 0;
  std::string model;
  ModelGeometry geometry;
  double seconds = 0;           // first read to the whole session decoded and verified
  double read_busy_seconds = 0;    // time the reader spent in store reads
  double decode_busy_seconds = 0;  // time spent decoding (wall, on the pool)
  double first_layer_seconds = 0;  // until layer 0 was ready
  double alloc_seconds = 0;        // Restore() with prefault: allocating and touching the destination
  bool drop_cache_ok = true;
  std::string drop_cache_error;
  // The header's engine state (ContainerHeader::engine_state, CheckpointOptions::engine_state):
  // an engine takes its session back from the restore's result without opening the object again.
  std::vector<uint8_t> engine_state;
};

// Restores into `dst`, whose geometry, token count and dtype must match the stored session.
Status RestoreInto(Store& store, std::string_view key, KvCache& dst, const RestoreOptions& options,
                   RestoreStats* stats = nullptr);
// Restores into caller tensors in an engine's layout (kv_layout.h: transposed, paged), whose
// geometry, token count and dtype must match the stored session and whose layout must fit
// dst.tensor_elems (else InvalidArgument). Layouts with contiguous channels (DecodesInPlace) are
// decoded into directly, exact rows and mean-removed keys included; others through one layer of
// staging. options.layer_ready as above.
Status RestoreInto(Store& store, std::string_view key, const LayoutTensors& dst,
                   const RestoreOptions& options, RestoreStats* stats = nullptr);
// As above, into tensors laid out by `make_destination` once the stored header (geometry, tokens,
// source dtype) is read, so the object is opened once: a binding allocates the caller's arrays
// there. Its error return stops the restore.
using MakeDestination = std::function<Result<LayoutTensors>(const ContainerHeader& header)>;
Status RestoreInto(Store& store, std::string_view key, const MakeDestination& make_destination,
                   const RestoreOptions& options, RestoreStats* stats = nullptr);
// As RestoreInto(KvCache&), into the cache `make_cache` returns once the stored header is read,
// so the object is opened once and the cache can follow the header (its source dtype, a ragged
// session's layer token counts): the llama.cpp restore allocates its session there. The cache
// must outlive the call; an error return stops the restore.
using MakeCache = std::function<Result<KvCache*>(const ContainerHeader& header)>;
Status RestoreInto(Store& store, std::string_view key, const MakeCache& make_cache,
                   const RestoreOptions& options, RestoreStats* stats = nullptr);
// Allocates and restores the whole session.
Result<std::unique_ptr<KvCacheBuffer>> Restore(Store& store, std::string_view key,
                                               const RestoreOptions& options,
                                               RestoreStats* stats = nullptr);
// Streams: calls on_layer(layer, k, v) as soon as each layer is decoded and verified (tensors of
// options.dtype in the canonical layout); the buffers are reused after the callback returns, so
// memory stays at about one layer whatever the session length.
using LayerCallback = std::function<Status(uint32_t layer, const void* k, const void* v)>;
Status RestoreStreaming(Store& store, std::string_view key, const RestoreOptions& options,
                        const LayerCallback& on_layer, RestoreStats* stats = nullptr);

// Allocates, touches and keeps the read-ahead memory of `concurrent` host restores with
// `options.inflight_bytes` each (within the 2 GiB kept across restores): a server calls it once at
// start-up so its first restores do not pay the first touch of fresh memory, as later ones do
// not (on the development VM 8 concurrent fp16 restores read 29–36 % slower on fresh memory,
// docs/lab/benchmarks-log.md 2.5b). Returns the bytes now kept; InvalidArgument past the 2 GiB,
// ResourceExhausted if memory runs out.
Result<uint64_t> WarmRestoreMemory(size_t concurrent, const RestoreOptions& options = {});

// Runs every check a restore runs on a stored session (checksums, layout, outlier masks; it
// decodes each layer into one layer's memory and drops it): OK exactly when Restore would be.
Status VerifyObject(Store& store, std::string_view key);

}  // namespace tqkv

#endif  // TQKV_INCLUDE_TQKV_CHECKPOINT_H_
