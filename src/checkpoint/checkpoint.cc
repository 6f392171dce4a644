// Checkpoint: source -> group metadata -> encode (pool) -> writer thread -> container -> store.
#include "tqkv/checkpoint.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "checkpoint/key_means.h"
#include "checkpoint/layout.h"
#include "format/container_layout.h"
#include "tqkv/aligned_buffer.h"
#include "tqkv/checked.h"
#include "tqkv/container.h"
#include "tqkv/thread_pool.h"

namespace tqkv {
namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

class CacheSource final : public KvSource {
 public:
  explicit CacheSource(const KvCache& cache) : cache_(cache) {}
  const std::string& model() const override { return cache_.model(); }
  const ModelGeometry& geometry() const override { return cache_.geometry(); }
  DType dtype() const override { return cache_.dtype(); }
  uint64_t tokens() const override { return cache_.tokens(); }
  Status ReadLayer(uint32_t layer, void* k, void* v) override {
    std::memcpy(k, cache_.k(layer), cache_.tensor_bytes());
    std::memcpy(v, cache_.v(layer), cache_.tensor_bytes());
    return Status::Ok();
  }
  const KvCache& cache() const { return cache_; }

 private:
  const KvCache& cache_;
};

// Appends chunks on its own thread so encoding the next chunk overlaps writing this one.
class ChunkWriterThread {
 public:
  ChunkWriterThread(ContainerWriter* writer, size_t depth)
      : writer_(writer), depth_(depth), thread_([this] { Loop(); }) {}
  ~ChunkWriterThread() { (void)Close(); }

  // Takes a buffer to fill (blocks while `depth` chunks are queued).
  AlignedBuffer TakeBuffer() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return queue_.size() < depth_ || !status_.ok(); });
    if (!free_.empty()) {
      AlignedBuffer b = std::move(free_.back());
      free_.pop_back();
      return b;
    }
    return AlignedBuffer();
  }
  Status Push(const ChunkEntry& entry, AlignedBuffer buf, size_t size) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!status_.ok()) return status_;
    queue_.push_back(Item{entry, std::move(buf), size});
    cv_.notify_all();
    return Status::Ok();
  }
  // Waits for every queued chunk; returns the first error.
  Status Close() {
    {
      std::unique_lock<std::mutex> lock(mu_);
      closing_ = true;
      cv_.notify_all();
    }
    if (thread_.joinable()) thread_.join();
    return status_;
  }
  double write_seconds() const { return write_seconds_; }

 private:
  struct Item {
    ChunkEntry entry;
    AlignedBuffer buf;
    size_t size;
  };
  void Loop() {
    for (;;) {
      Item item;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return !queue_.empty() || closing_; });
        if (queue_.empty()) return;
        item = std::move(queue_.front());
        queue_.pop_front();
      }
      Status s;
      if (status_.ok()) {
        const auto t = Clock::now();
        s = writer_->AddChunk(item.entry, {item.buf.data(), item.size});
        write_seconds_ += Since(t);
      }
      std::unique_lock<std::mutex> lock(mu_);
      if (!s.ok() && status_.ok()) status_ = s;
      free_.push_back(std::move(item.buf));
      cv_.notify_all();
    }
  }

  ContainerWriter* writer_;
  size_t depth_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  std::vector<AlignedBuffer> free_;
  Status status_;
  bool closing_ = false;
  double write_seconds_ = 0;
  std::thread thread_;
};

}  // namespace

Result<LayerCodec> ParseLayerCodec(std::string_view text) {
  const size_t colon = text.find(':');
  if (colon == std::string_view::npos || colon == 0) {
    return Status::InvalidArgument("layer codec '" + std::string(text) + "': expected L:SPEC");
  }
  uint32_t layer = 0;
  for (char c : text.substr(0, colon)) {
    if (c < '0' || c > '9' || layer > 100000) {
      return Status::InvalidArgument("layer codec '" + std::string(text) + "': bad layer number");
    }
    layer = layer * 10 + static_cast<uint32_t>(c - '0');
  }
  TQKV_ASSIGN_OR_RETURN(CodecSpec spec, ParseCodecSpec(text.substr(colon + 1)));
  return LayerCodec{layer, spec};
}

