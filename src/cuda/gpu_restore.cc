// RestoreToGpu: store -> (cuFile into device slots | reads into pinned host slots + H2D copies)
// -> decode kernels into device tensors, with a reader thread running ahead, the copy and decode
// streams overlapping across chunks (events per slot), and an event per layer.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "checkpoint/slot_reader.h"
#include "checkpoint/layout.h"
#include "cuda/common.h"
#include "cuda/cufile.h"
#include "cuda/kernels.h"
#include "cuda/params.h"
#include "tqkv/aligned_buffer.h"
#include "tqkv/container.h"
#include "tqkv/gpu.h"

namespace tqkv {
namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

struct Slot {
  uint8_t* host = nullptr;  // pinned (cudaHostAlloc: page-aligned, so O_DIRECT reads land here)
  uint8_t* dev = nullptr;
  cudaEvent_t copied = nullptr;   // H2D copy into dev done (host slot reusable)
  cudaEvent_t decoded = nullptr;  // consumer of dev done (dev slot reusable)
  const ChunkEntry* entry = nullptr;
};

// Everything allocated on the device or pinned; freed in the destructor in any failure path.
struct Resources {
  std::vector<Slot> slots;
  cudaStream_t copy = nullptr, decode = nullptr;
  std::vector<void*> dev_allocs;
  std::vector<cudaEvent_t> timing;  // pairs (start, end) of copies and decodes
  ~Resources() {
    if (copy) cudaStreamSynchronize(copy);
    if (decode) cudaStreamSynchronize(decode);
    for (Slot& s : slots) {
      if (s.host) cudaFreeHost(s.host);
      if (s.dev) cudaFree(s.dev);
      if (s.copied) cudaEventDestroy(s.copied);
      if (s.decoded) cudaEventDestroy(s.decoded);
    }
    for (void* p : dev_allocs) cudaFree(p);
    for (cudaEvent_t e : timing) cudaEventDestroy(e);
    if (copy) cudaStreamDestroy(copy);
    if (decode) cudaStreamDestroy(decode);
  }
  Result<void*> Malloc(size_t bytes) {
    void* p = nullptr;
    TQKV_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, std::max<size_t>(bytes, 1)));
    dev_allocs.push_back(p);
    return p;
  }
};

class GpuSessionImpl final : public GpuSession {
 public:
  ~GpuSessionImpl() override {
    for (void* p : tensors_) cudaFree(p);
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
  }
  const ModelGeometry& geometry() const override { return stats_.geometry; }
  uint64_t tokens() const override { return stats_.tokens; }
  DType dtype() const override { return dtype_; }
  void* tensor(uint32_t layer, int kv) const override { return tensors_[2 * layer + kv]; }
  void* layer_event(uint32_t layer) const override { return events_[layer]; }
  Status WaitLayer(uint32_t layer) const override {
    TQKV_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(events_[layer]));
    return Status::Ok();
  }
  const GpuRestoreStats& stats() const override { return stats_; }

  DType dtype_ = DType::kF16;
  std::vector<void*> tensors_;
  std::vector<cudaEvent_t> events_;
  GpuRestoreStats stats_;
};

// cuFile state of one restore: the file handle and registered device slots.
struct GdsFile {
  cuda::CuFileApi api;
  int fd = -1;
  void* handle = nullptr;
  bool driver_open = false;
  std::vector<const void*> registered;
  ~GdsFile() {
    for (const void* p : registered) api.BufDeregister(p);
    if (handle) api.HandleDeregister(handle);
    if (fd >= 0) close(fd);
    if (driver_open) api.DriverClose();
  }
};

