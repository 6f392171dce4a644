// Checkpoint: source -> group metadata -> encode (pool) -> writer thread -> container -> store.
#include "tqkv/checkpoint.h"
#include "tqkv/settings.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "checkpoint/bit_allocator.h"
#include "checkpoint/codec_guard.h"
#include "checkpoint/key_means.h"
#include "checkpoint/session_codecs.h"
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
  std::vector<uint64_t> layer_tokens() const override { return cache_.layer_token_counts(); }
  Status ReadLayer(uint32_t layer, void* k, void* v) override {
    std::memcpy(k, cache_.k(layer), cache_.tensor_bytes(layer));
    std::memcpy(v, cache_.v(layer), cache_.tensor_bytes(layer));
    return Status::Ok();
  }
  bool InMemory() const override { return true; }
  std::pair<const void*, const void*> LayerInMemory(uint32_t layer) const override {
    return {cache_.k(layer), cache_.v(layer)};
  }

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

std::string FormatGuardFigure(double v) {
  if (std::isinf(v)) return "inf";
  char buf[32];
  std::snprintf(buf, sizeof buf, v >= 100 ? "%.0f" : v >= 0.01 ? "%.3g" : "%.2g", v);
  return buf;
}

std::string DescribeGuardExceeded(const std::vector<TensorCodecError>& errors,
                                  const std::vector<uint32_t>& exceeded, double threshold) {
  std::string out;
  for (uint32_t i : exceeded) {
    if (!out.empty()) out += ", ";
    out += "layer " + std::to_string(i / 2) + (i % 2 ? " V: " : " K: ") +
           FormatGuardFigure(RelativeError(errors[i])) + " > " + FormatGuardFigure(threshold);
  }
  return out;
}

