// llama.cpp sequence state blob and slot file: parse and serialize (include/tqkv/llama_state.h).
// The layout follows the pinned llama.cpp's llama_kv_cache::state_write_meta / state_write_data;
// docs/llama.md lists it field by field.
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <string>

#include "tqkv/llama_state.h"

namespace tqkv::llama {
namespace {

constexpr size_t kExtBytes = 12;  // sizeof(llama_kv_cell_ext): llama_pos x, y; llama_token tok

std::optional<uint32_t> ElementBytes(int32_t type) {
  switch (type) {
    case kGgmlF32: return 4;
    case kGgmlF16:
    case kGgmlBF16: return 2;
    default: return std::nullopt;
  }
}

// Bounds-checked little-endian reads; the first failure sticks and names the offset.
class BlobReader {
 public:
  BlobReader(std::span<const uint8_t> b, std::string_view prefix) : b_(b), prefix_(prefix) {}
  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  size_t offset() const { return pos_; }
  size_t remaining() const { return b_.size() - pos_; }
  bool Need(uint64_t n, std::string_view what) {
    if (!ok()) return false;
    if (n > remaining()) {
      Fail(what, "needs " + std::to_string(n) + " bytes, " + std::to_string(remaining()) +
                     " left (truncated, or a layout this reader does not know)");
      return false;
    }
    return true;
  }
  uint32_t U32(std::string_view what) {
    if (!Need(4, what)) return 0;
    uint32_t v;
    std::memcpy(&v, b_.data() + pos_, 4);  // the blob is host-endian; llama.cpp runs here too
    pos_ += 4;
    return v;
  }
  int32_t I32(std::string_view what) { return static_cast<int32_t>(U32(what)); }
  uint64_t U64(std::string_view what) {
    if (!Need(8, what)) return 0;
    uint64_t v;
    std::memcpy(&v, b_.data() + pos_, 8);
    pos_ += 8;
    return v;
  }
  // Copies a * b * c bytes (the product checked for overflow).
  void Copy(uint64_t a, uint64_t b, uint64_t c, std::string_view what, std::vector<uint8_t>* out) {
    uint64_t n = 0;
    if (__builtin_mul_overflow(a, b, &n) || __builtin_mul_overflow(n, c, &n)) {
      Fail(what, "size overflows 64 bits");
      return;
    }
    if (!Need(n, what)) return;
    out->assign(b_.begin() + pos_, b_.begin() + pos_ + n);
    pos_ += n;
  }
  void Fail(std::string_view what, std::string_view detail) {
    if (!ok()) return;
    status_ = Status::Corruption(prefix_ + ": " + std::string(what) + " at offset " +
                                 std::to_string(pos_) + ": " + std::string(detail));
  }
  void Refuse(Status s) {
    if (ok()) status_ = std::move(s);
  }

