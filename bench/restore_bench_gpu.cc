// GPU rows of `tqkv-bench restore` over RestoreToGpu (src/checkpoint/gpu/gpu_restore.cc).
#include "bench/restore_bench_gpu.h"

#if defined(TQKV_HAVE_CUDA)
#include "tqkv/gpu.h"
#endif

namespace tqkv::bench {

#if defined(TQKV_HAVE_CUDA)

GpuAvailability ProbeGpuForBench(const Store& store) {
  GpuProbeOptions po;
  po.dir = store.LocalRoot().value_or("");
  const GpuProbe p = ProbeGpuLadder(po);
  GpuAvailability a;
  a.probe = nlohmann::json::parse(p.ToJson());
  a.device = p.device;
  if (p.device_count == 0) a.unavailable = p.device_error;
  return a;
}

Status PrepareGpu(uint64_t bytes) {
  TQKV_ASSIGN_OR_RETURN(uint64_t free_bytes, CudaFreeMemory(0));
  if (bytes > free_bytes) {
    return Status::InvalidArgument("GPU rows need " + std::to_string(bytes >> 20) +
                                   " MiB of device memory at once, " +
                                   std::to_string(free_bytes >> 20) +
                                   " MiB free: use fewer --workers or shorter --tokens");
  }
  return Status::Ok();
}

Result<IoMode> GpuStoreIo(const std::string& io) { return tqkv::GpuStoreIo(io); }

Result<GpuRestoreResult> RestoreOnGpu(Store& store, const std::string& key,
                                      const std::string& forced_io) {
  GpuRestoreResult r;
  {
    TQKV_ASSIGN_OR_RETURN(auto object, store.Open(key));
    Status s = object->DropCache();
    if (!s.ok()) {
      r.drop_ok = false;
      r.drop_error = s.ToString();
    }
  }
  GpuRestoreOptions opts;
  opts.dtype = DType::kF16;
  if (!forced_io.empty()) {
    TQKV_ASSIGN_OR_RETURN(GpuIoPath path, ParseGpuIoPath(forced_io));
    opts.io = path;
  }
  TQKV_ASSIGN_OR_RETURN(auto session, RestoreToGpu(store, key, opts));
  const GpuRestoreStats& st = session->stats();
  r.seconds = st.seconds;
  r.bytes_read = st.bytes_read;
  r.gpu.io_used = std::string(GpuIoPathName(st.path));
  r.gpu.host_io = st.host_io;
  r.gpu.skipped = st.skipped;
  r.gpu.first_layer_s = st.first_layer_seconds;
  r.gpu.decode_gpu_s = st.decode_seconds;
  r.gpu.copy_gpu_s = st.copy_seconds;
  r.gpu.read_busy_s = st.read_busy_seconds;
  r.gpu.setup_s = st.setup_seconds;
  return r;  // `session` frees its device memory here
}

#else  // !TQKV_HAVE_CUDA

namespace {
const char kNoCuda[] = "this tqkv was built without CUDA (TQKV_ENABLE_CUDA=OFF)";
}  // namespace

GpuAvailability ProbeGpuForBench(const Store&) {
  GpuAvailability a;
  a.unavailable = kNoCuda;
  return a;
}

Status PrepareGpu(uint64_t) { return Status::Unsupported(kNoCuda); }

Result<IoMode> GpuStoreIo(const std::string&) { return Status::Unsupported(kNoCuda); }

Result<GpuRestoreResult> RestoreOnGpu(Store&, const std::string&, const std::string&) {
  return Status::Unsupported(kNoCuda);
}

#endif

}  // namespace tqkv::bench
