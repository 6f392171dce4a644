// llama.cpp sequence state <-> tqkv session and its engine state (docs/format.md §13).
#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <map>
#include <optional>

#include "tqkv/container.h"
#include "tqkv/llama_state.h"

namespace tqkv::llama {
namespace {

constexpr uint8_t kTag[4] = {'l', 'l', 's', 'q'};
// 1: a session row per cell; 2 (written now): runs of consecutive cells, rows derived (AssignRows).
constexpr uint32_t kEngineLayoutVersion = 2;

std::optional<DType> DTypeOf(int32_t type) {
  switch (type) {
    case kGgmlF32: return DType::kF32;
    case kGgmlF16: return DType::kF16;
    case kGgmlBF16: return DType::kBF16;
    default: return std::nullopt;
  }
}

// A mixed session holds every layer in f32 and gives each layer its own type back, so NaNs
// keep their payload and their signalling bit both ways (the shared converters quiet them).
bool IsNaNBits(float f) { return (std::bit_cast<uint32_t>(f) & 0x7FFFFFFFu) > 0x7F800000u; }
uint16_t NaNToHalf(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t mant = (x >> 13) & 0x3FFu;
  return static_cast<uint16_t>((x >> 16 & 0x8000u) | 0x7C00u | (mant != 0 ? mant : 1u));
}
uint16_t NaNToBF16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  return static_cast<uint16_t>((x >> 16) | ((x & 0x7F0000u) != 0 ? 0u : 1u));
}

float LoadElem(const uint8_t* p, DType t) {
  uint16_t h;
  switch (t) {
    case DType::kF32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case DType::kF16:
      std::memcpy(&h, p, 2);
      // A NaN as it is (HalfToFloat sets the quiet bit, as F16C does): StoreElem gives it back.
      if ((h & 0x7C00u) == 0x7C00u && (h & 0x3FFu) != 0) {
        return std::bit_cast<float>((uint32_t{h} & 0x8000u) << 16 | 0x7F800000u |
                                    (uint32_t{h} & 0x3FFu) << 13);
      }
      return HalfToFloat(h);
    case DType::kBF16: std::memcpy(&h, p, 2); return BF16ToFloat(h);
  }
  return 0;
}
void StoreElem(uint8_t* p, DType t, float f) {
  uint16_t h;
  switch (t) {
    case DType::kF32: std::memcpy(p, &f, 4); return;
    case DType::kF16: h = IsNaNBits(f) ? NaNToHalf(f) : FloatToHalf(f); std::memcpy(p, &h, 2); return;
    case DType::kBF16: h = IsNaNBits(f) ? NaNToBF16(f) : FloatToBF16(f); std::memcpy(p, &h, 2); return;
  }
}
// One element, copied unchanged when the types agree (so f16 -> f16 is byte-exact).
void ConvertElem(const uint8_t* src, DType from, uint8_t* dst, DType to) {
  if (from == to) {
    std::memcpy(dst, src, DTypeSize(to));
  } else {
    StoreElem(dst, to, LoadElem(src, from));
  }
}

// A stream with cells and where its layers and cells go in the session.
struct Placed {
  const Stream* stream = nullptr;
  uint32_t first_layer = 0;
  std::vector<uint32_t> rows;  // session row of each cell
};

// Little-endian writer and bounds-checked reader of the engine state.
class Out {
 public:
  void U8(uint8_t v) { b.push_back(v); }
  void U32(uint32_t v) {
    for (int i = 0; i < 4; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  std::vector<uint8_t> b;
};
class In {
 public:
  explicit In(std::span<const uint8_t> b) : b_(b) {}
  bool ok() const { return status_.ok(); }
  Status status() const { return status_; }
  size_t remaining() const { return b_.size() - pos_; }
  bool Need(uint64_t n, std::string_view what) {
    if (ok() && n > remaining()) {
      Fail(what, "needs " + std::to_string(n) + " bytes, " + std::to_string(remaining()) + " left");
    }
    return ok();
  }
  uint8_t U8(std::string_view what) { return Need(1, what) ? b_[pos_++] : 0; }
  uint32_t U32(std::string_view what) {
    if (!Need(4, what)) return 0;
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(b_[pos_ + i]) << (8 * i);
    pos_ += 4;
    return v;
  }
  void Fail(std::string_view what, std::string_view detail) {
    if (ok()) {
      status_ = Status::Corruption("llama.cpp engine state: " + std::string(what) +
                                   " at offset " + std::to_string(pos_) + ": " +
                                   std::string(detail));
    }
  }

 private:
  std::span<const uint8_t> b_;
  size_t pos_ = 0;
  Status status_;
};

// A run of more than one cell has at most this many sequence ids (each cell holds a copy, so a
// reader's memory stays within a small multiple of the session's tokens).
constexpr uint32_t kMaxRunSeqs = 8;

// Cells i and i + 1 share a run: the next position, the same sequences and extension.
bool ExtendsRun(const Cell& prev, const Cell& next) {
  return prev.pos != std::numeric_limits<int32_t>::max() && next.pos == prev.pos + 1 &&
         next.seq_ids.size() <= kMaxRunSeqs && next.seq_ids == prev.seq_ids &&
         next.ext == prev.ext;
}

std::vector<uint8_t> EncodeEngineState(const SeqState& state, const std::vector<Placed>& placed,
                                       const std::vector<int32_t>* tokens) {
  Out o;
  for (uint8_t c : kTag) o.U8(c);
  o.U32(kEngineLayoutVersion);
  o.U8(state.cell_ext ? 1 : 0);
  o.U8(tokens ? 1 : 0);
  o.U8(state.io_header ? 1 : 0);
  o.U8(0);
  o.U32(static_cast<uint32_t>(state.io_header ? state.seq_id : 0));
  o.U32(tokens ? static_cast<uint32_t>(tokens->size()) : 0);
  if (tokens) {
    for (int32_t t : *tokens) o.U32(static_cast<uint32_t>(t));
  }
  o.U32(static_cast<uint32_t>(state.caches.size()));
  size_t next = 0;
  for (const CacheState& cache : state.caches) {
    o.U32(static_cast<uint32_t>(cache.streams.size()));
    for (const Stream& s : cache.streams) {
      o.U32(static_cast<uint32_t>(s.cells.size()));
      if (s.cells.empty()) continue;
      const Placed& p = placed[next++];
      o.U8(s.v_trans ? 1 : 0);
      o.U8(0);
      o.U8(0);
      o.U8(0);
      o.U32(static_cast<uint32_t>(s.layers.size()));
      for (size_t l = 0; l < s.layers.size(); ++l) {
        o.U32(p.first_layer + static_cast<uint32_t>(l));
        o.U32(static_cast<uint32_t>(s.layers[l].k_type));
        o.U32(static_cast<uint32_t>(s.layers[l].v_type));
      }
      std::vector<std::pair<size_t, uint32_t>> runs;  // first cell, length
      for (size_t i = 0; i < s.cells.size(); ++i) {
        if (!runs.empty() && ExtendsRun(s.cells[i - 1], s.cells[i])) {
          ++runs.back().second;
        } else {
          runs.emplace_back(i, 1);
        }
      }
      o.U32(static_cast<uint32_t>(runs.size()));
      for (const auto& [first, length] : runs) {
        const Cell& c = s.cells[first];
        o.U32(static_cast<uint32_t>(c.pos));
        o.U32(length);
        o.U32(static_cast<uint32_t>(c.seq_ids.size()));
        if (state.cell_ext) {
          for (uint8_t x : c.ext) o.U8(x);
        }
        for (int32_t id : c.seq_ids) o.U32(static_cast<uint32_t>(id));
      }
    }
  }
  return std::move(o.b);
}

// Rows of a stream with fewer cells than the session's tokens (its layers hold only those,
// format version 7): the cells by position, ties in blob order, so the layer's last rows are its
// most recent tokens (the exact tail) whatever order a ring buffer left them in.
std::vector<uint32_t> RankRows(const Stream& s) {
  std::vector<uint32_t> order(s.cells.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<uint32_t>(i);
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    return s.cells[a].pos < s.cells[b].pos;
  });
  std::vector<uint32_t> rows(order.size());
  for (size_t r = 0; r < order.size(); ++r) rows[order[r]] = static_cast<uint32_t>(r);
  return rows;
}

// Rows of `s` aligned by position to the reference stream's rows where every position is found
// once, else the cells' own order.
std::vector<uint32_t> PlaceRows(const Stream& s, const std::map<int32_t, uint32_t>* ref_rows) {
  std::vector<uint32_t> rows(s.cells.size());
  bool aligned = ref_rows != nullptr;
  std::vector<uint32_t> seen;
  for (size_t i = 0; i < s.cells.size() && aligned; ++i) {
    auto it = ref_rows->find(s.cells[i].pos);
    if (it == ref_rows->end()) {
      aligned = false;
    } else {
      rows[i] = it->second;
    }
  }
  if (aligned) {
    std::vector<uint32_t> sorted = rows;
    std::sort(sorted.begin(), sorted.end());
    aligned = std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end();
  }
  if (!aligned) {
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<uint32_t>(i);
  }
  return rows;
}

// The session row of every cell of every stream with cells (blob order): the one rule that import
// places rows by and that layout 2 derives them by. Tokens: the most cells a stream holds. Rows:
// the first such stream's cells in order, the other full streams aligned to it by position; a
// stream with fewer cells (a sliding-window cache) holds only those, its layers ragged (RankRows).
std::vector<std::vector<uint32_t>> AssignRows(const std::vector<const Stream*>& streams) {
  size_t tokens_n = 0;
  for (const Stream* s : streams) tokens_n = std::max(tokens_n, s->cells.size());
  const Stream* ref = nullptr;
  for (const Stream* s : streams) {
    if (s->cells.size() == tokens_n) {
      ref = s;
      break;
    }
  }
  std::map<int32_t, uint32_t> ref_rows;
  for (size_t i = 0; ref != nullptr && i < ref->cells.size(); ++i) {
    ref_rows.emplace(ref->cells[i].pos, static_cast<uint32_t>(i));
  }
  const bool ref_unique = ref != nullptr && ref_rows.size() == ref->cells.size();
  std::vector<std::vector<uint32_t>> rows;
  rows.reserve(streams.size());
  for (const Stream* s : streams) {
    if (s->cells.size() < tokens_n) {
      rows.push_back(RankRows(*s));
    } else {
      rows.push_back(PlaceRows(*s, s == ref || !ref_unique ? nullptr : &ref_rows));
    }
  }
  return rows;
}

}  // namespace

Result<Session> ToSession(const SeqState& state, uint32_t head_dim, std::string model,
                          const std::vector<int32_t>* tokens) {
  std::vector<Placed> placed;
  std::optional<int32_t> common_type;
  bool mixed = false;
  uint32_t n_embd = 0, layers = 0;
  for (const CacheState& cache : state.caches) {
    for (const Stream& s : cache.streams) {
      if (s.cells.empty()) continue;
      Placed p;
      p.stream = &s;
      p.first_layer = layers;
      layers += static_cast<uint32_t>(s.layers.size());
      for (const Layer& l : s.layers) {
        if (n_embd == 0) n_embd = l.n_embd_k;
        if (l.n_embd_k != n_embd || l.n_embd_v != n_embd) {
          return Status::Unsupported(
              "llama.cpp state: layers of different K/V widths (" + std::to_string(l.n_embd_k) +
              ", " + std::to_string(l.n_embd_v) + " vs " + std::to_string(n_embd) +
              "); a tqkv session has one geometry");
        }
        for (int32_t t : {l.k_type, l.v_type}) {
          if (!DTypeOf(t)) return Status::Unsupported("llama.cpp state: type " + GgmlTypeName(t));
          if (!common_type) common_type = t;
          mixed = mixed || *common_type != t;
        }
      }
      placed.push_back(std::move(p));
    }
  }
  if (placed.empty()) {
    return Status::InvalidArgument("llama.cpp state: the sequence has no cells; nothing to store");
  }
  if (head_dim == 0 || n_embd % head_dim != 0) {
    return Status::InvalidArgument("llama.cpp state: head_dim " + std::to_string(head_dim) +
                                   " does not divide the row width " + std::to_string(n_embd));
  }
  uint64_t tokens_n = 0;
  std::vector<const Stream*> streams;
  for (const Placed& p : placed) {
    tokens_n = std::max<uint64_t>(tokens_n, p.stream->cells.size());
    streams.push_back(p.stream);
  }
  std::vector<std::vector<uint32_t>> rows = AssignRows(streams);
  std::vector<uint64_t> layer_tokens;
  layer_tokens.reserve(layers);
  for (size_t i = 0; i < placed.size(); ++i) {
    placed[i].rows = std::move(rows[i]);
    layer_tokens.insert(layer_tokens.end(), placed[i].stream->layers.size(),
                        placed[i].stream->cells.size());
  }

  const DType dtype = mixed ? DType::kF32 : *DTypeOf(*common_type);
  const ModelGeometry g{layers, n_embd / head_dim, head_dim};
  TQKV_ASSIGN_OR_RETURN(
      std::unique_ptr<KvCacheBuffer> buf,
      KvCacheBuffer::Allocate(std::move(model), g, dtype, tokens_n, std::move(layer_tokens)));
  KvCache& kv = buf->cache();
  const size_t el = DTypeSize(dtype);
  for (const Placed& p : placed) {
    const Stream& s = *p.stream;
    const size_t cells = s.cells.size();
    for (size_t l = 0; l < s.layers.size(); ++l) {
      const Layer& layer = s.layers[l];
      auto* k = static_cast<uint8_t*>(kv.k(p.first_layer + static_cast<uint32_t>(l)));
      auto* v = static_cast<uint8_t*>(kv.v(p.first_layer + static_cast<uint32_t>(l)));
      std::memset(k, 0, kv.tensor_bytes(p.first_layer + static_cast<uint32_t>(l)));
      std::memset(v, 0, kv.tensor_bytes(p.first_layer + static_cast<uint32_t>(l)));
      const DType kt = *DTypeOf(layer.k_type), vt = *DTypeOf(layer.v_type);
      const size_t kel = DTypeSize(kt), vel = DTypeSize(vt);
      for (size_t i = 0; i < cells; ++i) {
        uint8_t* krow = k + size_t{p.rows[i]} * n_embd * el;
        uint8_t* vrow = v + size_t{p.rows[i]} * n_embd * el;
        for (size_t j = 0; j < n_embd; ++j) {
          ConvertElem(&layer.k[(i * n_embd + j) * kel], kt, krow + j * el, dtype);
          const size_t vi = s.v_trans ? j * cells + i : i * n_embd + j;
          ConvertElem(&layer.v[vi * vel], vt, vrow + j * el, dtype);
        }
      }
    }
  }
  Session out;
  out.engine_state = EncodeEngineState(state, placed, tokens);
  out.kv = std::move(buf);
  return out;
}

namespace {

// Parses the engine state into a SeqState skeleton (no K/V data) with the session layer and
// rows of every stream; every index is checked against the session.
struct Target {
  Stream* stream = nullptr;
  std::vector<uint32_t> rows;    // session row of each cell
  std::vector<uint32_t> layers;  // session layer of each of the stream's layers
  uint64_t room = 0;             // the fewest tokens those layers hold: rows stay below
};

// Layout 1: per cell its position, session row, sequences and extension.
void ReadCellsV1(In& r, bool cell_ext, Stream& s, Target& t) {
  const uint64_t cells = s.cells.size();
  if (!r.Need(cells * (12 + (cell_ext ? 12 : 0)), "cells")) return;
  t.rows.resize(cells);
  for (uint64_t i = 0; i < cells && r.ok(); ++i) {
    Cell& cell = s.cells[i];
    cell.pos = static_cast<int32_t>(r.U32("cell position"));
    t.rows[i] = r.U32("cell row");
    const uint32_t n_seq = r.U32("cell sequence count");
    if (cell_ext && r.Need(12, "cell extension")) {
      for (uint8_t& x : cell.ext) x = r.U8("cell extension");
    }
    if (!r.Need(uint64_t{n_seq} * 4, "cell sequence ids")) return;
    cell.seq_ids.resize(n_seq);
    for (int32_t& id : cell.seq_ids) id = static_cast<int32_t>(r.U32("sequence id"));
  }
}

// Layout 2: runs of cells at consecutive positions with the same sequences and extension.
void ReadCellRuns(In& r, bool cell_ext, Stream& s) {
  const uint64_t cells = s.cells.size();
  const uint32_t n_run = r.U32("run count");
  if (r.ok() && (n_run == 0 || n_run > cells)) r.Fail("run count", "0 or more than the cells");
  if (!r.Need(uint64_t{n_run} * (12 + (cell_ext ? 12 : 0)), "runs")) return;
  uint64_t next = 0;
  for (uint32_t k = 0; k < n_run && r.ok(); ++k) {
    Cell first;
    first.pos = static_cast<int32_t>(r.U32("run position"));
    const uint32_t length = r.U32("run length");
    const uint32_t n_seq = r.U32("run sequence count");
    if (cell_ext && r.Need(12, "run extension")) {
      for (uint8_t& x : first.ext) x = r.U8("run extension");
    }
    if (!r.ok()) return;
    if (length == 0 || length > cells - next ||
        int64_t{first.pos} + length - 1 > std::numeric_limits<int32_t>::max() ||
        (length > 1 && n_seq > kMaxRunSeqs)) {
      r.Fail("run length", std::to_string(length) + " (0, past the cells or the positions, or " +
                               std::to_string(n_seq) + " sequence ids)");
      return;
    }
    if (!r.Need(uint64_t{n_seq} * 4, "run sequence ids")) return;
    first.seq_ids.resize(n_seq);
    for (int32_t& id : first.seq_ids) id = static_cast<int32_t>(r.U32("sequence id"));
    for (uint32_t j = 0; j < length; ++j, ++next) {
      s.cells[next] = first;
      s.cells[next].pos = first.pos + static_cast<int32_t>(j);
    }
  }
  if (r.ok() && next != cells) r.Fail("runs", "cover " + std::to_string(next) + " of the cells");
}

Status DecodeEngineState(std::span<const uint8_t> bytes, const KvCache& kv, SeqState* state,
                         std::vector<Target>* targets, Rebuilt* out) {
  In r(bytes);
  for (uint8_t c : kTag) {
    if (r.U8("tag") != c && r.ok()) {
      return Status::InvalidArgument(
          "not a llama.cpp session: the engine state does not start with 'llsq'");
    }
  }
  const uint32_t version = r.U32("layout version");
  if (r.ok() && (version < 1 || version > kEngineLayoutVersion)) {
    return Status::Unsupported("llama.cpp engine state: layout version " + std::to_string(version) +
                               " (this build reads 1 and 2)");
  }
  const uint8_t cell_ext = r.U8("cell_ext");
  const uint8_t has_tokens = r.U8("has_tokens");
  const uint8_t io_header = r.U8("io_header"), res = r.U8("reserved");
  if (r.ok() && (cell_ext > 1 || has_tokens > 1 || io_header > 1 || res)) r.Fail("flags", "bad value");
  state->cell_ext = cell_ext == 1;
  state->io_header = io_header == 1;
  state->seq_id = static_cast<int32_t>(r.U32("sequence id"));
  if (r.ok() && !state->io_header && state->seq_id != 0) r.Fail("sequence id", "without io_header");
  out->has_tokens = has_tokens == 1;
  const uint32_t n_tokens = r.U32("token count");
  if (r.ok() && !out->has_tokens && n_tokens != 0) r.Fail("token count", "tokens without a slot");
  if (!r.Need(uint64_t{n_tokens} * 4, "tokens")) return r.status();
  out->tokens.resize(n_tokens);
  for (int32_t& t : out->tokens) t = static_cast<int32_t>(r.U32("token"));
  const uint32_t n_cache = r.U32("cache count");
  if (r.ok() && (n_cache < 1 || n_cache > 2)) r.Fail("cache count", "expected 1 or 2");
  const ModelGeometry& g = kv.geometry();
  std::vector<bool> layer_used(g.layers, false);
  state->caches.resize(r.ok() ? n_cache : 0);
  for (CacheState& cache : state->caches) {
    const uint32_t n_stream = r.U32("stream count");
    if (r.ok() && n_stream == 0) r.Fail("stream count", "0");
    if (!r.Need(uint64_t{n_stream} * 4, "streams")) return r.status();
    cache.streams.resize(n_stream);
    for (Stream& s : cache.streams) {
      const uint32_t cells = r.U32("cell count");
      if (!r.ok() || cells == 0) continue;
      const uint8_t v_trans = r.U8("v_trans");
      const uint8_t a = r.U8("reserved"), b = r.U8("reserved"), c = r.U8("reserved");
      if (r.ok() && (v_trans > 1 || a || b || c)) r.Fail("v_trans", "bad value");
      s.v_trans = v_trans == 1;
      const uint32_t n_layer = r.U32("layer count");
      if (r.ok() && n_layer == 0) r.Fail("layer count", "0");
      if (!r.Need(uint64_t{n_layer} * 12, "layers")) return r.status();
      s.layers.resize(n_layer);
      std::vector<uint32_t> session_layers(n_layer);
      for (uint32_t l = 0; l < n_layer; ++l) {
        session_layers[l] = r.U32("session layer");
        s.layers[l].k_type = static_cast<int32_t>(r.U32("K type"));
        s.layers[l].v_type = static_cast<int32_t>(r.U32("V type"));
        if (!r.ok()) return r.status();
        if (session_layers[l] >= g.layers || layer_used[session_layers[l]]) {
          r.Fail("session layer", std::to_string(session_layers[l]) + " out of range or reused");
          return r.status();
        }
        layer_used[session_layers[l]] = true;
        if (!DTypeOf(s.layers[l].k_type) || !DTypeOf(s.layers[l].v_type)) {
          r.Fail("layer type", "not f32, f16 or bf16");
          return r.status();
        }
        s.layers[l].n_embd_k = s.layers[l].n_embd_v = static_cast<uint32_t>(g.token_elems());
      }
      // Rows index every layer of the stream: below the fewest tokens those layers hold, so a
      // stream has at most that many cells (which also bounds what a run count allocates).
      Target t;
      t.stream = &s;
      t.room = kv.tokens();
      for (uint32_t l : session_layers) t.room = std::min(t.room, kv.layer_tokens(l));
      if (cells > t.room) {
        r.Fail("cell count", std::to_string(cells) + " cells, more than the " +
                                 std::to_string(t.room) + " tokens its layers hold");
        return r.status();
      }
      s.cells.resize(cells);
      if (version == 1) {
        ReadCellsV1(r, state->cell_ext, s, t);
      } else {
        ReadCellRuns(r, state->cell_ext, s);
      }
      if (!r.ok()) return r.status();
      t.layers = std::move(session_layers);
      targets->push_back(std::move(t));
    }
  }
  if (!r.ok()) return r.status();
  if (r.remaining() != 0) r.Fail("end", std::to_string(r.remaining()) + " trailing bytes");
  if (r.ok() && std::find(layer_used.begin(), layer_used.end(), false) != layer_used.end()) {
    r.Fail("layers", "a session layer belongs to no stream");
  }
  if (!r.ok()) return r.status();
  if (version >= 2) {
    std::vector<const Stream*> streams;
    for (const Target& t : *targets) streams.push_back(t.stream);
    std::vector<std::vector<uint32_t>> rows = AssignRows(streams);
    for (size_t i = 0; i < targets->size(); ++i) (*targets)[i].rows = std::move(rows[i]);
  }
  for (const Target& t : *targets) {
    std::vector<uint32_t> sorted = t.rows;
    std::sort(sorted.begin(), sorted.end());
    if (!sorted.empty() && sorted.back() >= t.room) {
      r.Fail("cell row", std::to_string(sorted.back()) + " beyond the " + std::to_string(t.room) +
                             " tokens its layers hold");
    } else if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
      r.Fail("cell rows", "two cells of a stream share a row");
    }
  }
  return r.status();
}

}  // namespace

