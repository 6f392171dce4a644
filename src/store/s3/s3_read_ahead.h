// Bulk reads of one S3 object as few, large, aligned GETs fetched ahead of the reader. Each GET
// costs an S3 server far more than its bytes (SeaweedFS on loopback: about 3 ms of server CPU per
// GET, more when a range straddles two parts of a multipart object), so a restore that asked for
// every chunk separately (four per layer) kept the server busier than the bytes did. Here the
// object is cut into blocks at multiples of `block` bytes (a divisor of the part size keeps every
// GET inside one part), `lanes` threads fetch the block a reader waits for and the next ones, and
// readers copy bytes out as they arrive, before the block's GET ends.
#ifndef TQKV_SRC_STORE_S3_S3_READ_AHEAD_H_
#define TQKV_SRC_STORE_S3_S3_READ_AHEAD_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "tqkv/status.h"

namespace tqkv::s3 {

class ReadAhead {
 public:
  // Fills dst with the object's bytes at `offset`; calls progress(bytes so far) as they land
  // (a prefix of dst; false aborts the fetch). Retries are its own.
  using FetchFn = std::function<Status(uint64_t offset, std::span<uint8_t> dst,
                                       const std::function<bool(uint64_t)>& progress)>;

  // At most `lanes` GETs in flight; blocks held for reading ahead: 2 x lanes, or `min_held`
  // bytes of small ones (room for the spread of a restore's read lanes).
  ReadAhead(uint64_t size, uint64_t block, uint32_t lanes, FetchFn fetch,
            uint64_t min_held = 32u << 20);
  ~ReadAhead();
  ReadAhead(const ReadAhead&) = delete;
  ReadAhead& operator=(const ReadAhead&) = delete;

  // Copies [offset, offset + dst.size()) (inside the object) out of the blocks, fetching the
  // missing ones and the `lanes` after the last. Safe from several threads at once.
  Status Read(uint64_t offset, std::span<uint8_t> dst);
  // Bytes fetched from the server so far.
  uint64_t BytesFetched() const;

 private:
  struct Block {
    uint64_t index = 0, offset = 0, length = 0;
    uint8_t* data = nullptr;
    uint64_t ready = 0;     // bytes [0, ready) have landed
    bool done = false;      // the fetch ended (status says how)
    Status status;
    uint64_t consumed = 0;  // bytes copied out; the block is dropped once all were
    int users = 0;          // readers copying and the fetcher
    bool dropped = false;   // out of blocks_; its buffer returns when users reach 0
    bool urgent = false;    // queued because a reader waits for it
  };
  using BlockPtr = std::shared_ptr<Block>;

  // Under mu_: the block, queued for fetching if it was not there and counted as used by the
  // caller (Unuse when done); with `ahead` the next ones are queued too.
  BlockPtr Acquire(uint64_t index, bool ahead);
  BlockPtr Queue(uint64_t index, bool urgent);
  void Drop(const BlockPtr& b);
  void Unuse(const BlockPtr& b);
  uint8_t* TakeBuffer();  // nullptr: out of memory
  void FetchLoop();

  const uint64_t size_, block_;
  const uint32_t lanes_;
  const size_t resident_max_;  // blocks held for read-ahead (demand fetches may exceed it)
  FetchFn fetch_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, BlockPtr> blocks_;
  std::deque<BlockPtr> queue_;
  std::vector<uint8_t*> free_;          // buffers of dropped blocks, for the next ones
  std::vector<std::unique_ptr<uint8_t, void (*)(void*)>> owned_;
  uint64_t next_ahead_ = 0;  // blocks below were queued ahead once; never again
  uint64_t fetched_ = 0;
  uint32_t inflight_ = 0;   // fetches running
  uint64_t completed_ = 0;  // fetches ended
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace tqkv::s3

#endif  // TQKV_SRC_STORE_S3_S3_READ_AHEAD_H_
