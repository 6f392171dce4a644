// Read-ahead for restores: a thread fills free slots with the next chunks (in container order)
// while the consumer decodes ready ones. Shared by the host and GPU restore pipelines.
#ifndef TQKV_SRC_CHECKPOINT_SLOT_READER_H_
#define TQKV_SRC_CHECKPOINT_SLOT_READER_H_

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "tqkv/status.h"

namespace tqkv {

class SlotReader {
 public:
  // Fills `slots` (slot indices) with chunks [first, first + slots.size()) and verifies them.
  using ReadFn = std::function<Status(const std::vector<size_t>& slots, size_t first)>;

  // `thread_init` runs first on the reader thread (e.g. to select a CUDA device); may be empty.
  SlotReader(size_t slots, size_t chunks, ReadFn read, std::function<void()> thread_init = {})
      : chunks_(chunks), read_(std::move(read)) {
    for (size_t i = 0; i < slots; ++i) free_.push_back(i);
    thread_ = std::thread([this, init = std::move(thread_init)] {
      if (init) init();
      Loop();
    });
  }
  ~SlotReader() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      cv_.notify_all();
    }
    thread_.join();
  }
  SlotReader(const SlotReader&) = delete;
  SlotReader& operator=(const SlotReader&) = delete;

  // The slot holding the next chunk in order, or the first read error.
  Result<size_t> Next() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !ready_.empty() || !status_.ok(); });
    if (!ready_.empty()) {
      const size_t s = ready_.front();
      ready_.pop_front();
      return s;
    }
    return status_;
  }
  // Gives a consumed slot back for the next read.
  void Release(size_t slot) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(slot);
    cv_.notify_all();
  }
  // Seconds the reader spent in `read` (reads and verification).
  double busy_seconds() const { return busy_; }

 private:
  void Loop() {
    size_t next = 0;
    while (next < chunks_) {
      // Take every free slot (at least one) and read that many chunks in one batch.
      std::vector<size_t> batch;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return !free_.empty() || stop_; });
        if (stop_) return;
        while (!free_.empty() && next + batch.size() < chunks_) {
          batch.push_back(free_.front());
          free_.pop_front();
        }
      }
      const auto t = std::chrono::steady_clock::now();
      Status st = read_(batch, next);
      busy_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
      std::lock_guard<std::mutex> lock(mu_);
      if (!st.ok()) {
        status_ = st;
        cv_.notify_all();
        return;
      }
      for (size_t s : batch) ready_.push_back(s);
      next += batch.size();
      cv_.notify_all();
    }
  }

  size_t chunks_;
  ReadFn read_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<size_t> free_, ready_;
  Status status_;
  bool stop_ = false;
  double busy_ = 0;
  std::thread thread_;
};

}  // namespace tqkv

#endif  // TQKV_SRC_CHECKPOINT_SLOT_READER_H_
