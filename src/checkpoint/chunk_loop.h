// The loop every restore runs: verified chunks from the container reader, in container order,
// read ahead on a thread (slot_reader.h), handed to a sink. The sinks: host tensors and the
// per-layer callback (restore.cc), the device (device_sink.h, gpu/).
#ifndef TQKV_SRC_CHECKPOINT_CHUNK_LOOP_H_
#define TQKV_SRC_CHECKPOINT_CHUNK_LOOP_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <utility>
#include <vector>

#include "tqkv/aligned_buffer.h"
#include "tqkv/container.h"
#include "tqkv/status.h"

namespace tqkv {

using RestoreClock = std::chrono::steady_clock;
inline double SecondsSince(RestoreClock::time_point t) {
  return std::chrono::duration<double>(RestoreClock::now() - t).count();
}

// Where verified chunks go.
class ChunkSink {
 public:
  virtual ~ChunkSink();
  // The memory reads land in: `count` slots of `bytes` each, 4 KiB-aligned (O_DIRECT). Default:
  // one host region owned by the sink, taken from and given back to restore_memory.h's pool.
  virtual Result<std::vector<std::span<uint8_t>>> AllocateSlots(size_t count, size_t bytes);
  // Chunk `index` of the reader, verified (checksum and padding), sits in slot `slot` as its
  // extent; `payload` is its entry.size bytes at PayloadOffsetInExtent(index) of the slot.
  virtual Status Consume(size_t slot, size_t index, std::span<const uint8_t> payload) = 0;
  // Every chunk of `layer` was consumed. Called once per layer in order, also for a layer
  // without chunks (an empty session).
  virtual Status LayerDone(uint32_t layer) = 0;
  // How many consumed slots the sink may keep before they go back to the reader (an asynchronous
  // copy may still read them); Retire(slot) returns once `slot` may be overwritten.
  virtual size_t held_slots() const { return 0; }
  virtual Status Retire(size_t slot) { return Status::Ok(); }

 private:
  AlignedBuffer host_slots_;  // the default AllocateSlots': every slot, back to back
};

// Drops every chunk: the read path alone (the restore bench's read stages).
class DiscardSink final : public ChunkSink {
 public:
  Status Consume(size_t, size_t, std::span<const uint8_t>) override { return Status::Ok(); }
  Status LayerDone(uint32_t) override { return Status::Ok(); }
};

// One slot read: chunk `index` into `dst` (ChunkExtent(index) bytes of slot `slot`).
struct SlotRead {
  size_t slot = 0;
  size_t index = 0;
  std::span<uint8_t> dst;
};
// Fills and verifies a batch of slots. The default reads with ContainerReader::ReadChunkExtents
// and verifies on a second thread; a transport that moves bytes by other means (cuFile) must end
// with ContainerReader::VerifyChunkExtent.
using SlotReadFn = std::function<Status(std::span<const SlotRead> batch)>;

struct ChunkLoopOptions {
  uint64_t inflight_bytes = 32 << 20;  // read-ahead budget: slots of the largest extent
  size_t max_slots = 64;
  size_t read_lanes = 1;                    // batches in flight at once (SlotReader lanes)
  // An object whose chunks all fit in this many bytes of slots is read and verified whole on
  // the calling thread, without read-ahead threads (their start and hand-offs cost more than
  // they overlap there: a vLLM tier chunk of 16 tokens is 84 chunks, ~115 KB). 0: never.
  uint64_t inline_bytes = 2 << 20;
  SlotReadFn read;                          // empty: ContainerReader::ReadChunks
  std::function<void()> reader_thread_init;  // runs first on the reader thread; may be empty
};

struct ChunkLoopStats {
  size_t slots = 0;
  size_t slot_bytes = 0;
  double read_busy_seconds = 0;     // reader thread inside reads (and a custom read's checks)
  double verify_seconds = 0;        // verifier thread inside checksums of the default path
  double consume_seconds = 0;       // inside ChunkSink::Consume
  RestoreClock::time_point first_layer_done{};
};

// The slot geometry RunChunkLoop uses for `reader`: {count, bytes}.
std::pair<size_t, size_t> ChunkLoopSlots(const ContainerReader& reader,
                                         const ChunkLoopOptions& options);

// Reads every chunk of `reader` in order into the sink's slots, verified before the sink sees
// it, and calls LayerDone per layer. Returns the first error of a read, a check or the sink; the
// sink sees no chunk after one that failed.
Status RunChunkLoop(ContainerReader& reader, ChunkSink& sink, const ChunkLoopOptions& options,
                    ChunkLoopStats* stats = nullptr);

}  // namespace tqkv

#endif  // TQKV_SRC_CHECKPOINT_CHUNK_LOOP_H_
