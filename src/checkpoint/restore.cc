// Host restore: store -> container reader (verified chunks) -> CPU decode (pool) -> host tensors,
// over the chunk loop (chunk_loop.h), whose reads run ahead of decoding on a reader thread so wall
// time approaches max(read, decode).
#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "checkpoint/chunk_loop.h"
#include "checkpoint/destination.h"
#include "checkpoint/key_means.h"
#include "checkpoint/session_codecs.h"
#include "checkpoint/restore_memory.h"
#include "tqkv/aligned_buffer.h"
#include "tqkv/checkpoint.h"
#include "tqkv/container.h"
#include "tqkv/kv_layout.h"
#include "tqkv/thread_pool.h"

namespace tqkv {
namespace {

// Where decoded layers go: host tensors of a layer in some layout (a KvCache, caller tensors in
// an engine's layout, or one reused canonical layer for streaming).
class HostTensors {
 public:
  explicit HostTensors(KvLayout layout, std::optional<KvLayout> v_layout = std::nullopt)
      : layout_(std::move(layout)), v_layout_(std::move(v_layout)) {}
  virtual ~HostTensors() = default;
  // Base of layer `layer`'s tensor kv (0 = K, 1 = V), laid out as layout(kv).
  virtual void* Tensor(uint32_t layer, int kv) = 0;
  virtual Status LayerDone(uint32_t layer) = 0;
  const KvLayout& layout(int kv) const { return kv == 1 && v_layout_ ? *v_layout_ : layout_; }

 private:
  KvLayout layout_;
  std::optional<KvLayout> v_layout_;
};

class CacheTensors final : public HostTensors {
 public:
  CacheTensors(KvCache& cache, const RestoreOptions& options)
      : HostTensors(KvLayout::Canonical(cache.geometry())), cache_(cache),
        layer_ready_(options.layer_ready) {}
  void* Tensor(uint32_t layer, int kv) override { return cache_.tensor(layer, kv); }
  Status LayerDone(uint32_t layer) override {
    return layer_ready_ ? layer_ready_(layer) : Status::Ok();
  }

 private:
  KvCache& cache_;
  const std::function<Status(uint32_t)>& layer_ready_;
};

// Caller tensors in a layout the codecs can write into directly (DecodesInPlace).
class LaidOutTensors final : public HostTensors {
 public:
  LaidOutTensors(const LayoutTensors& dst, const RestoreOptions& options)
      : HostTensors(dst.layout, dst.v_layout), dst_(dst), layer_ready_(options.layer_ready) {}
  void* Tensor(uint32_t layer, int kv) override { return kv == 0 ? dst_.k[layer] : dst_.v[layer]; }
  Status LayerDone(uint32_t layer) override {
    return layer_ready_ ? layer_ready_(layer) : Status::Ok();
  }

 private:
  const LayoutTensors& dst_;
  const std::function<Status(uint32_t)>& layer_ready_;
};

class CallbackTensors final : public HostTensors {
 public:
  // K and V of one layer from restore_memory.h's pool (given back after the restore).
  static Result<std::unique_ptr<HostTensors>> Make(const ModelGeometry& g, size_t tensor_bytes,
                                                   const LayerCallback& cb) {
    TQKV_ASSIGN_OR_RETURN(AlignedBuffer k, TakeRestoreMemory(tensor_bytes));
    TQKV_ASSIGN_OR_RETURN(AlignedBuffer v, TakeRestoreMemory(tensor_bytes));
    return std::unique_ptr<HostTensors>(new CallbackTensors(g, std::move(k), std::move(v), cb));
  }
  ~CallbackTensors() override {
    ReturnRestoreMemory(std::move(k_));
    ReturnRestoreMemory(std::move(v_));
  }
  void* Tensor(uint32_t, int kv) override { return kv == 0 ? k_.data() : v_.data(); }
  Status LayerDone(uint32_t layer) override { return cb_(layer, k_.data(), v_.data()); }