Result<Rebuilt> FromSession(const KvCache& kv, std::span<const uint8_t> engine_state) {
  TQKV_RETURN_IF_ERROR(kv.Validate());
  SeqState state;
  std::vector<Target> targets;
  Rebuilt out;
  TQKV_RETURN_IF_ERROR(DecodeEngineState(engine_state, kv, &state, &targets, &out));
  const DType dtype = kv.dtype();
  const size_t el = DTypeSize(dtype), n_embd = kv.geometry().token_elems();
  for (const Target& t : targets) {
    Stream& s = *t.stream;
    const size_t cells = s.cells.size();
    for (size_t l = 0; l < s.layers.size(); ++l) {
      Layer& layer = s.layers[l];
      const auto* k = static_cast<const uint8_t*>(kv.k(t.layers[l]));
      const auto* v = static_cast<const uint8_t*>(kv.v(t.layers[l]));
      const DType kt = *DTypeOf(layer.k_type), vt = *DTypeOf(layer.v_type);
      const size_t kel = DTypeSize(kt), vel = DTypeSize(vt);
      layer.k.resize(cells * n_embd * kel);
      layer.v.resize(cells * n_embd * vel);
      for (size_t i = 0; i < cells; ++i) {
        const uint8_t* krow = k + size_t{t.rows[i]} * n_embd * el;
        const uint8_t* vrow = v + size_t{t.rows[i]} * n_embd * el;
        for (size_t j = 0; j < n_embd; ++j) {
          ConvertElem(krow + j * el, dtype, &layer.k[(i * n_embd + j) * kel], kt);
          const size_t vi = s.v_trans ? j * cells + i : i * n_embd + j;
          ConvertElem(vrow + j * el, dtype, &layer.v[vi * vel], vt);
        }
      }
    }
  }
  out.blob = SerializeSeqState(state);
  return out;
}

