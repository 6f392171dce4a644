// Restores into CUDA arrays (torch CUDA tensors, CuPy, anything with a CUDA __dlpack__): the
// library's GPU restore (include/tqkv/gpu.h) decodes into device tensors of its own, then each
// layer is copied on the device into the caller's arrays in their layout. Without the CUDA build
// this says so (InvalidArgument) instead of touching device memory.
#include "bindings.h"
#include "tqkv/checkpoint.h"
#include "tqkv/kv_layout.h"

#ifdef TQKV_HAVE_CUDA
#include <cuda_runtime_api.h>

#include <algorithm>

#include "tqkv/gpu.h"
#endif

namespace tqkv::python {

#ifdef TQKV_HAVE_CUDA
namespace {

Status CudaStatus(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::Ok();
  return Status::DeviceError(std::string(what) + ": " + cudaGetErrorString(e));
}

// Copies one canonical device tensor into `dst` in `l` (channels contiguous): one 2-D copy per
// head and run of tokens in a block, a single copy when the layout is the canonical one.
Status CopyLayer(const void* src, const LayoutTensors& t, void* dst) {
  const ModelGeometry& g = t.geometry;
  const size_t es = DTypeSize(t.dtype), d = g.head_dim, row = g.token_elems();
  if (t.layout.IsCanonical(g)) {
    return CudaStatus(cudaMemcpy(dst, src, t.tokens * row * es, cudaMemcpyDeviceToDevice),
                      "cudaMemcpy");
  }
  const size_t pitch = std::max<size_t>(static_cast<size_t>(t.layout.token_stride), d) * es;
  for (size_t h = 0; h < g.kv_heads; ++h) {
    for (uint64_t tok = 0; tok < t.tokens;) {
      const uint64_t n = t.layout.RunTokens(tok, t.tokens - tok);
      TQKV_RETURN_IF_ERROR(CudaStatus(
          cudaMemcpy2D(static_cast<uint8_t*>(dst) + t.layout.Offset(tok, h) * es, pitch,
                       static_cast<const uint8_t*>(src) + (tok * row + h * d) * es, row * es,
                       d * es, n, cudaMemcpyDeviceToDevice),
          "cudaMemcpy2D"));
      tok += n;
    }
  }
  return Status::Ok();
}

}  // namespace
#endif

Status RestoreToCudaArrays(Store& store, const std::string& key, const LayoutTensors& dst,
                           int device, const std::function<Status(uint32_t)>& layer_ready,
                           RestoreStats* stats) {
#ifdef TQKV_HAVE_CUDA
  if (dst.layout.dim_stride != 1 && dst.geometry.head_dim > 1) {
    return Status::InvalidArgument("CUDA arrays: the last (channel) axis must be contiguous");
  }
  GpuRestoreOptions opts;
  opts.dtype = dst.dtype;
  opts.device = device;
  TQKV_ASSIGN_OR_RETURN(std::unique_ptr<GpuSession> s, RestoreToGpu(store, key, opts));
  if (!(s->geometry() == dst.geometry) || s->tokens() != dst.tokens) {
    return Status::InvalidArgument(key + " holds " + std::to_string(s->tokens()) + " tokens of " +
                                   std::to_string(s->geometry().layers) + " layers x " +
                                   std::to_string(s->geometry().kv_heads) + " KV heads x " +
                                   std::to_string(s->geometry().head_dim) +
                                   " dims, which the destination does not match");
  }
  TQKV_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device), "cudaSetDevice"));
  for (uint32_t l = 0; l < dst.geometry.layers; ++l) {
    TQKV_RETURN_IF_ERROR(CopyLayer(s->tensor(l, 0), dst, dst.k[l]));
    TQKV_RETURN_IF_ERROR(CopyLayer(s->tensor(l, 1), dst, dst.v[l]));
    TQKV_RETURN_IF_ERROR(CudaStatus(cudaDeviceSynchronize(), "cudaDeviceSynchronize"));
    if (layer_ready) TQKV_RETURN_IF_ERROR(layer_ready(l));
  }
  const GpuRestoreStats& g = s->stats();
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

}  // namespace tqkv::python