 private:
  CallbackTensors(const ModelGeometry& g, AlignedBuffer k, AlignedBuffer v, const LayerCallback& cb)
      : HostTensors(KvLayout::Canonical(g)), cb_(cb), k_(std::move(k)), v_(std::move(v)) {}

  const LayerCallback& cb_;
  AlignedBuffer k_, v_;
};

// Caller tensors where K or V (or both) cannot be decoded into directly (strided channels,
// tiles: vLLM's CPU keys): that tensor's layer is decoded into a canonical buffer and scattered
// into place once the layer is done; the other is decoded in place.
class StagedTensors final : public HostTensors {
 public:
  static Result<std::unique_ptr<HostTensors>> Make(const LayoutTensors& dst,
                                                   const RestoreOptions& options) {
    bool staged[2];
    for (int kv = 0; kv < 2; ++kv) {
      staged[kv] = !DecodesInPlace(dst.layout_of(kv), dst.geometry, dst.tokens);
    }
    const size_t bytes = dst.tokens * dst.geometry.token_elems() * DTypeSize(dst.dtype);
    std::unique_ptr<StagedTensors> t(new StagedTensors(dst, options, staged));
    for (int kv = 0; kv < 2; ++kv) {
      if (staged[kv]) {
        TQKV_ASSIGN_OR_RETURN(t->buf_[kv], TakeRestoreMemory(bytes));
      }
    }
    return std::unique_ptr<HostTensors>(std::move(t));
  }
  ~StagedTensors() override {
    for (AlignedBuffer& b : buf_) {
      if (b.data() != nullptr) ReturnRestoreMemory(std::move(b));
    }
  }
  void* Tensor(uint32_t layer, int kv) override {
    if (staged_[kv]) return buf_[kv].data();
    return kv == 0 ? dst_.k[layer] : dst_.v[layer];
  }
  Status LayerDone(uint32_t layer) override {
    for (int kv = 0; kv < 2; ++kv) {
      if (!staged_[kv]) continue;
      ScatterLayer(buf_[kv].data(), dst_.layout_of(kv), dst_.geometry, dst_.tokens, dst_.dtype,
                   kv == 0 ? dst_.k[layer] : dst_.v[layer]);
    }
    return layer_ready_ ? layer_ready_(layer) : Status::Ok();
  }

 private:
  StagedTensors(const LayoutTensors& dst, const RestoreOptions& options, const bool staged[2])
      : HostTensors(staged[0] ? KvLayout::Canonical(dst.geometry) : dst.layout,
                    staged[1] ? KvLayout::Canonical(dst.geometry) : dst.layout_of(1)),
        dst_(dst), layer_ready_(options.layer_ready), staged_{staged[0], staged[1]} {}

  const LayoutTensors& dst_;
  const std::function<Status(uint32_t)>& layer_ready_;
  bool staged_[2];
  AlignedBuffer buf_[2];
};

// One head's tokens [token, token + n) whose vectors lie token_stride apart in the destination.
struct Run {
  uint32_t head;
  uint64_t token;
  size_t n;
};

// The runs of [begin, begin + count) for every head: one per head, or one per block when paged.
void SplitRuns(const KvLayout& l, size_t heads, uint64_t begin, uint64_t count,
               std::vector<Run>& runs) {
  runs.clear();
  for (size_t hd = 0; hd < heads; ++hd) {
    for (uint64_t t = begin; t < begin + count;) {
      const uint64_t n = l.RunTokens(t, begin + count - t);
      runs.push_back(Run{static_cast<uint32_t>(hd), t, static_cast<size_t>(n)});
      t += n;
    }
  }
}

// The host sink: decodes each verified chunk with the CPU codec into HostTensors, one codec call
// per run (SplitRuns) with the run's stride.
class HostDecodeSink final : public ChunkSink {
 public:
  HostDecodeSink(const ContainerReader& reader, SessionCodecs codecs,
                 std::unique_ptr<Codec> exact_codec, HostTensors& tensors,
                 const RestoreOptions& options, std::string name)
      : reader_(reader), h_(reader.header()), codecs_(std::move(codecs)),
        exact_codec_(std::move(exact_codec)), tensors_(tensors), options_(options),
        name_(std::move(name)) {
    // A layout with runs of one token may have any token stride; the codecs want >= head_dim.
    for (int kv = 0; kv < 2; ++kv) {
      stride_[kv] = static_cast<size_t>(
          std::max<int64_t>(tensors.layout(kv).token_stride, h_.geometry.head_dim));
    }
  }

