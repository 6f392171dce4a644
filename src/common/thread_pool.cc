#include "tqkv/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <system_error>

namespace tqkv {

ThreadPool::ThreadPool(size_t threads) {
  if (threads == 0) threads = std::max<size_t>(1, std::thread::hardware_concurrency());
  threads = std::min(threads, kMaxThreads);
  workers_.reserve(threads - 1);
  try {
    for (size_t i = 1; i < threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
  } catch (const std::system_error&) {
    // Out of threads (EAGAIN): the workers already started are enough to make progress.
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::WorkerLoop() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and drained
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

void ThreadPool::Submit(std::function<void()> fn) {
  if (workers_.empty()) {
    fn();
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(fn));
  }
  cv_.notify_one();
}

void ThreadPool::ParallelFor(size_t n, size_t grain,
                             const std::function<void(size_t, size_t)>& fn) {
  if (n == 0) return;
  grain = std::max<size_t>(grain, 1);
  const size_t max_pieces = (n + grain - 1) / grain;
  const size_t pieces = std::min(max_pieces, size() * 4);
  if (pieces <= 1 || workers_.empty()) {
    fn(0, n);
    return;
  }
  // Work claimed piece by piece through an atomic counter, so a slow thread does not hold others.
  struct Shared {
    std::atomic<size_t> next{0};
    std::atomic<size_t> done{0};
    std::mutex mu;
    std::condition_variable cv;
  };
  auto shared = std::make_shared<Shared>();
  const size_t step = (n + pieces - 1) / pieces;
  auto run = [shared, step, n, pieces, &fn] {
    for (;;) {
      const size_t p = shared->next.fetch_add(1);
      if (p >= pieces) return;
      const size_t b = p * step;
      const size_t e = std::min(n, b + step);
      if (b < e) fn(b, e);
      if (shared->done.fetch_add(1) + 1 == pieces) {
        std::lock_guard<std::mutex> lock(shared->mu);
        shared->cv.notify_all();
      }
    }
  };
  const size_t helpers = std::min(workers_.size(), pieces - 1);
  for (size_t i = 0; i < helpers; ++i) Submit(run);
  run();
  std::unique_lock<std::mutex> lock(shared->mu);
  shared->cv.wait(lock, [&] { return shared->done.load() == pieces; });
}

void ParallelFor(ThreadPool* pool, size_t n, size_t grain,
                 const std::function<void(size_t, size_t)>& fn) {
  if (pool == nullptr) {
    if (n) fn(0, n);
    return;
  }
  pool->ParallelFor(n, grain, fn);
}

Status ParallelForEach(ThreadPool* pool, size_t n, size_t grain,
                       const std::function<Status(size_t)>& fn) {
  std::atomic<bool> failed{false};
  std::mutex mu;
  Status first;
  ParallelFor(pool, n, grain, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end && !failed.load(std::memory_order_acquire); ++i) {
      Status s = fn(i);
      if (s.ok()) continue;
      std::lock_guard<std::mutex> lock(mu);
      if (first.ok()) first = std::move(s);
      failed.store(true, std::memory_order_release);
    }
  });
  return first;
}

}  // namespace tqkv
