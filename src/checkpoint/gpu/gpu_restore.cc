// RestoreToGpu and RestoreIntoGpu: the chunk loop (verified chunks, chunk_loop.h) into the device
// sink (device_sink.h) over the CUDA device (cuda_device.h): reads into pinned host slots + H2D
// copies, or cuFile into device slots, decode kernels into the destination's device tensors (the
// library's own or the caller's, device_destination.h), with a reader thread running ahead, the
// copy and decode streams overlapping across chunks and an event per layer.
#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "checkpoint/chunk_loop.h"
#include "checkpoint/destination.h"
#include "checkpoint/device_sink.h"
#include "checkpoint/gpu/cuda_device.h"
#include "checkpoint/gpu/device_destination.h"
#include "cuda/common.h"
#include "tqkv/container.h"
#include "tqkv/gpu.h"
#include "tqkv/kv_layout.h"

#include <nlohmann/json.hpp>

namespace tqkv {
namespace {

// The local file behind `key` and its directory (for the O_DIRECT probe and cuFile), or empty
// ones when the store has no local files.
struct LocalFile {
  std::string dir, path;
};
LocalFile LocalFileOf(const Store& store, std::string_view key) {
  return {store.LocalRoot().value_or(""), store.LocalPath(key).value_or("")};
}

// The I/O rung: the forced one (refused when unusable, except direct, where the store falls
// back itself) or the probe's first usable one; the rungs above it go to stats.skipped.
Result<GpuIoPath> ChooseIoPath(const GpuProbe& probe, const GpuRestoreOptions& options,
                               GpuRestoreStats& stats) {
  if (!options.io) {
    for (const GpuRung& r : probe.rungs) {
      if (r.path == *probe.chosen) break;
      stats.skipped.push_back(std::string(GpuIoPathName(r.path)) + ": " + r.reason);
    }
    return *probe.chosen;
  }
  const GpuIoPath path = *options.io;
  const GpuRung& r = probe.rungs[static_cast<size_t>(path)];
  if (!r.usable && path != GpuIoPath::kDirect) {
    return Status::Unsupported("GPU I/O path " + std::string(GpuIoPathName(path)) +
                               " unusable: " + r.reason);
  }
  if (!r.usable) stats.skipped.push_back(std::string(GpuIoPathName(path)) + ": " + r.reason);
  return path;
}

// Per-layer events of one restore, created once the header says how many layers there are.
struct LayerEvents {
  std::vector<cudaEvent_t> events;
  ~LayerEvents() {
    for (cudaEvent_t e : events) cudaEventDestroy(e);
  }
  Status Create(uint32_t layers) {
    for (uint32_t l = 0; l < layers; ++l) {
      cudaEvent_t e;
      TQKV_CUDA_RETURN_IF_ERROR(cudaEventCreate(&e));
      events.push_back(e);
    }
    return Status::Ok();
  }
};

// Device tensors the library owns (RestoreToGpu), canonical, and their layer events.
class GpuSessionImpl final : public GpuSession {
 public:
  ~GpuSessionImpl() override {
    for (void* p : tensors_) cudaFree(p);
  }
  const ModelGeometry& geometry() const override { return stats_.geometry; }
  uint64_t tokens() const override { return stats_.tokens; }
  DType dtype() const override { return dtype_; }
  void* tensor(uint32_t layer, int kv) const override { return tensors_[2 * layer + kv]; }
  void* layer_event(uint32_t layer) const override { return events_.events[layer]; }
  Status WaitLayer(uint32_t layer) const override {
    TQKV_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(events_.events[layer]));
    return Status::Ok();
  }
  const GpuRestoreStats& stats() const override { return stats_; }

  // Canonical tensors for `h` of `dtype`, as the destination of the restore.
  Result<LayoutTensors> Allocate(const ContainerHeader& h, DType dtype) {
    dtype_ = dtype;
    LayoutTensors t;
    t.geometry = h.geometry;
    t.dtype = dtype;
    t.tokens = h.tokens;
    t.layout = KvLayout::Canonical(h.geometry);
    t.tensor_elems = h.tokens * h.geometry.token_elems();
    for (uint32_t i = 0; i < 2 * h.geometry.layers; ++i) {
      void* p = nullptr;
      TQKV_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, std::max<size_t>(t.tensor_elems * DTypeSize(dtype), 1)));
      tensors_.push_back(p);
      (i % 2 == 0 ? t.k : t.v).push_back(p);
    }
    return t;
  }

  DType dtype_ = DType::kF16;
  std::vector<void*> tensors_;  // [layer * 2 + kv]
  LayerEvents events_;
  GpuRestoreStats stats_;
};