namespace {

// The container header of a session: geometry, codecs, exact rows, engine state, key means.
ContainerHeader PlanHeader(const KvSource& source, const CheckpointOptions& options,
                           const SessionCodecs& codecs) {
  const ModelGeometry& g = source.geometry();
  ContainerHeader header;
  header.model = source.model();
  header.geometry = g;
  header.source_dtype = source.dtype();
  header.tokens = source.tokens();
  header.layer_tokens = source.layer_tokens();  // ValidateHeader checks the table
  if (std::all_of(header.layer_tokens.begin(), header.layer_tokens.end(),
                  [&](uint64_t n) { return n == header.tokens; })) {
    header.layer_tokens.clear();  // every layer full: a rectangle, versions 1 to 6
  }
  // Exact rows fit every layer: clamped to the shortest (MinLayerTokens), head first.
  const uint64_t shortest = MinLayerTokens(header);
  header.token_block = options.token_block ? options.token_block : DefaultTokenBlock(codecs, g);
  header.codecs.reserve(codecs.codecs.size());
  for (const auto& c : codecs.codecs) header.codecs.push_back(c->params());
  header.layer_codec = codecs.layer_codec;
  if (codecs.layer_codec_v != codecs.layer_codec) header.layer_codec_v = codecs.layer_codec_v;
  header.exact_head = static_cast<uint32_t>(std::min<uint64_t>(options.exact_head, shortest));
  header.exact_tail = static_cast<uint32_t>(
      std::min<uint64_t>(options.exact_tail, shortest - header.exact_head));
  header.engine_state = options.engine_state;
  header.payload_alignment = options.alignment;
  bool any_lossy_k = false;
  for (uint16_t i : codecs.layer_codec) {  // key means are for keys: K's codecs decide
    any_lossy_k |= KindTakesKeyMeans(codecs.codecs[i]->params().kind);
  }
  if (options.key_mean_block != 0 && header.tokens > 0 && any_lossy_k) {
    header.key_mean_block = static_cast<uint32_t>(
        std::min<uint64_t>(options.key_mean_block, header.tokens));  // larger: one per session
    header.key_mean_dtype = options.key_mean_dtype;
  }
  return header;
}

// The bit allocator (docs/codec.md §10): measures every preset on every tensor of the session,
// picks per layer and tensor within the budget (every byte of the file counted: the overhead
// beyond the codes is found by planning the real header, then the codes' budget shrinks by it
// until the whole file fits), and replaces `codecs` and `header` with the choice.
Status AllocateCodecs(const KvSource& source, const CheckpointOptions& options,
                      const LayerTensorsFn& layer_tensors, float* residual, SessionCodecs& codecs,
                      ContainerHeader& header, CheckpointStats& stats) {
  const ModelGeometry& g = source.geometry();
  const uint64_t tokens = header.tokens;
  KvCodecSpec as_spec;
  as_spec.auto_bits = options.allocate_bits;
  as_spec.auto_from = options.allocate_from;
  const std::string budget_text = FormatKvCodecSpec(as_spec);
  const auto bad = [&](const std::string& why) {
    return Status::InvalidArgument(budget_text + ": " + why);
  };
  if (!options.layer_overrides.empty()) {
    return bad("the allocator picks every layer's codecs; per-layer overrides cannot go with it");
  }
  if (tokens == 0) return Status::Ok();  // nothing to measure: the placeholder codecs stay
  std::vector<CodecSpec> specs;
  std::vector<std::unique_ptr<Codec>> owned;
  std::vector<const Codec*> candidates;
  std::string unbuilt;
  for (const char* preset : AllocatorCandidates(options.allocate_from)) {
    TQKV_ASSIGN_OR_RETURN(CodecSpec spec, ParseCodecSpec(preset));
    // A preset this head_dim cannot have (a split one's subset with no rotation: head_dim 1000)
    // is left out; the allocator chooses among the others.
    auto codec = Codec::Create(spec, g.head_dim);
    if (!codec.ok()) {
      unbuilt += std::string(unbuilt.empty() ? "" : "; ") + preset + ": " + codec.status().message();
      continue;
    }
    specs.push_back(spec);
    candidates.push_back(codec->get());
    owned.push_back(std::move(*codec));
  }
  if (specs.empty()) return bad("no preset can be built at head_dim " + std::to_string(g.head_dim) + " (" + unbuilt + ")");
  const uint32_t stride = GuardStride(tokens);
  TQKV_ASSIGN_OR_RETURN(
      const CandidateErrors errors,
      MeasureCodecErrors(header, stride, layer_tensors,
                         [&](uint32_t, int) { return candidates; }, residual, options.pool));
  TensorBytes bytes(g.layers);
  for (uint32_t l = 0; l < g.layers; ++l) {
    for (auto& kv : bytes[l]) {
      for (const Codec* c : candidates) {
        kv.push_back(LayerTokens(header, l) * g.kv_heads * c->code_bytes() +
                     g.kv_heads * c->group_meta_bytes());
      }
    }
  }
  const double values = 2.0 * static_cast<double>(HeldTokens(header)) * g.token_elems();
  const auto budget = static_cast<uint64_t>(std::floor(options.allocate_bits * values / 8));
  uint64_t overhead = 0;
  for (int attempt = 0; attempt < 8; ++attempt) {
    if (overhead > budget) break;
    auto choice = AllocateGreedy(errors, bytes, budget - overhead);
    if (!choice.ok()) break;
    CheckpointOptions chosen = options;
    chosen.allocate_bits = 0;
    chosen.codec = specs[0];
    chosen.v_codec.reset();
    uint64_t code_bytes = 0;
    std::vector<TensorCodecError> chosen_errors;
    for (uint32_t l = 0; l < g.layers; ++l) {
      const auto [k, v] = (*choice)[l];
      chosen.layer_overrides.push_back(
          {l, specs[k], k == v ? std::nullopt : std::optional<CodecSpec>(specs[v])});
      code_bytes += bytes[l][0][k] + bytes[l][1][v];
      chosen_errors.push_back(errors[l][0][k]);
      chosen_errors.push_back(errors[l][1][v]);
    }
    TQKV_ASSIGN_OR_RETURN(SessionCodecs planned, ResolveSessionCodecs(chosen, g));
    ContainerHeader h = PlanHeader(source, chosen, planned);
    h.guard_stride = stride;
    h.codec_error = std::move(chosen_errors);
    h.allocated_bits = static_cast<float>(options.allocate_bits);
    TQKV_ASSIGN_OR_RETURN(const uint64_t file, ContainerFileBytes(h));
    if (file <= budget) {
      stats.allocated.clear();
      for (uint32_t l = 0; l < g.layers; ++l) {
        stats.allocated.push_back({FormatCodecSpec(specs[(*choice)[l][0]]),
                                   FormatCodecSpec(specs[(*choice)[l][1]])});
      }
      codecs = std::move(planned);
      header = std::move(h);
      return Status::Ok();
    }
    overhead = std::max(overhead + 1, file - code_bytes);
  }
  // Report what the cheapest choice needs.
  uint64_t cheapest = 0;
  size_t cheapest_spec = 0;
  for (const auto& layer : bytes) {
    for (const auto& kv : layer) {
      cheapest_spec = std::min_element(kv.begin(), kv.end()) - kv.begin();
      cheapest += kv[cheapest_spec];
    }
  }
  char need[96];
  std::snprintf(need, sizeof need, "%.3f", 8.0 * static_cast<double>(cheapest + overhead) / values);
  return bad("no choice of " + FormatCodecSpec(specs.front()) + ".." +
             FormatCodecSpec(specs.back()) + " fits: " + FormatCodecSpec(specs[cheapest_spec]) +
             " everywhere needs about " + need + " bits per value for this session");
}

ChunkEntry LayerChunk(ChunkType type, uint32_t layer) {
  ChunkEntry e;
  e.type = type;
  e.layer = layer;
  return e;
}

// Encodes one layer and queues its chunks in container order: group metadata, key means, K and
// V codes, exact rows (docs/format.md §5).
class LayerWriter {
 public:
  LayerWriter(const ContainerHeader& header, const SessionCodecs& codecs,
              ChunkWriterThread& chunks, AlignedBuffer& residual, ThreadPool* pool)
      : h_(header), codecs_(codecs), chunks_(chunks), residual_(residual), pool_(pool) {}

