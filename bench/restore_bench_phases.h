// The stages of a restore measured one by one for `tqkv-bench restore`'s breakdown, through the
// restore's own loop (checkpoint/chunk_loop.h: the same slots, batches and ReadBatch calls, on
// the same objects), so a bound made of them holds for the restore (docs/lab/benchmarks-log.md §2.4).
#ifndef TQKV_BENCH_RESTORE_BENCH_PHASES_H_
#define TQKV_BENCH_RESTORE_BENCH_PHASES_H_

#include <cstdint>
#include <string>

#include "bench/restore_bench_util.h"
#include "tqkv/checkpoint.h"
#include "tqkv/status.h"
#include "tqkv/store.h"

namespace tqkv::bench {

struct PhaseRun {
  uint64_t bytes = 0;  // moved from the store
  double seconds = 0;  // first read to last chunk handed over
  Clock::time_point end{};
};

// Reads every chunk of `key` as a restore does (page cache dropped first) and discards it;
// `verify` checks each chunk's checksum and padding on the reader thread as the restore does,
// without it the bytes are only read. No decode.
// `options` gives the read-ahead and lanes, as the restore uses them.
Result<PhaseRun> ReadLikeRestore(Store& store, const std::string& key, bool verify,
                                 const RestoreOptions& options);

}  // namespace tqkv::bench

#endif  // TQKV_BENCH_RESTORE_BENCH_PHASES_H_
