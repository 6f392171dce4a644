// Rows of `tqkv-bench restore`: codec x I/O path x restore target (host memory or GPU), and the
// fields GPU rows add to the JSON. No CUDA here: the CLI and its tests build without it.
#ifndef TQKV_BENCH_RESTORE_BENCH_ROWS_H_
#define TQKV_BENCH_RESTORE_BENCH_ROWS_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "tqkv/status.h"

namespace tqkv::bench {

enum class Target : uint8_t { kHost = 0, kGpu = 1 };
std::string_view TargetName(Target t);            // "host" | "gpu"
Result<Target> ParseTarget(std::string_view name);

struct RowConfig {
  std::string codec, io;  // io: host rows buffered|direct|uring; GPU rows also gds
  Target target = Target::kHost;
  bool operator==(const RowConfig&) const = default;
};

// `configs` (CODEC:IO or CODEC:IO:TARGET) when given, else every codec x io x target. Codec specs
// may hold ':' ("tq:b=3"), so the target is taken off the end only when it names one.
Result<std::vector<RowConfig>> ExpandRowConfigs(const std::vector<std::string>& configs,
                                                const std::vector<std::string>& codecs,
                                                const std::vector<std::string>& ios,
                                                const std::vector<std::string>& targets);

// The GPU rung a row forces: "" for gds (the whole ladder, from GDS down), else the io.
std::string ForcedGpuIo(const RowConfig& row);

// Removes GPU rows when `gpu_unavailable` (the reason) is not empty and sets `note` to say so.
// InvalidArgument naming the reason when only GPU rows were asked for.
Result<std::vector<RowConfig>> DropGpuRows(std::vector<RowConfig> rows,
                                           const std::string& gpu_unavailable, std::string* note);

// One worker's GPU restore (RestoreToGpu's stats, in seconds).
struct GpuWorker {
  std::string io_used;           // the rung the ladder ended on: gds | direct | buffered
  std::string host_io;           // the store's real host I/O mode, or "cufile"
  std::vector<std::string> skipped;  // "gds: <reason>" for rungs passed over
  double first_layer_s = 0;      // open until layer 0's K and V are decoded on the device
  double decode_gpu_s = 0, copy_gpu_s = 0, read_busy_s = 0, setup_s = 0;
};

// The JSON fields a GPU row adds to a result (means over workers; io_used joins distinct rungs
// with ','); per-worker fields for each entry of "per_worker".
nlohmann::json GpuRowJson(const std::vector<GpuWorker>& workers, const std::string& device);
nlohmann::json GpuWorkerJson(const GpuWorker& w);

}  // namespace tqkv::bench

#endif  // TQKV_BENCH_RESTORE_BENCH_ROWS_H_
