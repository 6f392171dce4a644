// The I/O ladder probe: CUDA device, cuFile (dlopen + driver open), O_DIRECT in the store's
// directory. Every rung says why it is or is not usable; nothing here fails or crashes.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>

#include "cuda/common.h"
#include "cuda/cufile.h"
#include "tqkv/gpu_probe.h"

namespace tqkv {

std::string_view GpuIoPathName(GpuIoPath path) {
  switch (path) {
    case GpuIoPath::kGds: return "gds";
    case GpuIoPath::kDirect: return "direct";
    case GpuIoPath::kBuffered: return "buffered";
  }
  return "?";
}

Result<GpuIoPath> ParseGpuIoPath(std::string_view name) {
  if (name == "gds") return GpuIoPath::kGds;
  if (name == "direct" || name == "uring") return GpuIoPath::kDirect;
  if (name == "buffered") return GpuIoPath::kBuffered;
  return Status::InvalidArgument("unknown GPU I/O path '" + std::string(name) +
                                 "' (gds, direct, buffered)");
}

Result<int> CudaDeviceCount() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    return Status::DeviceError(std::string("no CUDA device: cudaGetDeviceCount: ") +
                               cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
  }
  if (n <= 0) return Status::DeviceError("no CUDA device: cudaGetDeviceCount returned 0");
  return n;
}

Result<uint64_t> CudaFreeMemory(int device) {
  TQKV_ASSIGN_OR_RETURN(int n, CudaDeviceCount());
  if (device < 0 || device >= n) {
    return Status::InvalidArgument("CUDA device " + std::to_string(device) + " of " +
                                   std::to_string(n));
  }
  TQKV_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  size_t free_bytes = 0, total = 0;
  TQKV_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total));  // creates the context
  return static_cast<uint64_t>(free_bytes);
}

namespace {

// Writes and reads back one aligned 4 KiB block with O_DIRECT in `dir`. Empty string when it works.
std::string ProbeODirect(const std::string& dir) {
  const std::string path = dir + "/.tqkv-odirect-probe-" + std::to_string(getpid());
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0600);
  if (fd < 0) return "open(O_DIRECT) in " + dir + ": " + std::strerror(errno);
  std::string err;
  void* buf = nullptr;
  if (posix_memalign(&buf, 4096, 4096) != 0) {
    err = "posix_memalign failed";
  } else {
    std::memset(buf, 0x5A, 4096);
    if (pwrite(fd, buf, 4096, 0) != 4096) {
      err = std::string("O_DIRECT pwrite: ") + std::strerror(errno);
    } else {
      std::memset(buf, 0, 4096);
      if (pread(fd, buf, 4096, 0) != 4096) {
        err = std::string("O_DIRECT pread: ") + std::strerror(errno);
      } else if (static_cast<unsigned char*>(buf)[4095] != 0x5A) {
        err = "O_DIRECT read back different bytes";
      }
    }
    std::free(buf);
  }
  close(fd);
  unlink(path.c_str());
  return err;
}

}  // namespace

GpuProbe ProbeGpuLadder(const GpuProbeOptions& options) {
  GpuProbe p;
  Result<int> count = CudaDeviceCount();
  if (count.ok()) {
    p.device_count = *count;
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) {
      p.device = std::string(prop.name) + " (sm_" + std::to_string(prop.major) +
                 std::to_string(prop.minor) + ", " +
                 std::to_string(prop.totalGlobalMem >> 20) + " MiB)";
    }
  } else {
    p.device_error = count.status().message();
  }
  Result<cuda::CuFileApi> cufile = cuda::LoadCuFile(options.cufile_libraries);
  if (cufile.ok()) {
    p.cufile_loaded = true;
    p.cufile_library = cufile->library;
    if (p.device_count > 0) {
      const cuda::CUfileErrorT e = cufile->DriverOpen();
      if (e.err == 0) {
        p.cufile_driver_ok = true;
        cufile->DriverClose();
      } else {
        p.cufile_driver_error = "cuFileDriverOpen: " + cuda::CuFileErrorString(e);
      }
    } else {
      p.cufile_driver_error = "not tried: no CUDA device";
    }
  } else {
    p.cufile_error = cufile.status().message();
  }
  if (options.dir.empty()) {
    p.o_direct_error = "not tested: no directory (not a file:// store)";
  } else {
    p.o_direct_error = ProbeODirect(options.dir);
    p.o_direct_ok = p.o_direct_error.empty();
  }

  const std::string no_device = p.device_error;
  GpuRung gds{GpuIoPath::kGds, false, ""};
  if (p.device_count == 0) {
    gds.reason = no_device;
  } else if (!p.cufile_loaded) {
    gds.reason = p.cufile_error;
  } else if (!p.cufile_driver_ok) {
    gds.reason = p.cufile_driver_error;
  } else if (!p.o_direct_ok) {
    gds.reason = "O_DIRECT unusable: " + p.o_direct_error;
  } else {
    gds.usable = true;
  }
  GpuRung direct{GpuIoPath::kDirect, false, ""};
  if (p.device_count == 0) {
    direct.reason = no_device;
  } else if (!p.o_direct_ok) {
    direct.reason = "O_DIRECT unusable: " + p.o_direct_error;
  } else {
    direct.usable = true;
  }
  GpuRung buffered{GpuIoPath::kBuffered, p.device_count > 0, p.device_count > 0 ? "" : no_device};
  p.rungs = {gds, direct, buffered};
  for (const GpuRung& r : p.rungs) {
    if (r.usable) {
      p.chosen = r.path;
      break;
    }
  }
  return p;
}

std::string GpuProbe::ToJson() const {
  nlohmann::json j;
  j["device_count"] = device_count;
  j["device"] = device;
  j["device_error"] = device_error;
  j["cufile"] = {{"loaded", cufile_loaded}, {"library", cufile_library}, {"error", cufile_error},
                 {"driver_ok", cufile_driver_ok}, {"driver_error", cufile_driver_error}};
  j["o_direct"] = {{"ok", o_direct_ok}, {"error", o_direct_error}};
  nlohmann::json rs = nlohmann::json::array();
  for (const GpuRung& r : rungs) {
    rs.push_back({{"path", GpuIoPathName(r.path)}, {"usable", r.usable}, {"reason", r.reason}});
  }
  j["rungs"] = rs;
  j["chosen"] = chosen ? nlohmann::json(std::string(GpuIoPathName(*chosen))) : nlohmann::json();
  return j.dump(2);
}

}  // namespace tqkv