  Status Write(uint32_t layer, const void* const tensors[2]) {
    const Codec* codec[2] = {&codecs_.of(layer, 0), &codecs_.of(layer, 1)};
    const auto te = Clock::now();
    // What gets encoded: the tensors, or for K of a layer with key means its residual (f32).
    Coded coded{{tensors[0], tensors[1]}, {h_.source_dtype, h_.source_dtype}};
    AlignedBuffer means;
    size_t means_bytes = 0;
    if (LayerHasKeyMeans(h_, layer)) {
      means_bytes = KeyMeanValues(h_, layer) * DTypeSize(h_.key_mean_dtype);
      means = chunks_.TakeBuffer();
      means.Reserve(means_bytes);
      ComputeKeyMeans(h_, layer, tensors[0], h_.source_dtype, {means.data(), means_bytes}, pool_);
      auto* residual = reinterpret_cast<float*>(residual_.data());
      CenterKeys(h_, layer, tensors[0], h_.source_dtype,
                 KeyMeansAsF32(h_, layer, {means.data(), means_bytes}), residual, pool_);
      coded = {{residual, tensors[1]}, {DType::kF32, h_.source_dtype}};
    }
    Status status = WriteGroupMeta(layer, codec, coded);
    encode_seconds_ += Since(te);
    if (means_bytes > 0 && status.ok()) {
      status =
          chunks_.Push(LayerChunk(ChunkType::kKeyMeans, layer), std::move(means), means_bytes);
    }
    if (status.ok()) status = WriteCodes(layer, codec, coded);
    if (status.ok()) status = WriteExactRows(layer, tensors);
    return status;
  }
  double encode_seconds() const { return encode_seconds_; }

 private:
  struct Coded {
    const void* data[2];
    DType dtype[2];
  };
  size_t Row() const { return size_t{h_.geometry.kv_heads} * h_.geometry.head_dim; }
  const uint8_t* HeadBase(const Coded& c, int kv, uint64_t token, size_t head) const {
    return static_cast<const uint8_t*>(c.data[kv]) +
           (token * Row() + head * h_.geometry.head_dim) * DTypeSize(c.dtype[kv]);
  }
  // [K heads][K's meta bytes] then [V heads][V's meta bytes] (docs/format.md §5).
  std::span<uint8_t> Meta(const Codec* const codec[2], int kv, size_t head) {
    const size_t k_bytes = codec[0]->group_meta_bytes(), bytes = codec[kv]->group_meta_bytes();
    return {metas_.data() + (kv == 0 ? 0 : h_.geometry.kv_heads * k_bytes) + head * bytes, bytes};
  }

  // One outlier mask per (K or V, KV head), chosen over all of the layer's tokens.
  Status WriteGroupMeta(uint32_t layer, const Codec* const codec[2], const Coded& coded) {
    const size_t heads = h_.geometry.kv_heads;
    metas_.assign(heads * (codec[0]->group_meta_bytes() + codec[1]->group_meta_bytes()), 0);
    if (metas_.empty()) return Status::Ok();
    for (int kv = 0; kv < 2; ++kv) {
      if (codec[kv]->group_meta_bytes() == 0) continue;
      for (size_t h = 0; h < heads; ++h) {
        TQKV_RETURN_IF_ERROR(codec[kv]->SelectGroupMeta(HeadBase(coded, kv, 0, h),
                                                        coded.dtype[kv],
                                                        LayerTokens(h_, layer), Row(),
                                                        Meta(codec, kv, h)));
      }
    }
    AlignedBuffer buf = chunks_.TakeBuffer();
    TQKV_RETURN_IF_ERROR(buf.TryReserve(metas_.size()));
    std::memcpy(buf.data(), metas_.data(), metas_.size());
    return chunks_.Push(LayerChunk(ChunkType::kGroupMeta, layer), std::move(buf), metas_.size());
  }

