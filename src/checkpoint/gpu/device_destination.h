// Caller-owned device tensors as the destination of a GPU restore (RestoreIntoGpu): the host
// checks them against the stored session before anything is read, and describes each layer's K
// and V to the decode kernels in the caller's layout (KvLayout: strided or paged, as on the host).
// No CUDA call here: the host half is tested without a GPU (tests/gpu_ladder).
#ifndef TQKV_SRC_CHECKPOINT_GPU_DEVICE_DESTINATION_H_
#define TQKV_SRC_CHECKPOINT_GPU_DEVICE_DESTINATION_H_

#include <cstdint>
#include <string_view>

#include "cuda/packed.h"
#include "tqkv/container.h"
#include "tqkv/kv_layout.h"
#include "tqkv/status.h"

namespace tqkv::gpu {

// InvalidArgument unless the kernels write `dtype` (f16, bf16 or f32).
Status CheckDeviceDType(DType dtype, std::string_view key);

// The host restore's rule (checkpoint/destination.h) plus what the kernels need: an f16, bf16 or
// f32 output and each head's channels contiguous (dim_stride 1). InvalidArgument otherwise.
Status CheckDeviceDestination(const LayoutTensors& dst, const ContainerHeader& h,
                              std::string_view key);

// Layer `layer`'s K (kv 0) or V (kv 1) of `dst` as the kernels address it; `block_ids` is the
// device copy of dst.layout.block_ids (paged layouts), else ignored.
cuda::GpuDst DeviceDst(const LayoutTensors& dst, uint32_t layer, int kv, const int64_t* block_ids);

}  // namespace tqkv::gpu

#endif  // TQKV_SRC_CHECKPOINT_GPU_DEVICE_DESTINATION_H_
