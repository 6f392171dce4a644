#include "checkpoint/chunk_loop.h"

#include <algorithm>
#include <deque>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "checkpoint/restore_memory.h"
#include "checkpoint/slot_reader.h"

namespace tqkv {

ChunkSink::~ChunkSink() { ReturnRestoreMemory(std::move(host_slots_)); }

Result<std::vector<std::span<uint8_t>>> ChunkSink::AllocateSlots(size_t count, size_t bytes) {
  // One region (restore_memory.h: huge pages, kept for the next restore).
  if (bytes != 0 && count > std::numeric_limits<size_t>::max() / bytes) {
    return Status::ResourceExhausted("chunk loop: " + std::to_string(count) + " slots of " +
                                     std::to_string(bytes) + " bytes");
  }
  ReturnRestoreMemory(std::move(host_slots_));
  TQKV_ASSIGN_OR_RETURN(host_slots_, TakeRestoreMemory(count * bytes));
  std::vector<std::span<uint8_t>> out;
  for (size_t i = 0; i < count; ++i) out.emplace_back(host_slots_.data() + i * bytes, bytes);
  return out;
}

namespace {

bool ReadsInline(const ContainerReader& reader, const ChunkLoopOptions& options, size_t bytes) {
  const size_t n = reader.chunks().size();
  return !options.read && n > 0 && n <= options.inline_bytes / bytes;
}

}  // namespace

std::pair<size_t, size_t> ChunkLoopSlots(const ContainerReader& reader,
                                         const ChunkLoopOptions& options) {
  const size_t bytes = static_cast<size_t>(std::max(kContainerAlignment, reader.MaxChunkExtent()));
  if (ReadsInline(reader, options, bytes)) return {reader.chunks().size(), bytes};
  const size_t count =
      std::clamp<size_t>(options.inflight_bytes / bytes, 2, std::max<size_t>(2, options.max_slots));
  return {count, bytes};
}

Status RunChunkLoop(ContainerReader& reader, ChunkSink& sink, const ChunkLoopOptions& options,
                    ChunkLoopStats* stats_out) {
  ChunkLoopStats stats;
  const auto& chunks = reader.chunks();
  const uint32_t layers = reader.header().geometry.layers;
  std::tie(stats.slots, stats.slot_bytes) = ChunkLoopSlots(reader, options);
  TQKV_ASSIGN_OR_RETURN(std::vector<std::span<uint8_t>> slots,
                        sink.AllocateSlots(stats.slots, stats.slot_bytes));
  if (slots.size() != stats.slots) return Status::Internal("chunk loop: sink allocated no slots");
  std::vector<size_t> chunk_of(slots.size(), 0);
  // The default path reads on the reader thread and checksums on the verifier's; a custom read
  // (cuFile) verifies its own host copy.
  auto reads_of = [&](const std::vector<size_t>& batch, size_t first) {
    std::vector<SlotRead> reads;
    for (size_t i = 0; i < batch.size(); ++i) {
      reads.push_back({batch[i], first + i,
                       slots[batch[i]].first(static_cast<size_t>(reader.ChunkExtent(first + i)))});
    }
    return reads;
  };
  SlotReader::ReadFn read = [&](const std::vector<size_t>& batch, size_t first) -> Status {
    for (size_t i = 0; i < batch.size(); ++i) chunk_of[batch[i]] = first + i;
    const std::vector<SlotRead> reads = reads_of(batch, first);
    if (options.read) return options.read(reads);
    std::vector<ChunkRead> cr;
    for (const SlotRead& r : reads) cr.push_back({r.index, r.dst});
    return reader.ReadChunkExtents(cr);
  };
  SlotReader::ReadFn verify;
  if (!options.read) {
    verify = [&](const std::vector<size_t>& batch, size_t first) -> Status {
      for (const SlotRead& r : reads_of(batch, first)) {
        TQKV_RETURN_IF_ERROR(reader.VerifyChunkExtent(r.index, r.dst));
      }
      return Status::Ok();
    };
  }
  // Small objects: every chunk in its own slot, read and verified here before the first is
  // consumed. A checksum failure is returned right after the chunks before it (the threads check
  // a batch at a time, so they may stop sooner); a read error before any.
  const bool inline_read = ReadsInline(reader, options, stats.slot_bytes);  // a slot per chunk
  std::optional<SlotReader> slot_reader;
  size_t inline_good = 0;
  Status inline_status;
  if (inline_read) {
    std::vector<size_t> all(chunks.size());
    for (size_t i = 0; i < all.size(); ++i) all[i] = i;
    const auto tr = RestoreClock::now();
    inline_status = read(all, 0);
    stats.read_busy_seconds = SecondsSince(tr);
    const auto tv = RestoreClock::now();
    while (inline_status.ok() && inline_good < all.size()) {
      const size_t i = inline_good;
      const auto extent = slots[i].first(static_cast<size_t>(reader.ChunkExtent(i)));
      inline_status = reader.VerifyChunkExtent(i, extent);
      if (inline_status.ok()) ++inline_good;
    }
    stats.verify_seconds = SecondsSince(tv);
  } else {
    slot_reader.emplace(slots.size(), chunks.size(), read, verify, options.reader_thread_init,
                        options.read_lanes);
  }
  auto next_slot = [&](size_t i) -> Result<size_t> {
    if (!inline_read) return slot_reader->Next();
    if (i < inline_good) return i;
    return inline_status;
  };

  std::deque<size_t> held;  // consumed slots not yet given back to the reader
  auto retire_oldest = [&]() -> Status {
    const size_t s = held.front();
    held.pop_front();
    TQKV_RETURN_IF_ERROR(sink.Retire(s));
    if (slot_reader) slot_reader->Release(s);
    return Status::Ok();
  };
  // Hands out layers in order up to `layer`; a layer without chunks too.
  uint32_t next_done = 0;
  auto done_through = [&](uint32_t layer) -> Status {
    for (; next_done <= layer && next_done < layers; ++next_done) {
      if (next_done == 0) stats.first_layer_done = RestoreClock::now();
      TQKV_RETURN_IF_ERROR(sink.LayerDone(next_done));
    }
    return Status::Ok();
  };
  Status st;
  for (size_t i = 0; i < chunks.size() && st.ok(); ++i) {
    Result<size_t> si = next_slot(i);
    if (!si.ok()) {
      st = si.status();
      break;
    }
    const size_t index = chunk_of[*si];
    const ChunkEntry& e = chunks[index];
    const auto tc = RestoreClock::now();
    // The slot holds the chunk's extent; the payload sits inside it (format version 9).
    st = sink.Consume(*si, index,
                      slots[*si].subspan(static_cast<size_t>(reader.PayloadOffsetInExtent(index)),
                                         static_cast<size_t>(e.size)));
    stats.consume_seconds += SecondsSince(tc);
    held.push_back(*si);
    while (st.ok() && held.size() > sink.held_slots()) st = retire_oldest();
    const bool layer_end = i + 1 == chunks.size() || chunks[i + 1].layer != e.layer;
    if (st.ok() && layer_end) st = done_through(e.layer);
  }
  if (st.ok() && layers > 0) st = done_through(layers - 1);
  // Slots still held are retired on failure too: a device copy may still read them.
  while (!held.empty()) {
    Status r = retire_oldest();
    if (st.ok()) st = r;
  }
  if (slot_reader) {
    stats.read_busy_seconds = slot_reader->busy_seconds();
    stats.verify_seconds = slot_reader->verify_seconds();
  }
  if (stats_out != nullptr) *stats_out = stats;
  return st;
}

}  // namespace tqkv