Status OpenGds(const std::string& path, const std::vector<std::string>& libs,
               std::vector<Slot>& slots, size_t slot_bytes, GdsFile& g) {
  TQKV_ASSIGN_OR_RETURN(g.api, cuda::LoadCuFile(libs));
  cuda::CUfileErrorT e = g.api.DriverOpen();
  if (e.err != 0) return Status::Unsupported("cuFileDriverOpen: " + cuda::CuFileErrorString(e));
  g.driver_open = true;
  g.fd = open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  if (g.fd < 0) return Status::FromErrno("open(O_DIRECT) for cuFile", path, errno);
  cuda::CUfileDescrT descr{};
  descr.type = cuda::kCuFileHandleTypeOpaqueFd;
  descr.handle.fd = g.fd;
  e = g.api.HandleRegister(&g.handle, &descr);
  if (e.err != 0) {
    g.handle = nullptr;
    return Status::Unsupported("cuFileHandleRegister(" + path + "): " + cuda::CuFileErrorString(e));
  }
  for (Slot& s : slots) {
    e = g.api.BufRegister(s.dev, slot_bytes, 0);
    if (e.err != 0) return Status::Unsupported("cuFileBufRegister: " + cuda::CuFileErrorString(e));
    g.registered.push_back(s.dev);
  }
  return Status::Ok();
}

// The directory of a file:// store (for the O_DIRECT probe and cuFile's file path), else empty.
std::string StoreDir(const Store& store) {
  Result<StoreUri> uri = ParseStoreUri(store.Uri());
  if (!uri.ok() || uri->scheme != "file") return {};
  return uri->path;
}

float Elapsed(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0;
  if (cudaEventElapsedTime(&ms, a, b) != cudaSuccess) return 0;
  return ms;
}

}  // namespace

