// Restores into CUDA arrays (torch CUDA tensors, CuPy, anything with a CUDA __dlpack__): the
// library's GPU restore decodes straight into them in their layout (RestoreIntoGpu), paged
// included, with no second copy of the session on the device. Without the CUDA build this says
// so (InvalidArgument) instead of touching device memory.
#include "bindings.h"
#include "tqkv/batch.h"
#include "tqkv/checkpoint.h"
#include "tqkv/kv_layout.h"

#ifdef TQKV_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "tqkv/gpu.h"
#endif

namespace tqkv::python {

#ifdef TQKV_HAVE_CUDA
namespace {

// The GPU restore's options for `device`; the caller's layer_ready means "layer l is in the
// arrays", so it runs once the layer's event has completed.
GpuRestoreOptions DeviceOptions(int device, const std::function<Status(uint32_t)>& layer_ready) {
  GpuRestoreOptions opts;
  opts.device = device;
  if (layer_ready) {
    opts.on_layer = [&layer_ready](uint32_t layer, void* event) -> Status {
      const cudaError_t e = cudaEventSynchronize(static_cast<cudaEvent_t>(event));
      if (e != cudaSuccess) {
        return Status::DeviceError(std::string("cudaEventSynchronize: ") + cudaGetErrorString(e));
      }
      return layer_ready(layer);
    };
  }
  return opts;
}

}  // namespace
#endif

Status RestoreToCudaArrays(Store& store, const std::string& key, const LayoutTensors& dst,
                           int device, const std::function<Status(uint32_t)>& layer_ready,
                           RestoreStats* stats) {
#ifdef TQKV_HAVE_CUDA
  const GpuRestoreOptions opts = DeviceOptions(device, layer_ready);
  TQKV_ASSIGN_OR_RETURN(GpuRestoreStats g, RestoreIntoGpu(store, key, dst, opts));
  stats->bytes_read = g.bytes_read;
  stats->fp16_bytes = g.fp16_bytes;
  stats->tokens = g.tokens;
  stats->model = g.model;
  stats->geometry = g.geometry;
  stats->seconds = g.seconds;
  stats->read_busy_seconds = g.read_busy_seconds;
  stats->decode_busy_seconds = g.decode_seconds;
  stats->first_layer_seconds = g.first_layer_seconds;
  return Status::Ok();
#else
  (void)store, (void)key, (void)dst, (void)device, (void)layer_ready, (void)stats;
  return Status::InvalidArgument(kNoCudaMessage);
#endif
}

Status RestoreBatchToCudaArrays(Store& store, std::span<const BatchObject> objects,
                                const LayoutTensors& dst, int device,
                                const std::function<Status(uint32_t)>& layer_ready,
                                BatchStats* stats) {
#ifdef TQKV_HAVE_CUDA
  return RestoreBatchIntoGpu(store, objects, dst, DeviceOptions(device, layer_ready), stats);
#else
  (void)store, (void)objects, (void)dst, (void)device, (void)layer_ready, (void)stats;
  return Status::InvalidArgument(kNoCudaMessage);
#endif
}

}  // namespace tqkv::python
