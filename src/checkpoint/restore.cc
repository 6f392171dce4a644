// Host restore: store -> container reader (verified chunks) -> CPU decode (pool) -> host tensors,
// over the chunk loop (chunk_loop.h), whose reads run ahead of decoding on a reader thread so wall
// time approaches max(read, decode).
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <string>

#include "checkpoint/chunk_loop.h"
#include "checkpoint/key_means.h"
#include "checkpoint/layout.h"
#include "tqkv/aligned_buffer.h"
#include "tqkv/checkpoint.h"
#include "tqkv/container.h"
#include "tqkv/thread_pool.h"

namespace tqkv {
namespace {

// Where decoded layers go: host tensors of a layer (a KvCache, or one reused layer for streaming).
class HostTensors {
 public:
  virtual ~HostTensors() = default;
  // Destination of layer `layer`'s tensor kv (0 = K, 1 = V), tokens * kv_heads * head_dim elements.
  virtual void* Tensor(uint32_t layer, int kv) = 0;
  virtual Status LayerDone(uint32_t layer) = 0;
};

class CacheTensors final : public HostTensors {
 public:
  CacheTensors(KvCache& cache, const RestoreOptions& options)
      : cache_(cache), layer_ready_(options.layer_ready) {}
  void* Tensor(uint32_t layer, int kv) override { return cache_.tensor(layer, kv); }
  Status LayerDone(uint32_t layer) override {
    return layer_ready_ ? layer_ready_(layer) : Status::Ok();
  }

 private:
  KvCache& cache_;
  const std::function<Status(uint32_t)>& layer_ready_;
};

class CallbackTensors final : public HostTensors {
 public:
  CallbackTensors(size_t tensor_bytes, const LayerCallback& cb) : cb_(cb) {
    k_.Reserve(tensor_bytes);
    v_.Reserve(tensor_bytes);
  }
  void* Tensor(uint32_t, int kv) override { return kv == 0 ? k_.data() : v_.data(); }
  Status LayerDone(uint32_t layer) override { return cb_(layer, k_.data(), v_.data()); }

 private:
  const LayerCallback& cb_;
  AlignedBuffer k_, v_;
};

// The host sink: decodes each verified chunk with the CPU codec into HostTensors.
class HostDecodeSink final : public ChunkSink {
 public:
  HostDecodeSink(const ContainerReader& reader, SessionCodecs codecs,
                 std::unique_ptr<Codec> exact_codec, HostTensors& tensors,
                 const RestoreOptions& options, std::string name)
      : reader_(reader), h_(reader.header()), codecs_(std::move(codecs)),
        exact_codec_(std::move(exact_codec)), tensors_(tensors), options_(options),
        name_(std::move(name)) {}

  Status Consume(size_t slot, size_t index, std::span<const uint8_t> payload) override;
  Status LayerDone(uint32_t layer) override {
    metas_.clear();
    means_ = KeyMeans{};
    return tensors_.LayerDone(layer);
  }

 private:
  Status DecodeExactRows(const ChunkEntry& e, const uint8_t* src);

