// Restore: store -> container reader (verify) -> decode (pool) -> sink, with reads running ahead
// of decoding on a reader thread so wall time approaches max(read, decode).
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "checkpoint/layout.h"
#include "checkpoint/slot_reader.h"
#include "tqkv/aligned_buffer.h"
#include "tqkv/checkpoint.h"
#include "tqkv/container.h"
#include "tqkv/thread_pool.h"

namespace tqkv {
namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Where decoded layers go.
class Sink {
 public:
  virtual ~Sink() = default;
  // Destination of layer `layer`'s tensor kv (0 = K, 1 = V), tokens * kv_heads * head_dim elements.
  virtual void* Tensor(uint32_t layer, int kv) = 0;
  virtual Status LayerDone(uint32_t layer) = 0;
};

class CacheSink final : public Sink {
 public:
  explicit CacheSink(KvCache& cache) : cache_(cache) {}
  void* Tensor(uint32_t layer, int kv) override { return cache_.tensor(layer, kv); }
  Status LayerDone(uint32_t) override { return Status::Ok(); }

 private:
  KvCache& cache_;
};

class CallbackSink final : public Sink {
 public:
  CallbackSink(size_t tensor_bytes, const LayerCallback& cb) : cb_(cb) {
    k_.Reserve(tensor_bytes);
    v_.Reserve(tensor_bytes);
  }
  void* Tensor(uint32_t, int kv) override { return kv == 0 ? k_.data() : v_.data(); }
  Status LayerDone(uint32_t layer) override { return cb_(layer, k_.data(), v_.data()); }

