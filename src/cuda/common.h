// CUDA error handling for the host side of src/cuda/: CUDA errors become Status::DeviceError
// naming the call, the error name and its message (nothing throws across the API).
#ifndef TQKV_SRC_CUDA_COMMON_H_
#define TQKV_SRC_CUDA_COMMON_H_

#include <cuda_runtime_api.h>

#include <string>

#include "tqkv/status.h"

namespace tqkv::cuda {

inline Status CudaStatus(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::Ok();
  return Status::DeviceError(std::string(what) + ": " + cudaGetErrorName(err) + " (" +
                             cudaGetErrorString(err) + ")");
}

}  // namespace tqkv::cuda

#define TQKV_CUDA_RETURN_IF_ERROR(expr)                                             \
  do {                                                                              \
    const cudaError_t tqkv_cuda_err_ = (expr);                                      \
    if (tqkv_cuda_err_ != cudaSuccess) return ::tqkv::cuda::CudaStatus(tqkv_cuda_err_, #expr); \
  } while (0)

#endif  // TQKV_SRC_CUDA_COMMON_H_