  const ContainerReader& reader_;
  const ContainerHeader& h_;
  SessionCodecs codecs_;
  std::unique_ptr<Codec> exact_codec_;
  HostTensors& tensors_;
  const RestoreOptions& options_;
  std::string name_;
  std::vector<uint8_t> metas_;  // the current layer's group metadata
  KeyMeans means_;              // the current layer's key means and coefficients
};

// Overwrites the decoded rows: the container puts this chunk after the layer's codes.
Status HostDecodeSink::DecodeExactRows(const ChunkEntry& e, const uint8_t* src) {
  const size_t heads = h_.geometry.kv_heads, d = h_.geometry.head_dim, row = heads * d;
  const size_t out_size = DTypeSize(options_.dtype);
  const size_t vec = exact_codec_->code_bytes();
  for (int kv = 0; kv < 2; ++kv) {
    auto* tensor = static_cast<uint8_t*>(tensors_.Tensor(e.layer, kv));
    for (const TokenRange& range : ExactRanges(h_)) {
      for (size_t hd = 0; hd < heads && range.count > 0; ++hd, src += range.count * vec) {
        TQKV_RETURN_IF_ERROR(exact_codec_->Decode(
            {src, range.count * vec}, range.count, {},
            tensor + (range.begin * row + hd * d) * out_size, options_.dtype, row, nullptr));
      }
    }
  }
  return Status::Ok();
}

Status HostDecodeSink::Consume(size_t, size_t index, std::span<const uint8_t> payload) {
  const ChunkEntry& e = reader_.chunks()[index];
  if (e.type == ChunkType::kGroupMeta) {
    metas_.assign(payload.begin(), payload.end());
    return Status::Ok();
  }
  if (e.type == ChunkType::kExactRows) return DecodeExactRows(e, payload.data());
  if (e.type == ChunkType::kKeyMeans) {
    means_ = KeyMeansAsF32(h_, payload);
    return Status::Ok();
  }
  const Codec& codec = *codecs_.codecs[codecs_.layer_codec[e.layer]];
  const size_t heads = h_.geometry.kv_heads, d = h_.geometry.head_dim, row = heads * d;
  const size_t out_size = DTypeSize(options_.dtype);
  const size_t meta_bytes = codec.group_meta_bytes();
  if (meta_bytes > 0 && metas_.size() != 2 * heads * meta_bytes) {
    return Status::Corruption(name_ + ": layer " + std::to_string(e.layer) +
                              " codes without group metadata");
  }
  const size_t code_bytes = codec.code_bytes();
  auto* dst = static_cast<uint8_t*>(tensors_.Tensor(e.layer, e.kv)) + e.token_begin * row * out_size;
  const bool centered = e.kv == 0 && LayerHasKeyMeans(h_, e.layer);
  if (centered && means_.means.empty()) {
    return Status::Corruption(name_ + ": layer " + std::to_string(e.layer) +
                              " keys without key means");
  }
  for (size_t hd = 0; hd < heads; ++hd) {
    const uint8_t* meta =
        meta_bytes ? metas_.data() + (static_cast<size_t>(e.kv) * heads + hd) * meta_bytes : nullptr;
    if (centered) {
      TQKV_RETURN_IF_ERROR(DecodeCenteredKeys(
          h_, codec, means_, static_cast<uint32_t>(hd), e.token_begin, e.token_count,
          {payload.data() + hd * e.token_count * code_bytes, e.token_count * code_bytes},
          {meta, meta_bytes}, dst + hd * d * out_size, options_.dtype, row, options_.pool));
      continue;
    }
    TQKV_RETURN_IF_ERROR(codec.Decode(
        {payload.data() + hd * e.token_count * code_bytes, e.token_count * code_bytes},
        e.token_count, {meta, meta_bytes}, dst + hd * d * out_size, options_.dtype, row,
        options_.pool));
  }
  return Status::Ok();
}

Status CheckGeometry(const ContainerHeader& h, const ModelGeometry& want, const std::string& what) {
  if (h.geometry == want) return Status::Ok();
  auto str = [](const ModelGeometry& g) {
    return std::to_string(g.layers) + " layers x " + std::to_string(g.kv_heads) + " KV heads x " +
           std::to_string(g.head_dim) + " dims";
  };
  return Status::InvalidArgument(what + " holds " + str(h.geometry) + " (model '" + h.model +
                                 "'), expected " + str(want));
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
  const auto t0 = RestoreClock::now();
  TQKV_ASSIGN_OR_RETURN(std::unique_ptr<ContainerReader> reader,
                        ContainerReader::Open(object.get(), name));
  const ContainerHeader& h = reader->header();
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
  stats.tokens = h.tokens;
  stats.model = h.model;
  stats.geometry = h.geometry;
  stats.fp16_bytes = h.geometry.SessionBytes(h.tokens, DType::kF16);
  if (stats_out != nullptr) *stats_out = stats;
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
        if (h.tokens != dst.tokens()) {
          return Status::InvalidArgument(std::string(key) + " holds " + std::to_string(h.tokens) +
                                         " tokens, the destination has room for " +
                                         std::to_string(dst.tokens()));
        }
        TQKV_RETURN_IF_ERROR(dst.Validate());
        return std::unique_ptr<HostTensors>(new CacheTensors(dst, opts));
      },
      stats);
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
                                                              h.tokens));
        if (options.prefault) {
          KvCache& c = buffer->cache();
          for (uint32_t l = 0; l < h.geometry.layers; ++l) {
            std::memset(c.k(l), 0, c.tensor_bytes());
            std::memset(c.v(l), 0, c.tensor_bytes());
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

Status RestoreStreaming(Store& store, std::string_view key, const RestoreOptions& options,
                        const LayerCallback& on_layer, RestoreStats* stats) {
  return RunRestore(
      store, key, options,
      [&](const ContainerHeader& h) -> Result<std::unique_ptr<HostTensors>> {
        const size_t bytes = h.tokens * h.geometry.token_elems() * DTypeSize(options.dtype);
        return std::unique_ptr<HostTensors>(new CallbackTensors(bytes, on_layer));
      },
      stats);
}

Status VerifyObject(Store& store, std::string_view key) {
  TQKV_ASSIGN_OR_RETURN(std::unique_ptr<ReadableObject> object, store.Open(key));
  TQKV_ASSIGN_OR_RETURN(std::unique_ptr<ContainerReader> reader,
                        ContainerReader::Open(object.get(), std::string(key)));
  // The restore's read path with nothing decoded: every chunk read, checksum and padding checked.
  DiscardSink sink;
  return RunChunkLoop(*reader, sink, ChunkLoopOptions{});
}

}  // namespace tqkv
