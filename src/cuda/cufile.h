// libcufile (GPUDirect Storage) loaded at run time with dlopen: no link or header dependency, so
// the library builds and runs where cuFile is absent. Only the handful of entry points tqkv uses,
// declared with cufile.h's ABI (CUDA 11.4+).
#ifndef TQKV_SRC_CUDA_CUFILE_H_
#define TQKV_SRC_CUDA_CUFILE_H_

#include <sys/types.h>

#include <cstddef>
#include <string>
#include <vector>

#include "tqkv/status.h"

namespace tqkv::cuda {

// cufile.h: typedef struct CUfileError { CUfileOpError err; CUresult cu_err; } CUfileError_t;
struct CUfileErrorT {
  int err;     // CUfileOpError: 0 = CU_FILE_SUCCESS, errors are 5000 + n
  int cu_err;  // CUresult
};
// cufile.h: CUfileDescr_t with CU_FILE_HANDLE_TYPE_OPAQUE_FD = 1.
struct CUfileDescrT {
  int type;
  union {
    int fd;
    void* handle;
  } handle;
  const void* fs_ops;
};
inline constexpr int kCuFileHandleTypeOpaqueFd = 1;

struct CuFileApi {
  void* lib = nullptr;
  std::string library;
  CUfileErrorT (*DriverOpen)() = nullptr;
  CUfileErrorT (*DriverClose)() = nullptr;
  CUfileErrorT (*HandleRegister)(void** fh, CUfileDescrT* descr) = nullptr;
  void (*HandleDeregister)(void* fh) = nullptr;
  CUfileErrorT (*BufRegister)(const void* base, size_t length, int flags) = nullptr;
  CUfileErrorT (*BufDeregister)(const void* base) = nullptr;
  ssize_t (*Read)(void* fh, void* base, size_t size, off_t file_offset, off_t buf_offset) = nullptr;
};

// Loads the first library of `names` that opens and has every symbol ({"libcufile.so.0",
// "libcufile.so"} when empty). Unsupported with each dlopen/dlsym error otherwise. The handle stays
// open for the process lifetime (cuFile keeps global driver state).
Result<CuFileApi> LoadCuFile(const std::vector<std::string>& names);

// "cuFile error N, CUresult M".
std::string CuFileErrorString(CUfileErrorT e);

}  // namespace tqkv::cuda

#endif  // TQKV_SRC_CUDA_CUFILE_H_
