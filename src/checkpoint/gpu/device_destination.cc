#include "checkpoint/gpu/device_destination.h"

#include <string>

#include "checkpoint/destination.h"
#include "cuda/params.h"

namespace tqkv::gpu {

Status CheckDeviceDType(DType dtype, std::string_view key) {
  if (dtype == DType::kF16 || dtype == DType::kBF16 || dtype == DType::kF32) return Status::Ok();
  return Status::InvalidArgument("GPU restore of " + std::string(key) +
                                 ": output dtype must be f16, bf16 or f32");
}

Status CheckDeviceDestination(const LayoutTensors& dst, const ContainerHeader& h,
                              std::string_view key) {
  TQKV_RETURN_IF_ERROR(CheckDeviceDType(dst.dtype, key));
  if (dst.v_layout || dst.layout.tiles != KvTiles::kNone || dst.layout.base != 0) {
    return Status::InvalidArgument("GPU restore of " + std::string(key) +
                                   ": K and V in one untiled layout (vLLM's CUDA caches are)");
  }
  if (dst.layout.dim_stride != 1 && dst.geometry.head_dim > 1) {
    return Status::InvalidArgument("GPU restore of " + std::string(key) +
                                   ": each head's channels must be contiguous (dim_stride 1)");
  }
  return CheckDestination(dst, h, key);
}

cuda::GpuDst DeviceDst(const LayoutTensors& dst, uint32_t layer, int kv, const int64_t* block_ids) {
  const KvLayout& l = dst.layout;
  cuda::GpuDst d{};
  d.base = kv == 0 ? dst.k[layer] : dst.v[layer];
  d.token_stride = l.token_stride;
  d.head_stride = l.head_stride;
  d.block_tokens = l.block_tokens;
  d.block_stride = l.block_stride;
  d.block_ids = l.block_tokens > 0 ? block_ids : nullptr;
  d.dtype = cuda::ToGpuDType(dst.dtype);
  return d;
}

}  // namespace tqkv::gpu