using MakeDeviceDestination = std::function<Result<LayoutTensors>(const ContainerHeader&)>;

// The one GPU restore: probe, open, the destination `make` lays out once the header is known
// (checked by CheckDeviceDestination), then the chunk loop into the device sink; `events` gets
// one event per layer.
Status RunGpuRestore(Store& store, std::string_view key, const GpuRestoreOptions& options,
                     const MakeDeviceDestination& make, LayerEvents& events,
                     GpuRestoreStats& stats) {
  const auto t0 = RestoreClock::now();
  const std::string name(key);
  const LocalFile local = LocalFileOf(store, key);
  GpuProbeOptions popts;
  popts.dir = local.dir;
  popts.cufile_libraries = options.cufile_libraries;
  const GpuProbe probe = ProbeGpuLadder(popts);
  if (probe.device_count == 0) return Status::DeviceError(probe.device_error);
  if (options.device < 0 || options.device >= probe.device_count) {
    return Status::InvalidArgument("GPU restore: device " + std::to_string(options.device) +
                                   " of " + std::to_string(probe.device_count));
  }
  TQKV_ASSIGN_OR_RETURN(GpuIoPath path, ChooseIoPath(probe, options, stats));
  TQKV_CUDA_RETURN_IF_ERROR(cudaSetDevice(options.device));

  TQKV_ASSIGN_OR_RETURN(std::unique_ptr<ReadableObject> object, store.Open(key));
  const uint64_t read_before = object->BytesRead();
  TQKV_ASSIGN_OR_RETURN(std::unique_ptr<ContainerReader> reader,
                        ContainerReader::Open(object.get(), name));
  const ContainerHeader& h = reader->header();
  if (options.expect_model && h.model != *options.expect_model) {
    return Status::InvalidArgument(name + " holds model '" + h.model + "', expected '" +
                                   *options.expect_model + "'");
  }
  TQKV_RETURN_IF_ERROR(RefuseRagged(h, "GPU restore of " + name));  // before any device memory
  TQKV_ASSIGN_OR_RETURN(LayoutTensors dst, make(h));
  TQKV_RETURN_IF_ERROR(gpu::CheckDeviceDestination(dst, h, name));
  TQKV_RETURN_IF_ERROR(events.Create(h.geometry.layers));
  TQKV_ASSIGN_OR_RETURN(DevicePlan plan, MakeDevicePlan(h));
  ChunkLoopOptions loop;
  loop.inflight_bytes = options.inflight_bytes;
  loop.max_slots = 32;
  loop.reader_thread_init = [device = options.device] { cudaSetDevice(device); };
  gpu::CudaRestoreDevice device;
  gpu::CudaRestoreDevice::Config config;
  config.header = &h;
  config.plan = &plan;
  config.dst = &dst;
  config.layer_events = &events.events;
  config.options = &options;
  std::tie(config.slots, config.slot_bytes) = ChunkLoopSlots(*reader, loop);
  TQKV_RETURN_IF_ERROR(device.Init(config, name));
  if (path == GpuIoPath::kGds) {
    Status st = local.path.empty() ? Status::Unsupported("gds needs a file:// store")
                                   : device.OpenGds(local.path, options.cufile_libraries);
    if (!st.ok()) {
      if (options.io) return st;
      stats.skipped.push_back("gds: " + st.message());
      path = probe.rungs[1].usable ? GpuIoPath::kDirect : GpuIoPath::kBuffered;
    }
  }
  if (path == GpuIoPath::kGds) loop.read = device.GdsRead(*reader, name);
  stats.path = path;
  const StoreCaps caps = store.Caps();
  stats.host_io = path == GpuIoPath::kGds ? "cufile"
                                          : std::string(IoModeName(caps.io_mode)) +
                                                (caps.io_fell_back ? " (fell back)" : "");

  const double t_start = SecondsSince(t0);
  TQKV_RETURN_IF_ERROR(device.Start());
  ChunkLoopStats ls;
  TQKV_RETURN_IF_ERROR(RunDeviceRestore(*reader, plan, device, loop, name, &ls));
  TQKV_RETURN_IF_ERROR(device.Finish());
  stats.read_busy_seconds = ls.read_busy_seconds;
  stats.seconds = SecondsSince(t0);
  stats.copy_seconds = device.copy_seconds();
  stats.decode_seconds = device.decode_seconds();
  if (h.geometry.layers > 0) stats.first_layer_seconds = t_start + device.first_layer_seconds();
  stats.setup_seconds = t_start;
  stats.bytes_read = object->BytesRead() - read_before + device.cufile_bytes();
  if (stats.bytes_read == 0) stats.bytes_read = reader->file_bytes();
  stats.tokens = h.tokens;
  stats.model = h.model;
  stats.geometry = h.geometry;
  stats.fp16_bytes = SessionTensorBytes(h, DType::kF16);
  return Status::Ok();
}

}  // namespace

