// RestoreToGpu: the chunk loop (verified chunks, chunk_loop.h) into the device sink
// (device_sink.h) over the CUDA device (cuda_device.h): reads into pinned host slots + H2D copies,
// or cuFile into device slots, decode kernels into device tensors, with a reader thread running
// ahead, the copy and decode streams overlapping across chunks and an event per layer.
#include <algorithm>
#include <chrono>
#include <memory>
#include <string>

#include "checkpoint/chunk_loop.h"
#include "checkpoint/device_sink.h"
#include "checkpoint/gpu/cuda_device.h"
#include "cuda/common.h"
#include "tqkv/container.h"
#include "tqkv/gpu.h"

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

}  // namespace

Result<std::unique_ptr<GpuSession>> RestoreToGpu(Store& store, std::string_view key,
                                                 const GpuRestoreOptions& options) {
  const auto t0 = RestoreClock::now();
  const std::string name(key);
  if (options.dtype != DType::kF16 && options.dtype != DType::kBF16 &&
      options.dtype != DType::kF32) {
    return Status::InvalidArgument("RestoreToGpu: output dtype must be f16, bf16 or f32");
  }
  const LocalFile local = LocalFileOf(store, key);
  GpuProbeOptions popts;
  popts.dir = local.dir;
  popts.cufile_libraries = options.cufile_libraries;
  const GpuProbe probe = ProbeGpuLadder(popts);
  if (probe.device_count == 0) return Status::DeviceError(probe.device_error);
  if (options.device < 0 || options.device >= probe.device_count) {
    return Status::InvalidArgument("RestoreToGpu: device " + std::to_string(options.device) +
                                   " of " + std::to_string(probe.device_count));
  }
  auto session = std::make_unique<gpu::GpuSessionImpl>();
  GpuRestoreStats& stats = session->stats_;
  TQKV_ASSIGN_OR_RETURN(GpuIoPath path, ChooseIoPath(probe, options, stats));
  TQKV_CUDA_RETURN_IF_ERROR(cudaSetDevice(options.device));

  TQKV_ASSIGN_OR_RETURN(std::unique_ptr<ReadableObject> object, store.Open(key));
  const uint64_t read_before = object->BytesRead();
  TQKV_ASSIGN_OR_RETURN(std::unique_ptr<ContainerReader> reader,
                        ContainerReader::Open(object.get(), name));
  const ContainerHeader& h = reader->header();
  TQKV_ASSIGN_OR_RETURN(DevicePlan plan, MakeDevicePlan(h));
  ChunkLoopOptions loop;
  loop.inflight_bytes = options.inflight_bytes;
  loop.max_slots = 32;
  loop.reader_thread_init = [device = options.device] { cudaSetDevice(device); };
  gpu::CudaRestoreDevice device;
  gpu::CudaRestoreDevice::Config config;
  config.header = &h;
  config.plan = &plan;
  config.session = session.get();
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
  stats.fp16_bytes = h.geometry.SessionBytes(h.tokens, DType::kF16);
  return std::unique_ptr<GpuSession>(std::move(session));
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