Result<ExactTokens> ParseExactTokens(std::string_view text) {
  const auto bad = [&] {
    return Status::InvalidArgument("exact tokens '" + std::string(text) +
                                   "': expected FIRST,LAST (e.g. 4,128)");
  };
  const size_t comma = text.find(',');
  if (comma == std::string_view::npos) return bad();
  ExactTokens out;
  uint32_t* fields[2] = {&out.head, &out.tail};
  const std::string_view parts[2] = {text.substr(0, comma), text.substr(comma + 1)};
  for (int i = 0; i < 2; ++i) {
    const char* end = parts[i].data() + parts[i].size();
    auto [ptr, ec] = std::from_chars(parts[i].data(), end, *fields[i]);
    if (parts[i].empty() || ec != std::errc() || ptr != end) return bad();
  }
  return out;
}

Result<KeyMeanSetting> ParseKeyMeans(std::string_view text) {
  const auto bad = [&] {
    return Status::InvalidArgument("key means '" + std::string(text) +
                                   "': expected off, session or a block of tokens (e.g. 128), "
                                   "optionally followed by ,f16 or ,f32");
  };
  KeyMeanSetting out;
  std::string_view block = text;
  const size_t comma = text.find(',');
  if (comma != std::string_view::npos) {
    block = text.substr(0, comma);
    const std::string_view dtype = text.substr(comma + 1);
    if (dtype == "f16") {
      out.dtype = DType::kF16;
    } else if (dtype == "f32") {
      out.dtype = DType::kF32;
    } else {
      return bad();
    }
  }
  if (block == "off") {
    out.block = 0;
  } else if (block == "session") {
    out.block = kKeyMeanPerSession;
  } else {
    const char* end = block.data() + block.size();
    auto [ptr, ec] = std::from_chars(block.data(), end, out.block);
    if (block.empty() || ec != std::errc() || ptr != end) return bad();
  }
  return out;
}

std::string FormatKeyMeans(const KeyMeanSetting& s) {
  const std::string block = s.block == 0                    ? "off"
                            : s.block == kKeyMeanPerSession ? "session"
                                                            : std::to_string(s.block);
  return s.block != 0 && s.dtype == DType::kF32 ? block + ",f32" : block;
}