Result<IoMode> GpuStoreIo(std::string_view io) {
  TQKV_ASSIGN_OR_RETURN(GpuIoPath path, ParseGpuIoPath(io));
  if (path == GpuIoPath::kBuffered) return IoMode::kBuffered;
  return io == "uring" ? IoMode::kUring : IoMode::kDirect;
}

Result<std::unique_ptr<GpuSession>> RestoreToGpu(Store& store, std::string_view key,
                                                 const GpuRestoreOptions& options) {
  // Refused before the probe, the open and any device memory.
  TQKV_RETURN_IF_ERROR(gpu::CheckDeviceDType(options.dtype, key));
  auto session = std::make_unique<GpuSessionImpl>();
  GpuSessionImpl* s = session.get();
  TQKV_RETURN_IF_ERROR(RunGpuRestore(
      store, key, options,
      [s, &options](const ContainerHeader& h) { return s->Allocate(h, options.dtype); },
      s->events_, s->stats_));
  return std::unique_ptr<GpuSession>(std::move(session));
}

Result<GpuRestoreStats> RestoreIntoGpu(Store& store, std::string_view key, const LayoutTensors& dst,
                                       const GpuRestoreOptions& options) {
  LayerEvents events;  // the caller has waited on them (or not) by the time they go
  GpuRestoreStats stats;
  TQKV_RETURN_IF_ERROR(RunGpuRestore(
      store, key, options, [&dst](const ContainerHeader&) { return Result<LayoutTensors>(dst); },
      events, stats));
  return stats;
}

Status RestoreBatchIntoGpu(Store& store, std::span<const BatchObject> objects,
                           const LayoutTensors& dst, const GpuRestoreOptions& options,
                           BatchStats* stats) {
  const auto t0 = RestoreClock::now();
  BatchStats st;
  Status error;
  for (size_t i = 0; i < objects.size(); ++i) {
    const BatchObject& o = objects[i];
    LayoutTensors mine = dst;
    mine.SetBlockIds(o.block_ids);
    if (o.tokens != 0) mine.tokens = o.tokens;
    GpuRestoreOptions opts = options;
    if (!o.model.empty()) opts.expect_model = o.model;
    if (i + 1 < objects.size()) opts.on_layer = nullptr;  // the batch's layer: the last object's
    Result<GpuRestoreStats> r = RestoreIntoGpu(store, o.key, mine, opts);
    if (!r.ok()) {
      error = r.status().WithContext("object " + std::to_string(i + 1) + " of " +
                                     std::to_string(objects.size()) + " (" + o.key + ")");
      break;
    }
    st.done = i + 1;
    st.bytes += r->bytes_read;
    st.fp16_bytes += r->fp16_bytes;
    st.tokens += r->tokens;
    if (i == 0) st.first_layer_seconds = SecondsSince(t0);
  }
  st.seconds = SecondsSince(t0);
  if (stats != nullptr) *stats = st;
  return error;
}

std::string GpuRestoreStats::ToJson() const {
  nlohmann::json j = {{"path", GpuIoPathName(path)},
                      {"host_io", host_io},
                      {"skipped", skipped},
                      {"bytes_read", bytes_read},
                      {"fp16_bytes", fp16_bytes},
                      {"tokens", tokens},
                      {"model", model},
                      {"seconds", seconds},
                      {"setup_s", setup_seconds},
                      {"read_busy_s", read_busy_seconds},
                      {"copy_gpu_s", copy_seconds},
                      {"decode_gpu_s", decode_seconds},
                      {"first_layer_s", first_layer_seconds},
                      {"gbps", seconds > 0 ? bytes_read / seconds / 1e9 : 0.0},
                      {"fp16_gbps", seconds > 0 ? fp16_bytes / seconds / 1e9 : 0.0}};
  return j.dump(2);
}

}  // namespace tqkv