  Status WriteCodes(uint32_t layer, const Codec* const codec[2], const Coded& coded) {
    const size_t heads = h_.geometry.kv_heads;
    for (int kv = 0; kv < 2; ++kv) {
      const size_t code_bytes = codec[kv]->code_bytes();
      const uint64_t tokens = LayerTokens(h_, layer);
      for (uint64_t t0 = 0; t0 < tokens; t0 += h_.token_block) {
        const uint64_t count = std::min<uint64_t>(h_.token_block, tokens - t0);
        const size_t payload = heads * count * code_bytes;
        AlignedBuffer buf = chunks_.TakeBuffer();
        TQKV_RETURN_IF_ERROR(buf.TryReserve(payload));
        const auto tc = Clock::now();
        for (size_t h = 0; h < heads; ++h) {
          TQKV_RETURN_IF_ERROR(codec[kv]->Encode(
              HeadBase(coded, kv, t0, h), coded.dtype[kv], count, Row(), Meta(codec, kv, h),
              {buf.data() + h * count * code_bytes, count * code_bytes}, pool_));
        }
        encode_seconds_ += Since(tc);
        ChunkEntry entry = LayerChunk(ChunkType::kCodes, layer);
        entry.kv = static_cast<uint8_t>(kv);
        entry.token_begin = t0;
        entry.token_count = count;
        TQKV_RETURN_IF_ERROR(chunks_.Push(entry, std::move(buf), payload));
      }
    }
    return Status::Ok();
  }

  // K then V; per range head-major [kv_head][token][head_dim], source dtype.
  Status WriteExactRows(uint32_t layer, const void* const tensors[2]) {
    const uint64_t exact_rows = uint64_t{h_.exact_head} + h_.exact_tail;
    if (exact_rows == 0) return Status::Ok();
    const size_t heads = h_.geometry.kv_heads;
    const size_t vec = size_t{h_.geometry.head_dim} * DTypeSize(h_.source_dtype);
    const size_t payload = 2 * exact_rows * heads * vec;
    AlignedBuffer buf = chunks_.TakeBuffer();
    TQKV_RETURN_IF_ERROR(buf.TryReserve(payload));
    const Coded source{{tensors[0], tensors[1]}, {h_.source_dtype, h_.source_dtype}};
    uint8_t* out = buf.data();
    for (int kv = 0; kv < 2; ++kv) {
      for (const TokenRange& range : ExactRanges(h_, layer)) {
        for (size_t h = 0; h < heads; ++h) {
          for (uint64_t t = range.begin; t < range.begin + range.count; ++t, out += vec) {
            std::memcpy(out, HeadBase(source, kv, t, h), vec);
          }
        }
      }
    }
    return chunks_.Push(LayerChunk(ChunkType::kExactRows, layer), std::move(buf), payload);
  }

  const ContainerHeader& h_;
  const SessionCodecs& codecs_;
  ChunkWriterThread& chunks_;
  AlignedBuffer& residual_;
  ThreadPool* pool_;
  std::vector<uint8_t> metas_;
  double encode_seconds_ = 0;
};

}  // namespace

