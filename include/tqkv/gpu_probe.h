// Whether and how this machine can move bytes from storage into GPU memory: the CUDA devices and
// the I/O ladder (gds, direct, buffered; docs/gpu.md), probed without restoring anything. Built
// only with TQKV_ENABLE_CUDA (src/cuda/ladder.cc).
#ifndef TQKV_INCLUDE_TQKV_GPU_PROBE_H_
#define TQKV_INCLUDE_TQKV_GPU_PROBE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tqkv/status.h"

namespace tqkv {

enum class GpuIoPath : uint8_t { kGds = 0, kDirect = 1, kBuffered = 2 };
std::string_view GpuIoPathName(GpuIoPath path);                // "gds" | "direct" | "buffered"
Result<GpuIoPath> ParseGpuIoPath(std::string_view name);

// Number of CUDA devices; DeviceError with the runtime's message when there is no driver/device.
Result<int> CudaDeviceCount();

// Free bytes of `device`'s memory. Creates the CUDA context first, so a benchmark can call it
// before timing anything. DeviceError without a device.
Result<uint64_t> CudaFreeMemory(int device = 0);

struct GpuRung {
  GpuIoPath path = GpuIoPath::kBuffered;
  bool usable = false;
  std::string reason;  // why not usable (empty when usable)
};

struct GpuProbe {
  int device_count = 0;
  std::string device;           // name and compute capability of device 0, or empty
  std::string device_error;     // "no CUDA device: ..." when device_count == 0
  bool cufile_loaded = false;   // dlopen + every symbol found
  std::string cufile_library;   // the library that loaded
  std::string cufile_error;
  bool cufile_driver_ok = false;  // cuFileDriverOpen succeeded
  std::string cufile_driver_error;
  bool o_direct_ok = false;     // an aligned O_DIRECT write+read worked in the probed directory
  std::string o_direct_error;
  std::vector<GpuRung> rungs;   // gds, direct, buffered
  std::optional<GpuIoPath> chosen;  // the first usable rung; none without a device
  std::string ToJson() const;
};

struct GpuProbeOptions {
  std::string dir;  // directory to test O_DIRECT in (the store's); empty: O_DIRECT not tested
  // Libraries tried in order for cuFile; empty: {"libcufile.so.0", "libcufile.so"}.
  std::vector<std::string> cufile_libraries;
};

// Never fails: each rung says why it is not usable.
GpuProbe ProbeGpuLadder(const GpuProbeOptions& options);

}  // namespace tqkv

#endif  // TQKV_INCLUDE_TQKV_GPU_PROBE_H_
