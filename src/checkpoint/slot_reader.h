// Read-ahead for restores: a thread fills free slots with the next chunks (in container order),
// a second one verifies them, while the consumer decodes ready ones. Shared by the host and GPU
// restore pipelines.
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
  // Fills `slots` (slot indices) with chunks [first, first + slots.size()).
  using ReadFn = std::function<Status(const std::vector<size_t>& slots, size_t first)>;

  // `read` fills a batch; `verify` (may be empty: `read` verified already) checks it on a second
  // thread, so the reader issues the next batch while the last one is hashed and the storage never
  // waits on the checksum. Batches are verified and handed out in order; an error (of a read or a
  // check) is returned by Next() after every chunk before it. `thread_init` runs first on the
  // reader thread (e.g. to select a CUDA device); may be empty.
  SlotReader(size_t slots, size_t chunks, ReadFn read, ReadFn verify = {},
             std::function<void()> thread_init = {})
      : chunks_(chunks), read_(std::move(read)), verify_(std::move(verify)) {
    for (size_t i = 0; i < slots; ++i) free_.push_back(i);
    thread_ = std::thread([this, init = std::move(thread_init)] {
      if (init) init();
      ReadLoop();
    });
    if (verify_) verifier_ = std::thread([this] { VerifyLoop(); });
  }
  ~SlotReader() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      cv_.notify_all();
    }
    thread_.join();
    if (verifier_.joinable()) verifier_.join();
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
  // Seconds the reader spent in `read`, and the verifier in `verify`.
  double busy_seconds() const { return busy_; }
  double verify_seconds() const { return verify_busy_; }

 private:
  struct Batch {
    std::vector<size_t> slots;
    size_t first = 0;
    Status status;  // the read's error: the verifier passes it on in order
  };

  static double Timed(const ReadFn& fn, const Batch& b, Status* st) {
    const auto t = std::chrono::steady_clock::now();
    *st = fn(b.slots, b.first);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  }

  // Under mu_: the batch is read (and verified); its slots go to the consumer or its error does.
  void Publish(Batch& b, Status st) {
    if (!st.ok()) {
      status_ = std::move(st);
    } else {
      for (size_t s : b.slots) ready_.push_back(s);
    }
    cv_.notify_all();
  }

  void ReadLoop() {
    size_t next = 0;
    while (next < chunks_) {
      // Take every free slot (at least one) and read that many chunks in one batch.
      Batch b;
      b.first = next;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return !free_.empty() || stop_; });
        if (stop_) return;
        while (!free_.empty() && next + b.slots.size() < chunks_) {
          b.slots.push_back(free_.front());
          free_.pop_front();
        }
      }
      Status st;
      const double dt = Timed(read_, b, &st);
      std::lock_guard<std::mutex> lock(mu_);
      busy_ += dt;
      next += b.slots.size();
      const bool failed = !st.ok();
      if (verify_) {
        b.status = std::move(st);
        read_done_.push_back(std::move(b));
        cv_.notify_all();
      } else {
        Publish(b, std::move(st));
      }
      if (failed) return;
    }
  }

  void VerifyLoop() {
    for (;;) {
      Batch b;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return !read_done_.empty() || stop_; });
        if (read_done_.empty()) return;  // stopping
        b = std::move(read_done_.front());
        read_done_.pop_front();
      }
      Status st = std::move(b.status);
      double dt = 0;
      if (st.ok()) dt = Timed(verify_, b, &st);
      std::lock_guard<std::mutex> lock(mu_);
      verify_busy_ += dt;
      const bool failed = !st.ok();
      Publish(b, std::move(st));
      if (failed || b.first + b.slots.size() >= chunks_) return;
    }
  }

  size_t chunks_;
  ReadFn read_, verify_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<size_t> free_, ready_;
  std::deque<Batch> read_done_;
  Status status_;
  bool stop_ = false;
  double busy_ = 0, verify_busy_ = 0;
  std::thread thread_, verifier_;
};

}  // namespace tqkv

#endif  // TQKV_SRC_CHECKPOINT_SLOT_READER_H_