Result<std::unique_ptr<GpuSession>> RestoreToGpu(Store& store, std::string_view key,
                                                 const GpuRestoreOptions& options) {
  const auto t0 = Clock::now();
  const std::string name(key);
  if (options.dtype != DType::kF16 && options.dtype != DType::kBF16 &&
      options.dtype != DType::kF32) {
    return Status::InvalidArgument("RestoreToGpu: output dtype must be f16, bf16 or f32");
  }
  // ---- ladder ----
  const std::string dir = StoreDir(store);
  GpuProbeOptions popts;
  popts.dir = dir;
  popts.cufile_libraries = options.cufile_libraries;
  const GpuProbe probe = ProbeGpuLadder(popts);
  if (probe.device_count == 0) return Status::DeviceError(probe.device_error);
  if (options.device < 0 || options.device >= probe.device_count) {
    return Status::InvalidArgument("RestoreToGpu: device " + std::to_string(options.device) +
                                   " of " + std::to_string(probe.device_count));
  }
  auto session = std::make_unique<GpuSessionImpl>();
  GpuRestoreStats& stats = session->stats_;
  GpuIoPath path;
  if (options.io) {
    path = *options.io;
    const GpuRung& r = probe.rungs[static_cast<size_t>(path)];
    if (!r.usable && path != GpuIoPath::kDirect) {
      return Status::Unsupported("GPU I/O path " + std::string(GpuIoPathName(path)) +
                                 " unusable: " + r.reason);
    }
    // direct on a store that cannot do O_DIRECT: the store itself falls back, reported in host_io.
    if (!r.usable) stats.skipped.push_back(std::string(GpuIoPathName(path)) + ": " + r.reason);
  } else {
    path = *probe.chosen;
    for (const GpuRung& r : probe.rungs) {
      if (r.path == path) break;
      stats.skipped.push_back(std::string(GpuIoPathName(r.path)) + ": " + r.reason);
    }
  }
  TQKV_CUDA_RETURN_IF_ERROR(cudaSetDevice(options.device));

  // ---- container ----
  TQKV_ASSIGN_OR_RETURN(std::unique_ptr<ReadableObject> object, store.Open(key));
  const uint64_t read_before = object->BytesRead();
  TQKV_ASSIGN_OR_RETURN(std::unique_ptr<ContainerReader> reader,
                        ContainerReader::Open(object.get(), name));
  const ContainerHeader& h = reader->header();
  const auto& chunks = reader->chunks();
  const ModelGeometry& geo = h.geometry;
  std::vector<cuda::PackedCodec> packed;
  for (const CodecParams& cp : h.codecs) {
    Result<cuda::PackedCodec> pc = cuda::PackCodecParams(cp);
    if (!pc.ok()) return Status(pc.status().code(), name + ": " + pc.status().message());
    packed.push_back(std::move(*pc));
  }
  // Exact rows (format version 2) are copied like a raw codec of the source dtype; it goes last.
  {
    TQKV_ASSIGN_OR_RETURN(std::unique_ptr<Codec> exact_codec, ExactRowsCodec(h));
    TQKV_ASSIGN_OR_RETURN(cuda::PackedCodec pe, cuda::PackCodecParams(exact_codec->params()));
    packed.push_back(std::move(pe));
  }
  const uint32_t out_dtype = cuda::ToGpuDType(options.dtype);
  const size_t esize = DTypeSize(options.dtype);

  Resources res;
  TQKV_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&res.copy, cudaStreamNonBlocking));
  TQKV_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&res.decode, cudaStreamNonBlocking));
  for (cuda::PackedCodec& pc : packed) {
    const size_t bytes = pc.table.size() * sizeof(float);
    TQKV_ASSIGN_OR_RETURN(void* t, res.Malloc(bytes));
    if (bytes) TQKV_CUDA_RETURN_IF_ERROR(cudaMemcpy(t, pc.table.data(), bytes, cudaMemcpyHostToDevice));
    pc.params.table = static_cast<const float*>(t);
  }
  // Group metadata of every layer (small): [layer][kv][head][meta_bytes] at meta_at[layer].
  std::vector<size_t> meta_at(geo.layers, 0);
  size_t meta_total = 0;
  for (uint32_t l = 0; l < geo.layers; ++l) {
    meta_at[l] = meta_total;
    meta_total += 2ull * geo.kv_heads * packed[h.layer_codec[l]].params.meta_bytes;
  }
  TQKV_ASSIGN_OR_RETURN(void* dmeta_v, res.Malloc(meta_total));
  auto* dmeta = static_cast<uint8_t*>(dmeta_v);

  // ---- outputs ----
  const bool paged = options.block_size > 0;
  uint64_t rows = h.tokens;
  int32_t* dblocks = nullptr;
  if (paged) {
    const uint64_t need = (h.tokens + options.block_size - 1) / options.block_size;
    if (options.block_ids.size() < need) {
      return Status::InvalidArgument("RestoreToGpu: " + std::to_string(options.block_ids.size()) +
                                     " block ids for " + std::to_string(need) + " blocks");
    }
    int32_t max_id = -1;
    for (uint64_t i = 0; i < need; ++i) {
      if (options.block_ids[i] < 0) return Status::InvalidArgument("RestoreToGpu: negative block id");
      max_id = std::max(max_id, options.block_ids[i]);
    }
    rows = static_cast<uint64_t>(max_id + 1) * options.block_size;
    TQKV_ASSIGN_OR_RETURN(void* b, res.Malloc(need * sizeof(int32_t)));
    dblocks = static_cast<int32_t*>(b);
    TQKV_CUDA_RETURN_IF_ERROR(cudaMemcpy(dblocks, options.block_ids.data(), need * sizeof(int32_t),
                                         cudaMemcpyHostToDevice));
  }
  const size_t tensor_bytes = rows * geo.token_elems() * esize;
  session->dtype_ = options.dtype;
  for (uint32_t i = 0; i < 2 * geo.layers; ++i) {
    void* p = nullptr;
    TQKV_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, std::max<size_t>(tensor_bytes, 1)));
    session->tensors_.push_back(p);
  }
  for (uint32_t l = 0; l < geo.layers; ++l) {
    cudaEvent_t e;
    TQKV_CUDA_RETURN_IF_ERROR(cudaEventCreate(&e));
    session->events_.push_back(e);
  }

  // ---- slots ----
  uint64_t max_chunk = kContainerAlignment;
  for (const auto& e : chunks) max_chunk = std::max(max_chunk, AlignUp(e.size, kContainerAlignment));
  const size_t nslots = std::clamp<size_t>(options.inflight_bytes / max_chunk, 2, 32);
  res.slots.resize(nslots);
  for (Slot& s : res.slots) {
    TQKV_CUDA_RETURN_IF_ERROR(cudaHostAlloc(reinterpret_cast<void**>(&s.host), max_chunk,
                                            cudaHostAllocDefault));
    TQKV_CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&s.dev), max_chunk));
    TQKV_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&s.copied, cudaEventDisableTiming));
    TQKV_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&s.decoded, cudaEventDisableTiming));
  }
  GdsFile gds;
  if (path == GpuIoPath::kGds) {
    Status st = dir.empty() ? Status::Unsupported("gds needs a file:// store")
                            : OpenGds(dir + "/" + name + ".tqkv", options.cufile_libraries,
                                      res.slots, max_chunk, gds);
    if (!st.ok()) {
      if (options.io) return st;
      stats.skipped.push_back("gds: " + st.message());
      path = probe.rungs[1].usable ? GpuIoPath::kDirect : GpuIoPath::kBuffered;
    }
  }
  stats.path = path;
  const StoreCaps caps = store.Caps();
  stats.host_io = path == GpuIoPath::kGds ? "cufile"
                                          : std::string(IoModeName(caps.io_mode)) +
                                                (caps.io_fell_back ? " (fell back)" : "");

  const uint64_t file = reader->file_bytes();
  auto extent = [&](const ChunkEntry& e) {
    return static_cast<size_t>(std::min<uint64_t>(AlignUp(e.size, kContainerAlignment), file - e.offset));
  };
  SlotReader::ReadFn read_fn;
  std::atomic<uint64_t> cufile_bytes{0};  // cuFile reads bypass `object`'s byte count
  if (path == GpuIoPath::kGds) {
    // cuFileRead into the registered device slot, then a D2H copy of the payload for the checksum
    // (the container's XXH3 is verified on the host; see docs/gpu.md).
    read_fn = [&](const std::vector<size_t>& batch, size_t first) -> Status {
      for (size_t i = 0; i < batch.size(); ++i) {
        const ChunkEntry& e = chunks[first + i];
        Slot& s = res.slots[batch[i]];
        s.entry = &e;
        const size_t len = extent(e);
        size_t done = 0;
        while (done < len) {
          const ssize_t r = gds.api.Read(gds.handle, s.dev, len - done, static_cast<off_t>(e.offset + done),
                                         static_cast<off_t>(done));
          if (r <= 0) {
            return Status::IoError(name + ": cuFileRead at offset " + std::to_string(e.offset + done) +
                                   " returned " + std::to_string(r));
          }
          done += static_cast<size_t>(r);
        }
        cufile_bytes += len;
        TQKV_CUDA_RETURN_IF_ERROR(cudaMemcpy(s.host, s.dev, e.size, cudaMemcpyDeviceToHost));
        TQKV_RETURN_IF_ERROR(reader->VerifyChunk(e, {s.host, static_cast<size_t>(e.size)}));
      }
      return Status::Ok();
    };
  } else {
    read_fn = [&](const std::vector<size_t>& batch, size_t first) -> Status {
      std::vector<ReadRequest> reqs;
      for (size_t i = 0; i < batch.size(); ++i) {
        const ChunkEntry& e = chunks[first + i];
        Slot& s = res.slots[batch[i]];
        s.entry = &e;
        reqs.push_back(ReadRequest{e.offset, {s.host, extent(e)}});
      }
      TQKV_RETURN_IF_ERROR(object->ReadBatch(reqs));
      for (size_t i = 0; i < batch.size(); ++i) {
        const ChunkEntry& e = chunks[first + i];
        TQKV_RETURN_IF_ERROR(reader->VerifyChunk(e, {res.slots[batch[i]].host, static_cast<size_t>(e.size)}));
      }
      return Status::Ok();
    };
  }

  cudaEvent_t start_ev, end_ev;
  TQKV_CUDA_RETURN_IF_ERROR(cudaEventCreate(&start_ev));
  res.timing.push_back(start_ev);
  TQKV_CUDA_RETURN_IF_ERROR(cudaEventCreate(&end_ev));
  res.timing.push_back(end_ev);
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> copy_times, decode_times;
  auto timing_pair = [&]() -> Result<std::pair<cudaEvent_t, cudaEvent_t>> {
    cudaEvent_t a, b;
    TQKV_CUDA_RETURN_IF_ERROR(cudaEventCreate(&a));
    res.timing.push_back(a);
    TQKV_CUDA_RETURN_IF_ERROR(cudaEventCreate(&b));
    res.timing.push_back(b);
    return std::make_pair(a, b);
  };
  const double t_start = Since(t0);
  TQKV_CUDA_RETURN_IF_ERROR(cudaEventRecord(start_ev, res.decode));

  {
    const int device = options.device;
    SlotReader slot_reader(nslots, chunks.size(), read_fn, [device] { cudaSetDevice(device); });
    std::deque<size_t> pending;  // slots handed to the GPU, not yet released to the reader
    auto release_oldest = [&]() -> Status {
      const size_t s = pending.front();
      pending.pop_front();
      // Host slot reuse needs the copy done; device slot reuse is ordered by the streams, except
      // for cuFile, which writes the device slot from the reader thread: wait for its decode.
      TQKV_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(
          path == GpuIoPath::kGds ? res.slots[s].decoded : res.slots[s].copied));
      slot_reader.Release(s);
      return Status::Ok();
    };
    const size_t max_pending = std::max<size_t>(1, nslots / 2);
    // Where layer `layer`'s K (kv 0) or V (kv 1) rows go.
    auto dst_of = [&](uint32_t layer, int kv) {
      cuda::GpuDst dst{};
      dst.base = session->tensors_[2 * layer + kv];
      dst.block_ids = dblocks;
      dst.paged = paged ? 1u : 0u;
      dst.block_size = options.block_size;
      dst.kv_heads = geo.kv_heads;
      dst.head_dim = geo.head_dim;
      dst.dtype = out_dtype;
      return dst;
    };
    for (size_t i = 0; i < chunks.size(); ++i) {
      while (pending.size() >= max_pending) TQKV_RETURN_IF_ERROR(release_oldest());
      TQKV_ASSIGN_OR_RETURN(size_t si, slot_reader.Next());
      Slot& s = res.slots[si];
      const ChunkEntry& e = *s.entry;
      const cuda::PackedCodec& pc = packed[h.layer_codec[e.layer]];
      if (path != GpuIoPath::kGds) {
        // The previous decode reading this device slot must finish before the copy overwrites it.
        TQKV_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(res.copy, s.decoded, 0));
        TQKV_ASSIGN_OR_RETURN(auto ct, timing_pair());
        TQKV_CUDA_RETURN_IF_ERROR(cudaEventRecord(ct.first, res.copy));
        TQKV_CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(s.dev, s.host, e.size, cudaMemcpyHostToDevice, res.copy));
        TQKV_CUDA_RETURN_IF_ERROR(cudaEventRecord(ct.second, res.copy));
        copy_times.push_back(ct);
        TQKV_CUDA_RETURN_IF_ERROR(cudaEventRecord(s.copied, res.copy));
        TQKV_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(res.decode, s.copied, 0));
      }
      if (e.type == ChunkType::kGroupMeta) {
        if (e.size != 2ull * geo.kv_heads * pc.params.meta_bytes) {
          return Status::Corruption(name + ": layer " + std::to_string(e.layer) +
                                    " group metadata has " + std::to_string(e.size) + " bytes");
        }
        TQKV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dmeta + meta_at[e.layer], s.dev, e.size,
                                                  cudaMemcpyDeviceToDevice, res.decode));
      } else if (e.type == ChunkType::kExactRows) {
        // After the layer's codes on the same stream, so these rows overwrite the decoded ones.
        const cuda::PackedCodec& pe = packed.back();
        const uint8_t* src = s.dev;
        for (int kv = 0; kv < 2; ++kv) {
          const cuda::GpuDst dst = dst_of(e.layer, kv);
          for (const TokenRange& range : ExactRanges(h)) {
            if (range.count == 0) continue;
            const auto count = static_cast<uint32_t>(range.count);
            TQKV_CUDA_RETURN_IF_ERROR(cuda::LaunchRawCopy(pe.params, src, geo.kv_heads, range.begin,
                                                          count, dst, res.decode));
            src += uint64_t{geo.kv_heads} * count * pe.params.code_bytes;
          }
        }
      } else {
        const cuda::GpuDst dst = dst_of(e.layer, e.kv);
        TQKV_ASSIGN_OR_RETURN(auto dt, timing_pair());
        TQKV_CUDA_RETURN_IF_ERROR(cudaEventRecord(dt.first, res.decode));
        const uint8_t* masks =
            pc.params.meta_bytes ? dmeta + meta_at[e.layer] +
                                       static_cast<size_t>(e.kv) * geo.kv_heads * pc.params.meta_bytes
                                 : nullptr;
        const auto count = static_cast<uint32_t>(e.token_count);
        TQKV_CUDA_RETURN_IF_ERROR(
            pc.params.kind == cuda::kGpuRaw
                ? cuda::LaunchRawCopy(pc.params, s.dev, geo.kv_heads, e.token_begin, count, dst,
                                      res.decode)
                : cuda::LaunchDecode(pc.params, s.dev, masks, geo.kv_heads, e.token_begin, count,
                                     dst, res.decode));
        TQKV_CUDA_RETURN_IF_ERROR(cudaEventRecord(dt.second, res.decode));
        decode_times.push_back(dt);
      }
      TQKV_CUDA_RETURN_IF_ERROR(cudaEventRecord(s.decoded, res.decode));
      pending.push_back(si);
      const bool layer_end = i + 1 == chunks.size() || chunks[i + 1].layer != e.layer;
      if (layer_end) {
        TQKV_CUDA_RETURN_IF_ERROR(cudaEventRecord(session->events_[e.layer], res.decode));
        if (options.on_layer) options.on_layer(e.layer, session->events_[e.layer]);
      }
    }
    while (!pending.empty()) TQKV_RETURN_IF_ERROR(release_oldest());
    TQKV_CUDA_RETURN_IF_ERROR(cudaEventRecord(end_ev, res.decode));
    TQKV_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(res.decode));
    TQKV_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(res.copy));
    stats.read_busy_seconds = slot_reader.busy_seconds();
  }
  stats.seconds = Since(t0);
  for (const auto& p : copy_times) stats.copy_seconds += Elapsed(p.first, p.second) / 1e3;
  for (const auto& p : decode_times) stats.decode_seconds += Elapsed(p.first, p.second) / 1e3;
  if (geo.layers > 0) {
    stats.first_layer_seconds = t_start + Elapsed(start_ev, session->events_[0]) / 1e3;
  }
  stats.setup_seconds = t_start;
  stats.bytes_read = object->BytesRead() - read_before + cufile_bytes.load();
  if (stats.bytes_read == 0) stats.bytes_read = file;
  stats.tokens = h.tokens;
  stats.model = h.model;
  stats.geometry = geo;
  stats.fp16_bytes = geo.SessionBytes(h.tokens, DType::kF16);
  return std::unique_ptr<GpuSession>(std::move(session));
}

}  // namespace tqkv