 private:
  std::span<const uint8_t> b_;
  std::string prefix_;
  size_t pos_ = 0;
  Status status_;
};

uint32_t LoadHost32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

void RefuseType(BlobReader& r, const std::string& what, int32_t type) {
  r.Refuse(Status::Unsupported("llama.cpp state: " + what + " has type " + GgmlTypeName(type) +
                               "; tqkv reads f32, f16 and bf16 caches only (run llama.cpp with "
                               "--cache-type-k/--cache-type-v f16)"));
}

// One row type and size pair of a K (or non-transposed V) section; returns n_embd.
uint32_t ReadRowHeader(BlobReader& r, const std::string& what, int32_t* type) {
  *type = r.I32((what + " type").c_str());
  if (!r.ok()) return 0;
  const auto el = ElementBytes(*type);
  if (!el) {
    RefuseType(r, what, *type);
    return 0;
  }
  const uint64_t row = r.U64((what + " row size").c_str());
  if (r.ok() && (row == 0 || row % *el != 0 || row / *el > std::numeric_limits<uint32_t>::max())) {
    r.Fail(what + " row size", std::to_string(row) + " is not a positive multiple of " +
                                   std::to_string(*el) + " below 2^32 elements");
    return 0;
  }
  return static_cast<uint32_t>(row / *el);
}

void ReadStream(BlobReader& r, uint32_t cell_count, bool cell_ext, Stream* s) {
  // Each cell takes at least 8 bytes: the count cannot ask for more than is there.
  if (!r.Need(uint64_t{cell_count} * (8 + (cell_ext ? kExtBytes : 0)), "cells")) return;
  s->cells.resize(cell_count);
  for (Cell& c : s->cells) {
    c.pos = r.I32("cell position");
    const uint32_t n_seq = r.U32("cell sequence count");
    if (cell_ext && r.Need(kExtBytes, "cell extension")) {
      std::vector<uint8_t> ext;
      r.Copy(kExtBytes, 1, 1, "cell extension", &ext);
      std::memcpy(c.ext.data(), ext.data(), kExtBytes);
    }
    if (!r.Need(uint64_t{n_seq} * 4, "cell sequence ids")) return;
    c.seq_ids.resize(n_seq);
    for (int32_t& id : c.seq_ids) id = r.I32("cell sequence id");
    // state_write_meta lists a cell's sequences in ascending order, each >= 0. A reading with
    // the wrong extension setting lands ids out of order (cells of 8 sequences once parsed
    // both ways and were refused as ambiguous), so this one rule tells the readings apart.
    for (size_t i = 0; i < c.seq_ids.size() && r.ok(); ++i) {
      if (c.seq_ids[i] < 0 || (i > 0 && c.seq_ids[i] <= c.seq_ids[i - 1])) {
        r.Fail("cell sequence ids", "not ascending and non-negative");
      }
    }
  }
  const uint32_t v_trans = r.U32("v_trans");
  if (r.ok() && v_trans > 1) r.Fail("v_trans", "expected 0 or 1, got " + std::to_string(v_trans));
  s->v_trans = v_trans == 1;
  const uint32_t n_layer = r.U32("layer count");
  // Each layer's K and V headers take at least 24 bytes.
  if (!r.Need(uint64_t{n_layer} * 24, "layers") || n_layer == 0) {
    if (r.ok()) r.Fail("layer count", "0 layers");
    return;
  }
  s->layers.resize(n_layer);
  for (uint32_t l = 0; l < n_layer && r.ok(); ++l) {
    Layer& layer = s->layers[l];
    const std::string what = "layer " + std::to_string(l) + " K";
    layer.n_embd_k = ReadRowHeader(r, what, &layer.k_type);
    if (!r.ok()) break;
    r.Copy(cell_count, layer.n_embd_k, *ElementBytes(layer.k_type), what + " rows", &layer.k);
  }
  for (uint32_t l = 0; l < n_layer && r.ok(); ++l) {
    Layer& layer = s->layers[l];
    const std::string what = "layer " + std::to_string(l) + " V";
    if (!s->v_trans) {
      layer.n_embd_v = ReadRowHeader(r, what, &layer.v_type);
    } else {
      layer.v_type = r.I32(what + " type");
      if (!r.ok()) break;
      const auto el = ElementBytes(layer.v_type);
      if (!el) {
        RefuseType(r, what, layer.v_type);
        break;
      }
      const uint32_t size_el = r.U32(what + " element size");
      if (r.ok() && size_el != *el) {
        r.Fail(what + " element size", "expected " + std::to_string(*el) + " for " +
                                           GgmlTypeName(layer.v_type) + ", got " +
                                           std::to_string(size_el));
      }
      layer.n_embd_v = r.U32(what + " width");
      if (r.ok() && layer.n_embd_v == 0) r.Fail(what + " width", "0");
    }
    if (!r.ok()) break;
    r.Copy(cell_count, layer.n_embd_v, *ElementBytes(layer.v_type), what + " rows", &layer.v);
  }
}

Result<SeqState> ParseWith(std::span<const uint8_t> blob, bool cell_ext) {
  BlobReader r(blob, "llama.cpp state");
  SeqState state;
  state.cell_ext = cell_ext;
  // A stream count is never this large: the magic tells a get_data blob from a slot file's body.
  if (blob.size() >= 4 && LoadHost32(blob.data()) == kSeqDataMagic) {
    r.U32("magic");
    state.io_header = true;
    state.seq_id = r.I32("sequence id");
  }
  // One cache, or the iSWA pair: llama_kv_cache_iswa::state_write writes the full-attention
  // cache, then the sliding-window one.
  for (int c = 0; c < 2 && r.ok() && (c == 0 || r.remaining() > 0); ++c) {
    CacheState cache;
    const uint32_t n_stream = r.U32("stream count");
    if (!r.Need(uint64_t{n_stream} * 4, "streams")) break;
    if (n_stream == 0) r.Fail("stream count", "0 streams");
    cache.streams.resize(n_stream);
    for (uint32_t s = 0; s < n_stream && r.ok(); ++s) {
      const uint32_t cell_count = r.U32("cell count");
      if (r.ok() && cell_count > 0) ReadStream(r, cell_count, cell_ext, &cache.streams[s]);
    }
    state.caches.push_back(std::move(cache));
  }
  if (r.ok() && r.remaining() > 0) {
    r.Fail("end of state", std::to_string(r.remaining()) +
                               " bytes after the last cache (a layout this reader does not know)");
  }
  if (!r.ok()) return r.status();
  return state;
}

void PutU32(std::vector<uint8_t>& out, uint32_t v) {
  const size_t at = out.size();
  out.resize(at + 4);
  std::memcpy(out.data() + at, &v, 4);
}
void PutU64(std::vector<uint8_t>& out, uint64_t v) {
  const size_t at = out.size();
  out.resize(at + 8);
  std::memcpy(out.data() + at, &v, 8);
}
void PutBytes(std::vector<uint8_t>& out, std::span<const uint8_t> b) {
  out.insert(out.end(), b.begin(), b.end());
}

}  // namespace

std::string GgmlTypeName(int32_t type) {
  // ggml.h's enum ggml_type; ids 4 and 5 were removed upstream.
  static constexpr const char* kNames[] = {
      "f32",     "f16",    "q4_0",   "q4_1",  "type 4", "type 5", "q5_0",   "q5_1",
      "q8_0",    "q8_1",   "q2_K",   "q3_K",  "q4_K",   "q5_K",   "q6_K",   "q8_K",
      "iq2_xxs", "iq2_xs", "iq3_xxs", "iq1_s", "iq4_nl", "iq3_s",  "iq2_s",  "iq4_xs",
      "i8",      "i16",    "i32",    "i64",   "f64",    "iq1_m",  "bf16"};
  if (type >= 0 && static_cast<size_t>(type) < std::size(kNames)) return kNames[type];
  return "type " + std::to_string(type);
}

Result<SeqState> ParseSeqState(std::span<const uint8_t> blob) {
  Result<SeqState> plain = ParseWith(blob, false);
  if (!plain.ok() && plain.status().code() == StatusCode::kUnsupported) return plain;
  Result<SeqState> ext = ParseWith(blob, true);
  bool any_cell = false;
  if (plain.ok()) {
    for (const CacheState& c : plain->caches)
      for (const Stream& s : c.streams) any_cell = any_cell || !s.cells.empty();
  }
  if (plain.ok() && (!any_cell || !ext.ok())) return plain;
  if (plain.ok()) {
    return Status::Corruption(
        "llama.cpp state: parses both with and without cell extensions; refusing to guess");
  }
  if (ext.ok()) return ext;
  return plain.status();  // the usual layout's error is the one that explains most
}

std::vector<uint8_t> SerializeSeqState(const SeqState& state) {
  std::vector<uint8_t> out;
  if (state.io_header) {
    PutU32(out, kSeqDataMagic);
    PutU32(out, static_cast<uint32_t>(state.seq_id));
  }
  for (const CacheState& cache : state.caches) {
    PutU32(out, static_cast<uint32_t>(cache.streams.size()));
    for (const Stream& s : cache.streams) {
      PutU32(out, static_cast<uint32_t>(s.cells.size()));
      if (s.cells.empty()) continue;
      for (const Cell& c : s.cells) {
        PutU32(out, static_cast<uint32_t>(c.pos));
        PutU32(out, static_cast<uint32_t>(c.seq_ids.size()));
        if (state.cell_ext) PutBytes(out, c.ext);
        for (int32_t id : c.seq_ids) PutU32(out, static_cast<uint32_t>(id));
      }
      PutU32(out, s.v_trans ? 1 : 0);
      PutU32(out, static_cast<uint32_t>(s.layers.size()));
      for (const Layer& l : s.layers) {
        PutU32(out, static_cast<uint32_t>(l.k_type));
        PutU64(out, uint64_t{l.n_embd_k} * ElementBytes(l.k_type).value_or(0));
        PutBytes(out, l.k);
      }
      for (const Layer& l : s.layers) {
        PutU32(out, static_cast<uint32_t>(l.v_type));
        const uint32_t el = ElementBytes(l.v_type).value_or(0);
        if (s.v_trans) {
          PutU32(out, el);
          PutU32(out, l.n_embd_v);
        } else {
          PutU64(out, uint64_t{l.n_embd_v} * el);
        }
        PutBytes(out, l.v);
      }
    }
  }
  return out;
}

Result<SlotFile> ParseSlotFile(std::span<const uint8_t> file) {
  BlobReader r(file, "llama.cpp slot file");
  const uint32_t magic = r.U32("slot file magic");
  if (r.ok() && magic != kSlotMagic) {
    return Status::Corruption("llama.cpp slot file: magic at offset 0: expected 'ggsq' (0x67677371), got 0x" +
                              [&] {
                                char buf[9];
                                std::snprintf(buf, sizeof buf, "%08x", magic);
                                return std::string(buf);
                              }());
  }
  const uint32_t version = r.U32("slot file version");
  if (r.ok() && version != kSlotVersion) {
    return Status::Unsupported("llama.cpp slot file: version at offset 4: expected " +
                               std::to_string(kSlotVersion) + ", got " + std::to_string(version));
  }
  const uint32_t n_tokens = r.U32("slot file token count");
  SlotFile slot;
  if (r.Need(uint64_t{n_tokens} * 4, "slot file tokens")) {
    slot.tokens.resize(n_tokens);
    for (int32_t& t : slot.tokens) t = r.I32("token");
  }
  if (!r.ok()) return r.status();
  slot.state.assign(file.begin() + r.offset(), file.end());
  return slot;
}

Result<SlotOrBlob> ParseSlotFileOrBlob(std::vector<uint8_t> bytes) {
  SlotOrBlob out;
  out.is_slot = bytes.size() >= 4 && bytes[0] == (kSlotMagic & 0xFF) &&
                bytes[1] == ((kSlotMagic >> 8) & 0xFF) && bytes[2] == ((kSlotMagic >> 16) & 0xFF) &&
                bytes[3] == (kSlotMagic >> 24);
  if (out.is_slot) {
    TQKV_ASSIGN_OR_RETURN(out.slot, ParseSlotFile(bytes));
  } else {
    out.slot.state = std::move(bytes);
  }
  return out;
}

std::vector<uint8_t> SerializeSlotFile(const SlotFile& slot) {
  std::vector<uint8_t> out;
  PutU32(out, kSlotMagic);
  PutU32(out, kSlotVersion);
  PutU32(out, static_cast<uint32_t>(slot.tokens.size()));
  for (int32_t t : slot.tokens) PutU32(out, static_cast<uint32_t>(t));
  PutBytes(out, slot.state);
  return out;
}

}  // namespace tqkv::llama
