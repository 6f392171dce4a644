// GPU rows of `tqkv-bench restore`: the ladder probe, context set-up, one restore into device
// memory. Built with or without CUDA (as tools/gpu_command.cc): without it, every call says so.
#ifndef TQKV_BENCH_RESTORE_BENCH_GPU_H_
#define TQKV_BENCH_RESTORE_BENCH_GPU_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "bench/restore_bench_rows.h"
#include "tqkv/status.h"
#include "tqkv/store.h"

namespace tqkv::bench {

struct GpuAvailability {
  std::string unavailable;  // why GPU rows cannot run; empty when they can
  std::string device;       // device 0, as the probe names it
  nlohmann::json probe;     // the ladder probe (null in a build without CUDA)
};
// Probes the ladder in `store`'s directory (a file:// store; O_DIRECT is not tested otherwise).
GpuAvailability ProbeGpuForBench(const Store& store);

// Creates the CUDA context (so no timed restore pays for it) and checks that `bytes` of device
// memory are free.
Status PrepareGpu(uint64_t bytes);

struct GpuRestoreResult {
  GpuWorker gpu;
  double seconds = 0;      // RestoreToGpu's wall time, set-up included (GpuWorker::setup_s)
  uint64_t bytes_read = 0;
  bool drop_ok = true;
  std::string drop_error;
};
// The store's host I/O mode for a GPU row's rung (tqkv::GpuStoreIo, gpu.h): gds reads its header
// and index through O_DIRECT.
Result<IoMode> GpuStoreIo(const std::string& io);

// Drops `key` from the page cache (untimed), restores it as f16 into device memory through
// `forced_io` ("" = the whole ladder from GDS down), then frees the device memory.
Result<GpuRestoreResult> RestoreOnGpu(Store& store, const std::string& key,
                                      const std::string& forced_io);

}  // namespace tqkv::bench

#endif  // TQKV_BENCH_RESTORE_BENCH_GPU_H_