Result<CheckpointStats> CheckpointSeqState(std::span<const uint8_t> blob, uint32_t head_dim,
                                           std::string model, const std::vector<int32_t>* tokens,
                                           CheckpointOptions options, Store& store,
                                           std::string_view key) {
  TQKV_ASSIGN_OR_RETURN(SeqState state, ParseSeqState(blob));
  TQKV_ASSIGN_OR_RETURN(Session session, ToSession(state, head_dim, std::move(model), tokens));
  options.engine_state = std::move(session.engine_state);
  return Checkpoint(session.kv->cache(), options, store, key);
}

Result<Rebuilt> RestoreSeqState(Store& store, std::string_view key, RestoreOptions options) {
  // One open: the session is allocated at its source dtype once the header is read.
  std::unique_ptr<KvCacheBuffer> kv;
  RestoreStats stats;
  TQKV_RETURN_IF_ERROR(RestoreInto(
      store, key,
      [&](const ContainerHeader& h) -> Result<KvCache*> {
        if (h.engine_state.empty()) {
          return Status::InvalidArgument(std::string(key) + ": not a llama.cpp session (its "
                                         "header has no engine state)");
        }
        TQKV_ASSIGN_OR_RETURN(kv, KvCacheBuffer::Allocate(h.model, h.geometry, h.source_dtype,
                                                          h.tokens, h.layer_tokens));
        return &kv->cache();
      },
      options, &stats));
  return FromSession(kv->cache(), stats.engine_state);
}

}  // namespace tqkv::llama