  Status Consume(size_t slot, size_t index, std::span<const uint8_t> payload) override;
  Status LayerDone(uint32_t layer) override {
    metas_.clear();
    means_ = KeyMeans{};
    return tensors_.LayerDone(layer);
  }

 private:
  Status DecodeExactRows(const ChunkEntry& e, const uint8_t* src);
  uint8_t* Destination(uint32_t layer, int kv, const Run& r) const {
    return static_cast<uint8_t*>(tensors_.Tensor(layer, kv)) +
           tensors_.layout(kv).Offset(r.token, r.head) * DTypeSize(options_.dtype);
  }

  const ContainerReader& reader_;
  const ContainerHeader& h_;
  SessionCodecs codecs_;
  std::unique_ptr<Codec> exact_codec_;
  HostTensors& tensors_;
  const RestoreOptions& options_;
  std::string name_;
  size_t stride_[2] = {0, 0};   // elements between a run's vectors, K's and V's
  std::vector<uint8_t> metas_;  // the current layer's group metadata
  KeyMeans means_;              // the current layer's key means and coefficients
  std::vector<Run> runs_;
};

// Overwrites the decoded rows: the container puts this chunk after the layer's codes.
Status HostDecodeSink::DecodeExactRows(const ChunkEntry& e, const uint8_t* src) {
  const size_t heads = h_.geometry.kv_heads;
  const size_t vec = exact_codec_->code_bytes();
  for (int kv = 0; kv < 2; ++kv) {
    for (const TokenRange& range : ExactRanges(h_, e.layer)) {
      SplitRuns(tensors_.layout(kv), heads, range.begin, range.count, runs_);
      for (const Run& r : runs_) {
        const uint8_t* codes = src + (r.head * range.count + (r.token - range.begin)) * vec;
        TQKV_RETURN_IF_ERROR(exact_codec_->Decode({codes, r.n * vec}, r.n, {},
                                                  Destination(e.layer, kv, r), options_.dtype,
                                                  stride_[kv], nullptr));
      }
      src += heads * range.count * vec;
    }
  }
  return Status::Ok();
}

Status HostDecodeSink::Consume(size_t, size_t index, std::span<const uint8_t> payload) {
  const ChunkEntry& e = reader_.chunks()[index];
  if (e.type == ChunkType::kGroupMeta) {
    metas_.assign(payload.begin(), payload.end());
    return CheckGroupMetaChunk(codecs_, h_, e, metas_, name_);
  }
  if (e.type == ChunkType::kExactRows) return DecodeExactRows(e, payload.data());
  if (e.type == ChunkType::kKeyMeans) {
    means_ = KeyMeansAsF32(h_, e.layer, payload);
    return Status::Ok();
  }
  const Codec& codec = codecs_.of(e.layer, e.kv);
  const size_t heads = h_.geometry.kv_heads;
  const size_t meta_bytes = codec.group_meta_bytes();
  // [K heads][K meta] then [V heads][V meta] (docs/format.md §5).
  const size_t k_meta_bytes = codecs_.of(e.layer, 0).group_meta_bytes();
  const size_t meta_base = e.kv == 0 ? 0 : heads * k_meta_bytes;
  if (meta_bytes > 0 &&
      metas_.size() != heads * (k_meta_bytes + codecs_.of(e.layer, 1).group_meta_bytes())) {
    return Status::Corruption(name_ + ": layer " + std::to_string(e.layer) +
                              " codes without group metadata");
  }
  const size_t code_bytes = codec.code_bytes();
  const bool centered = e.kv == 0 && LayerHasKeyMeans(h_, e.layer);
  if (centered && means_.means.empty()) {
    return Status::Corruption(name_ + ": layer " + std::to_string(e.layer) +
                              " keys without key means");
  }
  const auto decode = [&](const Run& r, ThreadPool* pool) -> Status {
    const uint8_t* meta =
        meta_bytes ? metas_.data() + meta_base + r.head * meta_bytes : nullptr;
    const std::span<const uint8_t> codes{
        payload.data() + (r.head * e.token_count + (r.token - e.token_begin)) * code_bytes,
        r.n * code_bytes};
    void* dst = Destination(e.layer, e.kv, r);
    if (centered) {
      return DecodeCenteredKeys(h_, e.layer, codec, means_, r.head, r.token, r.n, codes,
                                {meta, meta_bytes}, dst, options_.dtype, stride_[e.kv], pool);
    }
    return codec.Decode(codes, r.n, {meta, meta_bytes}, dst, options_.dtype, stride_[e.kv], pool);
  };
  SplitRuns(tensors_.layout(e.kv), heads, e.token_begin, e.token_count, runs_);
  if (runs_.size() <= heads) {  // one run per head: the codec spreads it over the pool
    for (const Run& r : runs_) TQKV_RETURN_IF_ERROR(decode(r, options_.pool));
    return Status::Ok();
  }
  // Paged: many short runs, spread over the pool themselves (each decoded on one thread).
  const uint64_t block = std::max<uint64_t>(1, tensors_.layout(e.kv).block_tokens);
  const size_t grain = static_cast<size_t>(std::max<uint64_t>(1, 256 / block));
  return ParallelForEach(options_.pool, runs_.size(), grain,
                         [&](size_t i) { return decode(runs_[i], nullptr); });
}

using MakeTensors = std::function<Result<std::unique_ptr<HostTensors>>(const ContainerHeader&)>;

// The host restore: open, check, then the chunk loop into a HostDecodeSink. `make_tensors` is
// called once the header is known.
Status RunRestore(Store& store, std::string_view key, const RestoreOptions& options,
                  const MakeTensors& make_tensors, RestoreStats* stats_out) {
  RestoreStats stats;
  const std::string name(key);
  TQKV_ASSIGN_OR_RETURN(std::unique_ptr<ReadableObject> object, store.Open(key));
  if (options.drop_cache) {
    Status s = object->DropCache();
    if (!s.ok()) {
      stats.drop_cache_ok = false;
      stats.drop_cache_error = s.ToString();
    }
  }
  const uint64_t read_before = object->BytesRead();
  const ReadPathBytes path_before = object->PathBytes();
  const auto t0 = RestoreClock::now();
  TQKV_ASSIGN_OR_RETURN(std::unique_ptr<ContainerReader> reader,
                        ContainerReader::Open(object.get(), name));
  const ContainerHeader& h = reader->header();
  if (options.expect_model && h.model != *options.expect_model) {
    return Status::InvalidArgument(name + " holds model '" + h.model + "', expected '" +
                                   *options.expect_model + "'");
  }
  if (options.expect_geometry != nullptr) {
    TQKV_RETURN_IF_ERROR(CheckGeometry(h, *options.expect_geometry, name));
  }
  TQKV_ASSIGN_OR_RETURN(SessionCodecs codecs, SessionCodecsFromHeader(h));
  TQKV_ASSIGN_OR_RETURN(std::unique_ptr<Codec> exact_codec, ExactRowsCodec(h));
  TQKV_ASSIGN_OR_RETURN(std::unique_ptr<HostTensors> tensors, make_tensors(h));
  HostDecodeSink sink(*reader, std::move(codecs), std::move(exact_codec), *tensors, options, name);
  ChunkLoopOptions loop;
  loop.inflight_bytes = options.inflight_bytes;
  loop.max_slots = 64;
  loop.read_lanes = options.read_lanes;
  ChunkLoopStats ls;
  TQKV_RETURN_IF_ERROR(RunChunkLoop(*reader, sink, loop, &ls));
  stats.seconds = SecondsSince(t0);
  if (h.geometry.layers > 0) {
    stats.first_layer_seconds = std::chrono::duration<double>(ls.first_layer_done - t0).count();
  }
  stats.read_busy_seconds = ls.read_busy_seconds;
  stats.decode_busy_seconds = ls.consume_seconds;
  stats.bytes_read = object->BytesRead() - read_before;
  if (stats.bytes_read == 0) stats.bytes_read = reader->file_bytes();
  const ReadPathBytes path_after = object->PathBytes();
  stats.read_path.direct = path_after.direct - path_before.direct;
  stats.read_path.uring = path_after.uring - path_before.uring;
  stats.read_path.page_cache = path_after.page_cache - path_before.page_cache;
  stats.tokens = h.tokens;
  stats.model = h.model;
  stats.geometry = h.geometry;
  stats.fp16_bytes = SessionTensorBytes(h, DType::kF16);
  stats.engine_state = h.engine_state;
  if (stats_out != nullptr) *stats_out = std::move(stats);
  return Status::Ok();
}

}  // namespace

Status RestoreInto(Store& store, std::string_view key, KvCache& dst, const RestoreOptions& options,
                   RestoreStats* stats) {
  RestoreOptions opts = options;
  opts.dtype = dst.dtype();
  const ModelGeometry want = dst.geometry();
  if (opts.expect_geometry == nullptr) opts.expect_geometry = &want;
  return RunRestore(
      store, key, opts,
      [&](const ContainerHeader& h) -> Result<std::unique_ptr<HostTensors>> {
        TQKV_RETURN_IF_ERROR(CheckCacheTokens(h, dst, key));
        TQKV_RETURN_IF_ERROR(dst.Validate());
        return std::unique_ptr<HostTensors>(new CacheTensors(dst, opts));
      },
      stats);
}

Status RestoreInto(Store& store, std::string_view key, const MakeCache& make_cache,
                   const RestoreOptions& options, RestoreStats* stats) {
  RestoreOptions opts = options;
  return RunRestore(
      store, key, opts,
      [&](const ContainerHeader& h) -> Result<std::unique_ptr<HostTensors>> {
        TQKV_ASSIGN_OR_RETURN(KvCache * dst, make_cache(h));
        if (dst == nullptr) return Status::InvalidArgument("RestoreInto: no destination cache");
        TQKV_RETURN_IF_ERROR(CheckGeometry(h, dst->geometry(), std::string(key)));
        TQKV_RETURN_IF_ERROR(CheckCacheTokens(h, *dst, key));
        TQKV_RETURN_IF_ERROR(dst->Validate());
        opts.dtype = dst->dtype();  // the sink, made after this returns, decodes to it
        return std::unique_ptr<HostTensors>(new CacheTensors(*dst, opts));
      },
      stats);
}

namespace {

// The layout restore: into `fixed`, or into what `make` lays out once the header is read (the
// object is opened once either way).
Status RestoreIntoLayout(Store& store, std::string_view key, const LayoutTensors* fixed,
                         const MakeDestination* make, const RestoreOptions& options,
                         RestoreStats* stats) {
  RestoreOptions opts = options;
  LayoutTensors made;
  const LayoutTensors* dst = fixed;
  if (fixed != nullptr) {
    TQKV_RETURN_IF_ERROR(CheckDestinationShape(*fixed, key));
    opts.dtype = fixed->dtype;
    if (opts.expect_geometry == nullptr) opts.expect_geometry = &fixed->geometry;
  }
  return RunRestore(
      store, key, opts,
      [&](const ContainerHeader& h) -> Result<std::unique_ptr<HostTensors>> {
        if (dst == nullptr) {
          TQKV_ASSIGN_OR_RETURN(made, (*make)(h));
          TQKV_RETURN_IF_ERROR(CheckDestination(made, h, key));
          opts.dtype = made.dtype;  // the sink, made after this returns, decodes to it
          dst = &made;
        } else {  // shape checked before the open, geometry by expect_geometry
          TQKV_RETURN_IF_ERROR(CheckTokens(h, dst->tokens, key));
        }
        if (DecodesInPlace(*dst)) {
          return std::unique_ptr<HostTensors>(new LaidOutTensors(*dst, opts));
        }
        return StagedTensors::Make(*dst, opts);
      },
      stats);
}

}  // namespace

Status RestoreInto(Store& store, std::string_view key, const LayoutTensors& dst,
                   const RestoreOptions& options, RestoreStats* stats) {
  return RestoreIntoLayout(store, key, &dst, nullptr, options, stats);
}

Status RestoreInto(Store& store, std::string_view key, const MakeDestination& make_destination,
                   const RestoreOptions& options, RestoreStats* stats) {
  return RestoreIntoLayout(store, key, nullptr, &make_destination, options, stats);
}

Result<std::unique_ptr<KvCacheBuffer>> Restore(Store& store, std::string_view key,
                                               const RestoreOptions& options, RestoreStats* stats) {
  std::unique_ptr<KvCacheBuffer> buffer;
  RestoreStats st;
  double alloc = 0;
  TQKV_RETURN_IF_ERROR(RunRestore(
      store, key, options,
      [&](const ContainerHeader& h) -> Result<std::unique_ptr<HostTensors>> {
        const auto ta = RestoreClock::now();
        TQKV_ASSIGN_OR_RETURN(buffer, KvCacheBuffer::Allocate(h.model, h.geometry, options.dtype,
                                                              h.tokens, h.layer_tokens));
        if (options.prefault) {
          KvCache& c = buffer->cache();
          for (uint32_t l = 0; l < h.geometry.layers; ++l) {
            std::memset(c.k(l), 0, c.tensor_bytes(l));
            std::memset(c.v(l), 0, c.tensor_bytes(l));
          }
          alloc = SecondsSince(ta);
        }
        return std::unique_ptr<HostTensors>(new CacheTensors(buffer->cache(), options));
      },
      &st));
  // RunRestore's clock ran while the destination was allocated: that time is not the restore's.
  st.alloc_seconds = alloc;
  st.seconds -= alloc;
  if (st.first_layer_seconds > 0) st.first_layer_seconds -= alloc;
  if (stats != nullptr) *stats = st;
  return buffer;
}

namespace {

// A streaming restore; `ragged` lets layers of a version-7 session through (their tensors then
// hold LayerTokens rows of the tokens-sized buffers), for callers that know it.
Status StreamLayers(Store& store, std::string_view key, const RestoreOptions& options,
                    const LayerCallback& on_layer, bool ragged, RestoreStats* stats) {
  return RunRestore(
      store, key, options,
      [&](const ContainerHeader& h) -> Result<std::unique_ptr<HostTensors>> {
        // The callback's tensors are tokens rows for every layer (checkpoint.h).
        if (!ragged) TQKV_RETURN_IF_ERROR(RefuseRagged(h, "a streaming restore"));
        const size_t bytes = h.tokens * h.geometry.token_elems() * DTypeSize(options.dtype);
        return CallbackTensors::Make(h.geometry, bytes, on_layer);
      },
      stats);
}

}  // namespace

Status RestoreStreaming(Store& store, std::string_view key, const RestoreOptions& options,
                        const LayerCallback& on_layer, RestoreStats* stats) {
  return StreamLayers(store, key, options, on_layer, false, stats);
}

Status VerifyObject(Store& store, std::string_view key) {
  // A restore with the layers dropped: every check a restore makes (checksums, padding, the
  // header against the chunk table, each group's outlier mask, the decode itself) and no other,
  // so "verify OK" means "restores". Memory: one layer's K and V in f16.
  return StreamLayers(store, key, RestoreOptions{},
                      [](uint32_t, const void*, const void*) { return Status::Ok(); }, true,
                      nullptr);
}

}  // namespace tqkv
