// One cell of `tqkv-bench restore` (codec x I/O path x target x context length x link) and the
// parts of the report built from cells: the stage breakdown and the summary a user reads first.
#ifndef TQKV_BENCH_RESTORE_BENCH_REPORT_H_
#define TQKV_BENCH_RESTORE_BENCH_REPORT_H_

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "bench/restore_bench_rows.h"
#include "bench/restore_bench_util.h"

namespace tqkv::bench {

struct WorkerResult {
  double write_s = 0, restore_s = 0;
  uint64_t bytes_written = 0, bytes_read = 0;
  uint64_t bytes_direct = 0, bytes_page_cache = 0;  // RestoreStats::read_path
  double start = 0, end = 0;  // restore, seconds since the phase barrier
  bool drop_ok = true;
  std::string drop_error;
};

struct Cell {
  std::string codec, io;
  Target target = Target::kHost;
  std::vector<GpuWorker> gpu;  // GPU rows: one per worker
  std::string gpu_device;
  uint64_t tokens = 0;
  size_t workers = 0;
  double link_gbps = 0;  // emulated per-worker link; 0: the raw store
  std::vector<WorkerResult> w;
  Stats restore, write;
  double wall_s = 0;           // concurrent restore phase
  double read_gbps_aggregate = 0, fp16_gbps_aggregate = 0, per_worker_gbps = 0;
  uint64_t file_bytes = 0, fp16_bytes = 0;
  uint64_t bytes_direct = 0, bytes_page_cache = 0;  // all workers' restores
  bool streamed = false;
  bool memory_warmed = false;  // WarmRestoreMemory before the stages and the restore
  bool drop_ok = true;
  std::string drop_error;
  double nmse = NAN, cosine_mean = NAN;
  // Breakdown (TurboQuant codecs), measured in the same run on the same objects with the
  // restore's reader: raw reads, reads with checksums (read_only_*), decode only from memory.
  double raw_read_s = NAN, raw_read_gbps = NAN;
  double read_only_s = NAN, decode_only_s = NAN;  // decode: less memory_copy_s
  double memory_copy_s = NAN;  // the decode stage's copy out of the memory store, timed alone
  double read_only_gbps = NAN, decode_capacity_fp16_gbps = NAN, bound_fp16_gbps = NAN;
  double speedup = NAN;

  double ratio() const { return file_bytes ? static_cast<double>(fp16_bytes) / file_bytes : NAN; }
  bool has_breakdown() const { return !std::isnan(bound_fp16_gbps); }
  // Restore wall time over its slowest stage: 1.0 = reads and decode fully overlapped.
  double overlap() const { return wall_s / std::max(read_only_s, decode_only_s); }
  // What limits the restore: "disk" / "link" (reads) or "CPU" (decode); "" without a breakdown.
  std::string bottleneck() const;
};

// The breakdown table: every stage of a cell side by side, with the bound and the overlap.
void PrintBreakdown(const std::vector<Cell>& cells);
// Per context length and link: how much faster each TurboQuant row restores than fp16's fastest
// row, and why (the two figures that show what limits it).
void PrintSummary(const std::vector<Cell>& cells);
// "raw disk" or "0.05 GB/s link per worker".
std::string LinkLabel(double link_gbps);

}  // namespace tqkv::bench

#endif  // TQKV_BENCH_RESTORE_BENCH_REPORT_H_