Result<CheckpointStats> Checkpoint(KvSource& source, const CheckpointOptions& options, Store& store,
                                   std::string_view key) {
  const auto t0 = Clock::now();
  const ModelGeometry g = source.geometry();
  TQKV_RETURN_IF_ERROR(ValidateGeometry(g).WithContext("checkpoint"));
  TQKV_ASSIGN_OR_RETURN(SessionCodecs codecs,
                        ResolveSessionCodecs(options.codec, options.layer_overrides, g));
  ContainerHeader header;
  header.model = source.model();
  header.geometry = g;
  header.source_dtype = source.dtype();
  header.tokens = source.tokens();
  header.token_block = options.token_block ? options.token_block : DefaultTokenBlock(codecs, g);
  header.codecs.reserve(codecs.codecs.size());
  for (const auto& c : codecs.codecs) header.codecs.push_back(c->params());
  header.layer_codec = codecs.layer_codec;
  header.exact_head = static_cast<uint32_t>(std::min<uint64_t>(options.exact_head, header.tokens));
  header.exact_tail = static_cast<uint32_t>(
      std::min<uint64_t>(options.exact_tail, header.tokens - header.exact_head));
  header.engine_state = options.engine_state;
  bool any_tq = false;
  for (const auto& c : codecs.codecs) any_tq |= c->params().kind == CodecKind::kTurboQuant;
  if (options.key_mean_block != 0 && header.tokens > 0 && any_tq) {
    header.key_mean_block = static_cast<uint32_t>(
        std::min<uint64_t>(options.key_mean_block, header.tokens));  // larger: one per session
    header.key_mean_dtype = options.key_mean_dtype;
  }

  const DType dtype = source.dtype();
  const size_t heads = g.kv_heads, d = g.head_dim;
  const size_t row = heads * d;  // elements per token
  const uint64_t tokens = header.tokens;
  const auto* cache_source = dynamic_cast<const CacheSource*>(&source);
  // Whatever can be refused is refused before the store sees the key, so nothing is left in it:
  // the header, the sizes (checked, they come from the user) and the layer buffers.
  const auto refuse = [&](const Status& s) {
    return s.WithContext("checkpoint " + std::string(key));
  };
  AlignedBuffer layer_k, layer_v;
  auto layer_bytes = SizeProduct("layer tensor (tokens x KV heads x head_dim x dtype)",
                                 {tokens, heads, d, DTypeSize(dtype)});
  if (!layer_bytes.ok()) return refuse(layer_bytes.status());
  if (Status s = format::ValidateHeader(header); !s.ok()) return refuse(s);
  if (cache_source == nullptr) {
    Status s = layer_k.TryReserve(*layer_bytes);
    if (s.ok()) s = layer_v.TryReserve(*layer_bytes);
    if (!s.ok()) return refuse(s);
  }
  AlignedBuffer residual_buf;  // a layer's mean-removed keys, f32
  if (header.key_mean_block != 0) {
    auto bytes = SizeProduct("mean-removed keys (tokens x KV heads x head_dim x f32)",
                             {tokens, heads, d, 4});
    Status s = bytes.ok() ? residual_buf.TryReserve(*bytes) : bytes.status();
    if (!s.ok()) return refuse(s);
  }

  TQKV_ASSIGN_OR_RETURN(std::unique_ptr<WritableObject> object, store.Create(key));
  auto created = ContainerWriter::Create(object.get(), header);
  if (!created.ok()) {
    (void)object->Abort();
    return refuse(created.status());
  }
  std::unique_ptr<ContainerWriter> writer = std::move(created).value();

  CheckpointStats stats;
  double encode_seconds = 0;
  ChunkWriterThread chunk_writer(writer.get(), 2);
  Status status;
  std::vector<uint8_t> metas;
  for (uint32_t layer = 0; layer < g.layers && status.ok(); ++layer) {
    const void* tensors[2];
    if (cache_source != nullptr) {
      tensors[0] = cache_source->cache().k(layer);
      tensors[1] = cache_source->cache().v(layer);
    } else {
      const auto ts = Clock::now();
      status = source.ReadLayer(layer, layer_k.data(), layer_v.data());
      stats.source_seconds += Since(ts);
      if (!status.ok()) break;
      tensors[0] = layer_k.data();
      tensors[1] = layer_v.data();
    }
    const Codec& codec = *codecs.codecs[codecs.layer_codec[layer]];
    const size_t meta_bytes = codec.group_meta_bytes();
    const auto te = Clock::now();
    // What gets encoded: the tensors, or for K of a layer with key means its residual (f32).
    const void* coded[2] = {tensors[0], tensors[1]};
    DType coded_dtype[2] = {dtype, dtype};
    AlignedBuffer means_buf;
    size_t means_bytes = 0;
    if (LayerHasKeyMeans(header, layer)) {
      means_bytes = KeyMeanValues(header) * DTypeSize(header.key_mean_dtype);
      means_buf = chunk_writer.TakeBuffer();
      means_buf.Reserve(means_bytes);
      ComputeKeyMeans(header, tensors[0], dtype, {means_buf.data(), means_bytes});
      auto* residual = reinterpret_cast<float*>(residual_buf.data());
      CenterKeys(header, tensors[0], dtype, KeyMeansAsF32(header, {means_buf.data(), means_bytes}),
                 residual);
      coded[0] = residual;
      coded_dtype[0] = DType::kF32;
    }
    metas.assign(2 * heads * meta_bytes, 0);
    if (meta_bytes > 0) {
      for (int kv = 0; kv < 2 && status.ok(); ++kv) {
        for (size_t h = 0; h < heads && status.ok(); ++h) {
          const auto* base =
              static_cast<const uint8_t*>(coded[kv]) + h * d * DTypeSize(coded_dtype[kv]);
          status = codec.SelectGroupMeta(base, coded_dtype[kv], tokens, row,
                                         {metas.data() + (kv * heads + h) * meta_bytes, meta_bytes});
        }
      }
      encode_seconds += Since(te);
      if (!status.ok()) break;
      AlignedBuffer buf = chunk_writer.TakeBuffer();
      status = buf.TryReserve(metas.size());
      if (!status.ok()) break;
      std::memcpy(buf.data(), metas.data(), metas.size());
      ChunkEntry entry;
      entry.type = ChunkType::kGroupMeta;
      entry.layer = layer;
      status = chunk_writer.Push(entry, std::move(buf), metas.size());
    }
    if (means_bytes > 0 && status.ok()) {
      ChunkEntry entry;
      entry.type = ChunkType::kKeyMeans;
      entry.layer = layer;
      status = chunk_writer.Push(entry, std::move(means_buf), means_bytes);
    }
    const size_t code_bytes = codec.code_bytes();
    for (int kv = 0; kv < 2 && status.ok(); ++kv) {
      for (uint64_t t0b = 0; t0b < tokens && status.ok(); t0b += header.token_block) {
        const uint64_t count = std::min<uint64_t>(header.token_block, tokens - t0b);
        const size_t payload = heads * count * code_bytes;
        AlignedBuffer buf = chunk_writer.TakeBuffer();
        status = buf.TryReserve(payload);
        if (!status.ok()) break;
        const auto tc = Clock::now();
        for (size_t h = 0; h < heads && status.ok(); ++h) {
          const auto* x = static_cast<const uint8_t*>(coded[kv]) +
                          (t0b * row + h * d) * DTypeSize(coded_dtype[kv]);
          status = codec.Encode(x, coded_dtype[kv], count, row,
                                {metas.data() + (kv * heads + h) * meta_bytes, meta_bytes},
                                {buf.data() + h * count * code_bytes, count * code_bytes},
                                options.pool);
        }
        encode_seconds += Since(tc);
        if (!status.ok()) break;
        ChunkEntry entry;
        entry.type = ChunkType::kCodes;
        entry.layer = layer;
        entry.kv = static_cast<uint8_t>(kv);
        entry.token_begin = t0b;
        entry.token_count = count;
        status = chunk_writer.Push(entry, std::move(buf), payload);
      }
    }
    const uint64_t exact_rows = uint64_t{header.exact_head} + header.exact_tail;
    if (exact_rows > 0 && status.ok()) {
      // K then V; per range head-major [kv_head][token][head_dim], source dtype.
      const size_t vec = d * DTypeSize(dtype);
      const size_t payload = 2 * exact_rows * heads * vec;
      AlignedBuffer buf = chunk_writer.TakeBuffer();
      status = buf.TryReserve(payload);
      if (!status.ok()) break;
      uint8_t* out = buf.data();
      for (int kv = 0; kv < 2; ++kv) {
        const auto* base = static_cast<const uint8_t*>(tensors[kv]);
        for (const TokenRange& range : ExactRanges(header)) {
          for (size_t h = 0; h < heads; ++h) {
            for (uint64_t t = range.begin; t < range.begin + range.count; ++t, out += vec) {
              std::memcpy(out, base + (t * row + h * d) * DTypeSize(dtype), vec);
            }
          }
        }
      }
      ChunkEntry entry;
      entry.type = ChunkType::kExactRows;
      entry.layer = layer;
      status = chunk_writer.Push(entry, std::move(buf), payload);
    }
  }
  Status closed = chunk_writer.Close();
  if (status.ok()) status = closed;
  const auto tw = Clock::now();
  if (status.ok()) status = writer->Finish();
  if (status.ok()) status = object->Commit();
  if (!status.ok()) {
    (void)object->Abort();
    return status.WithContext("checkpoint " + std::string(key));
  }
  stats.write_seconds = chunk_writer.write_seconds() + Since(tw);
  stats.encode_seconds = encode_seconds;
  stats.bytes_written = writer->BytesWritten();
  stats.fp16_bytes = g.SessionBytes(tokens, DType::kF16);
  stats.seconds = Since(t0);
  return stats;
}

Result<CheckpointStats> Checkpoint(const KvCache& cache, const CheckpointOptions& options,
                                   Store& store, std::string_view key) {
  TQKV_RETURN_IF_ERROR(cache.Validate());
  CacheSource source(cache);
  return Checkpoint(source, options, store, key);
}

}  // namespace tqkv
