// Helpers of `tqkv-bench restore`: statistics, progress, object copies, quality.
#ifndef TQKV_BENCH_RESTORE_BENCH_UTIL_H_
#define TQKV_BENCH_RESTORE_BENCH_UTIL_H_

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "tqkv/aligned_buffer.h"
#include "tqkv/kv_cache.h"
#include "tqkv/status.h"
#include "tqkv/store.h"

namespace tqkv::bench {

using Clock = std::chrono::steady_clock;
inline double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

struct Stats {
  double mean = 0, p50 = 0, p99 = 0, min = 0, max = 0, std = 0;
};
Stats Summarize(std::vector<double> v);

// A one-line progress bar on stderr (only when stderr is a terminal, else one line per phase).
class Progress {
 public:
  Progress(size_t cells, size_t workers);
  void Cell(size_t index, const std::string& label);
  void Set(const std::string& phase);
  void Tick();
  void Done();

 private:
  void Draw();
  std::mutex mu_;
  size_t cells_, workers_, cell_ = 0, ticks_ = 0;
  std::string label_, phase_;
  bool tty_;
  Clock::time_point start_ = Clock::now();
};

// Writes to every page of the cache's tensors.
void Touch(KvCache& cache);
// Streaming-restore callback: checks a sample of each layer is finite, then releases it.
Status CheckLayer(uint32_t layer, const void* k, const void* v);
// Copies an object between stores.
Status CopyObject(Store& from, Store& to, const std::string& key);

struct Quality {
  double nmse = 0, cosine_mean = 0;
};
// Restores `key` and compares the first `tokens_compared` tokens of every layer with the
// synthetic session it was made from.
Result<Quality> MeasureQuality(Store& store, const std::string& key, const std::string& model,
                               const ModelGeometry& g, uint64_t tokens, uint64_t seed,
                               uint64_t tokens_compared);

uint64_t AvailableMemory();
// NoSpace unless `bytes` fit in the directory of a store with local files (LocalRoot).
Status CheckDiskSpace(const Store& store, uint64_t bytes);
std::string MachineDescription();

}  // namespace tqkv::bench

#endif  // TQKV_BENCH_RESTORE_BENCH_UTIL_H_