Result<CheckpointStats> Checkpoint(KvSource& source, const CheckpointOptions& given, Store& store,
                                   std::string_view key) {
  const auto t0 = Clock::now();
  // auto:B plans with kAllocatorPlanCodec in place of the codecs it will choose (as
  // ParseKvCodecSpec gives it), whatever the options hold.
  CheckpointOptions planned_options;
  if (given.allocate_bits > 0) {
    planned_options = given;
    planned_options.codec = ParseCodecSpec(kAllocatorPlanCodec).value();
    planned_options.v_codec.reset();
  }
  const CheckpointOptions& options = given.allocate_bits > 0 ? planned_options : given;
  const ModelGeometry g = source.geometry();
  TQKV_RETURN_IF_ERROR(ValidateGeometry(g).WithContext("checkpoint"));
  TQKV_ASSIGN_OR_RETURN(SessionCodecs codecs,
                        ResolveSessionCodecs(options, g));
  ContainerHeader header = PlanHeader(source, options, codecs);
  const DType dtype = source.dtype();
  const uint64_t tokens = header.tokens;
  const bool in_memory = source.InMemory();
  // Whatever can be refused is refused before the store sees the key, so nothing is left in it:
  // the header, the sizes (checked, they come from the user) and the layer buffers.
  const auto refuse = [&](const Status& s) {
    return s.WithContext("checkpoint " + std::string(key));
  };
  AlignedBuffer layer_k, layer_v;
  auto layer_bytes = SizeProduct("layer tensor (tokens x KV heads x head_dim x dtype)",
                                 {tokens, g.kv_heads, g.head_dim, DTypeSize(dtype)});
  if (!layer_bytes.ok()) return refuse(layer_bytes.status());
  if (Status s = format::ValidateHeader(header); !s.ok()) return refuse(s);
  if (!in_memory) {
    Status s = layer_k.TryReserve(*layer_bytes);
    if (s.ok()) s = layer_v.TryReserve(*layer_bytes);
    if (!s.ok()) return refuse(s);
  }
  AlignedBuffer residual_buf;  // a layer's mean-removed keys, f32
  if (header.key_mean_block != 0) {
    auto bytes = SizeProduct("mean-removed keys (tokens x KV heads x head_dim x f32)",
                             {tokens, g.kv_heads, g.head_dim, 4});
    Status s = bytes.ok() ? residual_buf.TryReserve(*bytes) : bytes.status();
    if (!s.ok()) return refuse(s);
  }

  // A layer's tensors: the source's own where it holds them, or read into the layer buffers.
  double source_seconds = 0;
  const auto layer_tensors = [&](uint32_t layer, const void* tensors[2]) -> Status {
    if (in_memory) {
      std::tie(tensors[0], tensors[1]) = source.LayerInMemory(layer);
      return Status::Ok();
    }
    const auto ts = Clock::now();
    TQKV_RETURN_IF_ERROR(source.ReadLayer(layer, layer_k.data(), layer_v.data()));
    source_seconds += Since(ts);
    tensors[0] = layer_k.data();
    tensors[1] = layer_v.data();
    return Status::Ok();
  };
  CheckpointStats stats;
  if (options.allocate_bits > 0) {
    const auto tg = Clock::now();
    if (Status s = AllocateCodecs(source, options, layer_tensors,
                                  reinterpret_cast<float*>(residual_buf.data()), codecs, header,
                                  stats);
        !s.ok()) {
      return refuse(s);
    }
    stats.guard_seconds = Since(tg);
    stats.guard_stride = header.guard_stride;
    stats.codec_error = header.codec_error;
    stats.guard_exceeded = GuardExceeded(header.codec_error, options.guard_threshold);
  } else if (options.guard && tokens > 0 && AnyLossyCodec(options)) {
    // (Raw codecs have no error worth measuring: a second pass over the source for nothing.)
    const auto tg = Clock::now();
    header.guard_stride = GuardStride(tokens);
    auto measured = MeasureCodecErrors(
        header, header.guard_stride, layer_tensors,
        [&](uint32_t layer, int kv) { return std::vector<const Codec*>{&codecs.of(layer, kv)}; },
        reinterpret_cast<float*>(residual_buf.data()), options.pool);
    if (!measured.ok()) return refuse(measured.status());
    for (const auto& layer : *measured) {
      for (const auto& kv : layer) header.codec_error.push_back(kv.front());
    }
    stats.guard_seconds = Since(tg);
    stats.guard_stride = header.guard_stride;
    stats.codec_error = header.codec_error;
    stats.guard_exceeded = GuardExceeded(header.codec_error, options.guard_threshold);
  }
  {
    if (options.strict && !stats.guard_exceeded.empty()) {
      return refuse(Status::InvalidArgument(
          "refused by the guard (--strict): the codec's error exceeds " +
          FormatGuardFigure(options.guard_threshold) + " of the varying part in " +
          DescribeGuardExceeded(header.codec_error, stats.guard_exceeded,
                                options.guard_threshold) +
          "; try the default key means, more bits or --layer-codec L:SPEC for those layers"));
    }
  }

  TQKV_ASSIGN_OR_RETURN(std::unique_ptr<WritableObject> object, store.Create(key));
  auto created = ContainerWriter::Create(object.get(), header);
  if (!created.ok()) {
    (void)object->Abort();
    return refuse(created.status());
  }
  std::unique_ptr<ContainerWriter> writer = std::move(created).value();

  ChunkWriterThread chunk_writer(writer.get(), 2);
  LayerWriter layers(header, codecs, chunk_writer, residual_buf, options.pool);
  Status status;
  for (uint32_t layer = 0; layer < g.layers && status.ok(); ++layer) {
    const void* tensors[2];
    status = layer_tensors(layer, tensors);
    if (status.ok()) status = layers.Write(layer, tensors);
  }
  stats.source_seconds = source_seconds;
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
  stats.encode_seconds = layers.encode_seconds();
  stats.bytes_written = writer->BytesWritten();
  stats.fp16_bytes = SessionTensorBytes(header, DType::kF16);
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
