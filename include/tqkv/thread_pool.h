// A fixed-size pool of worker threads for data-parallel loops (encode, decode, restore).
#ifndef TQKV_INCLUDE_TQKV_THREAD_POOL_H_
#define TQKV_INCLUDE_TQKV_THREAD_POOL_H_

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "tqkv/status.h"

namespace tqkv {

class ThreadPool {
 public:
  // Most threads a pool runs (the CLI's --threads refuses more).
  static constexpr size_t kMaxThreads = 1024;
  // threads == 0: one per hardware thread. The calling thread also works inside ParallelFor.
  // More than kMaxThreads are capped; if the system refuses a thread, the pool runs with those it
  // got (at least the caller), so size() may be smaller than asked. Never throws.
  explicit ThreadPool(size_t threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  size_t size() const { return workers_.size() + 1; }

  // Calls fn(begin, end) over [0, n) in pieces of at least `grain`, on the pool and the caller;
  // returns when all pieces are done. Safe to call from several threads; not re-entrant from fn.
  void ParallelFor(size_t n, size_t grain, const std::function<void(size_t, size_t)>& fn);

  // Runs fn on a worker (fire and forget); use with your own completion signalling.
  void Submit(std::function<void()> fn);

 private:
  void WorkerLoop();
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
};

// Runs fn(begin, end) over [0, n) on pool, or inline when pool is null.
void ParallelFor(ThreadPool* pool, size_t n, size_t grain,
                 const std::function<void(size_t, size_t)>& fn);
// ParallelFor over items that can fail: fn(i) for every i in [0, n). After the first error no
// further item starts; that error is returned once none is running.
Status ParallelForEach(ThreadPool* pool, size_t n, size_t grain,
                       const std::function<Status(size_t)>& fn);

}  // namespace tqkv

#endif  // TQKV_INCLUDE_TQKV_THREAD_POOL_H_
