// llama.cpp sequence state <-> tqkv session (docs/llama.md; the stored form is docs/format.md §13).
//
// The blob is what llama_state_seq_get_data writes in the pinned llama.cpp (llama-cpp-python
// 0.3.36, llama.cpp 0c1e57098: src/llama-context.cpp state_seq_get_data, src/llama-kv-cache.cpp
// state_write, src/llama-kv-cache-iswa.cpp): a magic and the sequence id, then one or two KV caches (two for sliding-window models such as Gemma 3: the full-attention cache,
// then the sliding-window one), each `n_stream` streams of cells (position, sequence ids), the
// K rows of every layer and the V rows, these either per cell or transposed (`v_trans`, llama.cpp
// without flash attention). A slot file (llama-server --slot-save-path, llama_state_seq_save_file)
// is 'ggsq', version 3, the token count, the tokens, then the caches (without magic and id).
//
// f32, f16 and bf16 rows are read; quantized cache types are refused naming the type. Every count
// is checked against the blob's length, and a blob that does not parse to its last byte is refused
// as a layout this reader does not know, never misread.
#ifndef TQKV_INCLUDE_TQKV_LLAMA_STATE_H_
#define TQKV_INCLUDE_TQKV_LLAMA_STATE_H_

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tqkv/checkpoint.h"
#include "tqkv/kv_cache.h"
#include "tqkv/status.h"
#include "tqkv/store.h"

namespace tqkv::llama {

// ggml type ids (ggml.h; upstream never renumbers them) of the rows this reader accepts.
inline constexpr int32_t kGgmlF32 = 0;
inline constexpr int32_t kGgmlF16 = 1;
inline constexpr int32_t kGgmlBF16 = 30;
// "f32", "q8_0", ...; "type <n>" for ids it does not know.
std::string GgmlTypeName(int32_t type);

struct Cell {
  int32_t pos = 0;
  std::vector<int32_t> seq_ids;
  // llama_kv_cell_ext (x, y, tok), written only by models with M-RoPE or per-layer embeddings.
  std::array<uint8_t, 12> ext{};
};

// One layer of one stream. K is [cell][n_embd_k], V is [cell][n_embd_v], or [n_embd_v][cell]
// when the stream is v_trans; elements of the layer's ggml type, as in the blob.
struct Layer {
  int32_t k_type = kGgmlF16;
  int32_t v_type = kGgmlF16;
  uint32_t n_embd_k = 0;
  uint32_t n_embd_v = 0;
  std::vector<uint8_t> k;
  std::vector<uint8_t> v;
};

struct Stream {
  std::vector<Cell> cells;   // empty: the stream holds no cell of the sequence
  bool v_trans = false;      // only meaningful with cells
  std::vector<Layer> layers; // only with cells
};

struct CacheState {
  std::vector<Stream> streams;  // n_stream of them
};

// llama_state_seq_get_data puts this u32 and the source sequence id before the caches
// (llama-context.cpp io_magic); llama_state_seq_save_file writes the caches alone.
inline constexpr uint32_t kSeqDataMagic = 0xaf143cd8u;

struct SeqState {
  bool io_header = false;           // starts with kSeqDataMagic and seq_id (a get_data blob)
  int32_t seq_id = 0;               // the sequence it was taken from, when io_header
  bool cell_ext = false;            // cells carry llama_kv_cell_ext
  std::vector<CacheState> caches;   // 1, or 2 for the sliding-window (iSWA) layout
};

// Parses a blob from llama_state_seq_get_data. Corruption for a truncated or damaged blob or an
// unknown layout (saying where parsing stopped), Unsupported for a quantized K/V type (naming it).
// Cells with and without llama_kv_cell_ext are told apart by which reading consumes the blob
// exactly with every cell's sequence ids ascending and non-negative (as llama.cpp writes them);
// a blob both readings accept is refused as ambiguous.
Result<SeqState> ParseSeqState(std::span<const uint8_t> blob);
// The blob llama.cpp would write for `state` (ParseSeqState's inverse, byte for byte).
std::vector<uint8_t> SerializeSeqState(const SeqState& state);

inline constexpr uint32_t kSlotMagic = 0x67677371u;  // 'ggsq' (LLAMA_STATE_SEQ_MAGIC)
inline constexpr uint32_t kSlotVersion = 3;          // LLAMA_STATE_SEQ_VERSION

struct SlotFile {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> state;  // the sequence state blob
};
// Corruption for a bad magic, truncation or a token count beyond the file; Unsupported for
// another version. The blob itself is not parsed here.
Result<SlotFile> ParseSlotFile(std::span<const uint8_t> file);
std::vector<uint8_t> SerializeSlotFile(const SlotFile& slot);

// What `tqkv llama import` and tqkv.llama take: a slot file when the bytes start with its magic,
// else a bare sequence state blob (not parsed here).
struct SlotOrBlob {
  SlotFile slot;  // tokens empty for a blob
  bool is_slot = false;
};
Result<SlotOrBlob> ParseSlotFileOrBlob(std::vector<uint8_t> bytes);

// A session in tqkv's canonical layout plus the engine state that rebuilds the blob.
struct Session {
  std::unique_ptr<KvCacheBuffer> kv;
  std::vector<uint8_t> engine_state;  // CheckpointOptions::engine_state
};
// Maps every layer of every stream with cells to one session layer (caches in blob order, then
// streams, then layers) and every cell to a session row. The session's tokens are the most cells
// a stream holds; streams holding that many share rows by position where possible; a stream with
// fewer cells (a sliding-window cache) makes its layers ragged: they hold only its cells, by
// position (KvCache::layer_tokens, format version 7), so memory and the object follow the
// blob's size. The row width n_embd is split as (n_embd / head_dim) heads of head_dim; every
// layer's K and V must have the same n_embd. The dtype is the layers' common type, else f32
// (exact for every accepted type). `tokens` (a slot file's) is kept in the engine state.
Result<Session> ToSession(const SeqState& state, uint32_t head_dim, std::string model,
                          const std::vector<int32_t>* tokens = nullptr);

struct Rebuilt {
  std::vector<uint8_t> blob;     // the sequence state for llama_state_seq_set_data
  bool has_tokens = false;
  std::vector<int32_t> tokens;   // when the session came from a slot file
};
// The inverse of ToSession: `kv` is the restored session (any dtype; rows are converted to each
// layer's type), `engine_state` the header's. Corruption for an engine state that does not parse
// or does not fit the session.
Result<Rebuilt> FromSession(const KvCache& kv, std::span<const uint8_t> engine_state);

// Checkpoint a blob (and a slot file's tokens) under `key`; options.engine_state is set here.
Result<CheckpointStats> CheckpointSeqState(std::span<const uint8_t> blob, uint32_t head_dim,
                                           std::string model, const std::vector<int32_t>* tokens,
                                           CheckpointOptions options, Store& store,
                                           std::string_view key);
// Restore a session written by CheckpointSeqState and rebuild its blob. The object is opened
// once (RestoreInto with a MakeCache; the engine state comes back in RestoreStats). The session
// is decoded at its source dtype (options.dtype is not used), so with a raw f16 codec on an f16
// cache the blob is the original's, byte for byte. InvalidArgument for a session without a
// llama.cpp engine state, before anything is allocated or decoded.
Result<Rebuilt> RestoreSeqState(Store& store, std::string_view key, RestoreOptions options = {});

}  // namespace tqkv::llama

#endif  // TQKV_INCLUDE_TQKV_LLAMA_STATE_H_
