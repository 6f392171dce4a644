// Read-ahead for restores: reader threads ("lanes") fill free slots with the next chunks, a
// verifier checks them in container order, while the consumer decodes ready ones. Shared by the
// host and GPU restore pipelines.
#ifndef TQKV_SRC_CHECKPOINT_SLOT_READER_H_
#define TQKV_SRC_CHECKPOINT_SLOT_READER_H_

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "tqkv/status.h"

namespace tqkv {

class SlotReader {
 public:
  // Fills `slots` (slot indices) with chunks [first, first + slots.size()).
  using ReadFn = std::function<Status(const std::vector<size_t>& slots, size_t first)>;

  // `read` fills a batch; `verify` (may be empty: `read` verified already) checks it on another
  // thread, so the storage never waits on the checksum. With `lanes` > 1 that many batches are
  // read at once (each of at most slots / lanes chunks), so a store that completes one batch at a
  // time still has the next one queued: the disk sees a steady queue, not one batch and a gap.
  // Batches are verified and handed out in order; an error (of a read or a check) is returned by
  // Next() after every chunk before it, and no batch starts after a read error. `thread_init`
  // runs first on every reader thread (e.g. to select a CUDA device); may be empty.
  SlotReader(size_t slots, size_t chunks, ReadFn read, ReadFn verify = {},
             std::function<void()> thread_init = {}, size_t lanes = 1);
  ~SlotReader();
  SlotReader(const SlotReader&) = delete;
  SlotReader& operator=(const SlotReader&) = delete;

  // The slot holding the next chunk in order, or the first error.
  Result<size_t> Next();
  // Gives a consumed slot back for the next read.
  void Release(size_t slot);
  // Wall seconds in which at least one lane was inside `read`, and the verifier's in `verify`.
  double busy_seconds() const { return busy_; }
  double verify_seconds() const { return verify_busy_; }

 private:
  using Clock = std::chrono::steady_clock;
  struct Batch {
    std::vector<size_t> slots;
    size_t first = 0;
    Status status;  // the read's error: passed on in order
  };

  void ReadLoop();
  void VerifyLoop();
  // Under mu_: hands out (or fails) the read batches that are next in order; without a verifier.
  void PublishInOrder();
  // Under mu_: the batch's slots go to the consumer, or its error does.
  void Publish(Batch& b, Status st);

  const size_t chunks_;
  const size_t max_batch_;
  ReadFn read_, verify_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<size_t> free_, ready_;
  std::map<size_t, Batch> read_done_;  // by first chunk: lanes finish out of order
  size_t next_ = 0;                    // next chunk a lane takes
  size_t next_out_ = 0;                // next chunk to verify / hand out
  Status status_;
  bool stop_ = false;
  bool read_failed_ = false;
  size_t reading_ = 0;  // lanes inside `read`
  Clock::time_point busy_since_{};
  double busy_ = 0, verify_busy_ = 0;
  std::vector<std::thread> lanes_;
  std::thread verifier_;
};

}  // namespace tqkv

#endif  // TQKV_SRC_CHECKPOINT_SLOT_READER_H_