 private:
  const LayerCallback& cb_;
  AlignedBuffer k_, v_;
};

struct Slot {
  AlignedBuffer buf;
  const ChunkEntry* entry = nullptr;
};

// The zero padding after a chunk is part of the file too: a flipped byte there is damage.
Status CheckPadding(const ChunkEntry& e, std::span<const uint8_t> extent) {
  for (size_t i = e.size; i < extent.size(); ++i) {
    if (extent[i] != 0) {
      return Status::Corruption("chunk padding at offset " + std::to_string(e.offset + i) +
                                ": expected 0, got " + std::to_string(extent[i]));
    }
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

// The pipeline shared by every restore flavour. `make_sink` is called after the header is known.
Status RunRestore(Store& store, std::string_view key, const RestoreOptions& options,
                  const std::function<Result<std::unique_ptr<Sink>>(const ContainerHeader&)>& make_sink,
                  RestoreStats* stats_out) {
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
  const auto t0 = Clock::now();
  TQKV_ASSIGN_OR_RETURN(std::unique_ptr<ContainerReader> reader,
                        ContainerReader::Open(object.get(), name));
  const ContainerHeader& h = reader->header();
  if (options.expect_geometry != nullptr) {
    TQKV_RETURN_IF_ERROR(CheckGeometry(h, *options.expect_geometry, name));
  }
  TQKV_ASSIGN_OR_RETURN(SessionCodecs codecs, SessionCodecsFromHeader(h));
  TQKV_ASSIGN_OR_RETURN(std::unique_ptr<Codec> exact_codec, ExactRowsCodec(h));
  TQKV_ASSIGN_OR_RETURN(std::unique_ptr<Sink> sink, make_sink(h));

  const auto& chunks = reader->chunks();
  uint64_t max_chunk = kContainerAlignment;
  for (size_t i = 0; i < chunks.size(); ++i) max_chunk = std::max(max_chunk, ChunkExtent(chunks, i));
  std::vector<Slot> slots(std::clamp<size_t>(options.inflight_bytes / max_chunk, 2, 64));
  for (auto& slot : slots) slot.buf.Reserve(max_chunk);
  // Reads a batch of chunk extents (one ReadBatch: io_uring keeps them in flight) and verifies
  // each chunk's checksum and padding.
  auto read = [&](const std::vector<size_t>& batch, size_t first) -> Status {
    std::vector<ReadRequest> reqs;
    for (size_t i = 0; i < batch.size(); ++i) {
      Slot& s = slots[batch[i]];
      s.entry = &chunks[first + i];
      reqs.push_back({s.entry->offset, {s.buf.data(), static_cast<size_t>(ChunkExtent(chunks, first + i))}});
    }
    TQKV_RETURN_IF_ERROR(object->ReadBatch(reqs));
    for (size_t i = 0; i < batch.size(); ++i) {
      const ChunkEntry& e = chunks[first + i];
      TQKV_RETURN_IF_ERROR(reader->VerifyChunk(e, reqs[i].dst.first(e.size)));
      TQKV_RETURN_IF_ERROR(CheckPadding(e, reqs[i].dst));
    }
    return Status::Ok();
  };
  SlotReader chunk_reader(slots.size(), chunks.size(), read);

  const size_t heads = h.geometry.kv_heads, d = h.geometry.head_dim;
  const size_t row = heads * d;
  const size_t out_size = DTypeSize(options.dtype);
  std::vector<uint8_t> metas;
  double decode_busy = 0;
  // Hands out layers in order up to `layer`; a layer without chunks (an empty session) too.
  uint32_t next_done = 0;
  auto done_through = [&](uint32_t layer) -> Status {
    for (; next_done <= layer && next_done < h.geometry.layers; ++next_done) {
      if (next_done == 0) stats.first_layer_seconds = Since(t0);
      TQKV_RETURN_IF_ERROR(sink->LayerDone(next_done));
    }
    return Status::Ok();
  };
  for (size_t i = 0; i < chunks.size(); ++i) {
    TQKV_ASSIGN_OR_RETURN(size_t si, chunk_reader.Next());
    const Slot& slot = slots[si];
    const ChunkEntry& e = *slot.entry;
    const Codec& codec = *codecs.codecs[codecs.layer_codec[e.layer]];
    const size_t meta_bytes = codec.group_meta_bytes();
    const auto td = Clock::now();
    if (e.type == ChunkType::kGroupMeta) {
      metas.assign(slot.buf.data(), slot.buf.data() + e.size);
    } else if (e.type == ChunkType::kExactRows) {
      // Overwrites the decoded rows: the container puts this chunk after the layer's codes.
      const size_t vec = exact_codec->code_bytes();
      const uint8_t* src = slot.buf.data();
      for (int kv = 0; kv < 2; ++kv) {
        auto* tensor = static_cast<uint8_t*>(sink->Tensor(e.layer, kv));
        for (const TokenRange& range : ExactRanges(h)) {
          for (size_t hd = 0; hd < heads && range.count > 0; ++hd, src += range.count * vec) {
            TQKV_RETURN_IF_ERROR(exact_codec->Decode(
                {src, range.count * vec}, range.count, {},
                tensor + (range.begin * row + hd * d) * out_size, options.dtype, row, nullptr));
          }
        }
      }
    } else {
      if (meta_bytes > 0 && metas.size() != 2 * heads * meta_bytes) {
        return Status::Corruption(name + ": layer " + std::to_string(e.layer) +
                                  " codes without group metadata");
      }
      const size_t code_bytes = codec.code_bytes();
      auto* dst = static_cast<uint8_t*>(sink->Tensor(e.layer, e.kv)) +
                  e.token_begin * row * out_size;
      for (size_t hd = 0; hd < heads; ++hd) {
        const uint8_t* meta =
            meta_bytes ? metas.data() + (static_cast<size_t>(e.kv) * heads + hd) * meta_bytes : nullptr;
        TQKV_RETURN_IF_ERROR(codec.Decode(
            {slot.buf.data() + hd * e.token_count * code_bytes, e.token_count * code_bytes},
            e.token_count, {meta, meta_bytes}, dst + hd * d * out_size, options.dtype, row,
            options.pool));
      }
    }
    decode_busy += Since(td);
    chunk_reader.Release(si);
    const bool layer_end = i + 1 == chunks.size() || chunks[i + 1].layer != e.layer;
    if (layer_end) {
      TQKV_RETURN_IF_ERROR(done_through(e.layer));
      if (e.layer + 1 < h.geometry.layers) metas.clear();
    }
  }
  if (h.geometry.layers > 0) TQKV_RETURN_IF_ERROR(done_through(h.geometry.layers - 1));
  stats.seconds = Since(t0);
  stats.read_busy_seconds = chunk_reader.busy_seconds();
  stats.decode_busy_seconds = decode_busy;
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
      [&](const ContainerHeader& h) -> Result<std::unique_ptr<Sink>> {
        if (h.tokens != dst.tokens()) {
          return Status::InvalidArgument(std::string(key) + " holds " + std::to_string(h.tokens) +
                                         " tokens, the destination has room for " +
                                         std::to_string(dst.tokens()));
        }
        TQKV_RETURN_IF_ERROR(dst.Validate());
        return std::unique_ptr<Sink>(new CacheSink(dst));
      },
      stats);
}

Result<std::unique_ptr<KvCacheBuffer>> Restore(Store& store, std::string_view key,
                                               const RestoreOptions& options, RestoreStats* stats) {
  std::unique_ptr<KvCacheBuffer> buffer;
  TQKV_RETURN_IF_ERROR(RunRestore(
      store, key, options,
      [&](const ContainerHeader& h) -> Result<std::unique_ptr<Sink>> {
        TQKV_ASSIGN_OR_RETURN(buffer, KvCacheBuffer::Allocate(h.model, h.geometry, options.dtype,
                                                              h.tokens));
        return std::unique_ptr<Sink>(new CacheSink(buffer->cache()));
      },
      stats));
  return buffer;
}

Status RestoreStreaming(Store& store, std::string_view key, const RestoreOptions& options,
                        const LayerCallback& on_layer, RestoreStats* stats) {
  return RunRestore(
      store, key, options,
      [&](const ContainerHeader& h) -> Result<std::unique_ptr<Sink>> {
        const size_t bytes = h.tokens * h.geometry.token_elems() * DTypeSize(options.dtype);
        return std::unique_ptr<Sink>(new CallbackSink(bytes, on_layer));
      },
      stats);
}

Status VerifyObject(Store& store, std::string_view key) {
  TQKV_ASSIGN_OR_RETURN(std::unique_ptr<ReadableObject> object, store.Open(key));
  TQKV_ASSIGN_OR_RETURN(std::unique_ptr<ContainerReader> reader,
                        ContainerReader::Open(object.get(), std::string(key)));
  AlignedBuffer buf;
  for (const auto& e : reader->chunks()) {
    buf.Reserve(e.size);
    TQKV_RETURN_IF_ERROR(reader->ReadChunk(e, {buf.data(), static_cast<size_t>(e.size)}));
  }
  return Status::Ok();
}

}  // namespace tqkv
