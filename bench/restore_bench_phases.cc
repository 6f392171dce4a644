#include "bench/restore_bench_phases.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "checkpoint/slot_reader.h"
#include "tqkv/aligned_buffer.h"
#include "tqkv/container.h"

namespace tqkv::bench {

Result<PhaseRun> ReadLikeRestore(Store& store, const std::string& key, bool verify,
                                 uint64_t inflight_bytes) {
  TQKV_ASSIGN_OR_RETURN(auto object, store.Open(key));
  (void)object->DropCache();
  const uint64_t before = object->BytesRead();
  const auto t0 = Clock::now();
  TQKV_ASSIGN_OR_RETURN(auto reader, ContainerReader::Open(object.get(), key));
  const auto& chunks = reader->chunks();
  // The restore's slot geometry (src/checkpoint/restore.cc RunRestore).
  uint64_t max_chunk = kContainerAlignment;
  for (size_t i = 0; i < chunks.size(); ++i) max_chunk = std::max(max_chunk, ChunkExtent(chunks, i));
  std::vector<AlignedBuffer> slots(std::clamp<size_t>(inflight_bytes / max_chunk, 2, 64));
  for (auto& s : slots) s.Reserve(max_chunk);
  auto read = [&](const std::vector<size_t>& batch, size_t first) -> Status {
    std::vector<ReadRequest> reqs;
    for (size_t i = 0; i < batch.size(); ++i) {
      const uint64_t len = ChunkExtent(chunks, first + i);
      reqs.push_back({chunks[first + i].offset, {slots[batch[i]].data(), static_cast<size_t>(len)}});
    }
    TQKV_RETURN_IF_ERROR(object->ReadBatch(reqs));
    if (!verify) return Status::Ok();
    for (size_t i = 0; i < batch.size(); ++i) {
      const ChunkEntry& e = chunks[first + i];
      TQKV_RETURN_IF_ERROR(reader->VerifyChunk(e, reqs[i].dst.first(e.size)));
      const auto pad = reqs[i].dst.subspan(e.size);
      if (std::any_of(pad.begin(), pad.end(), [](uint8_t b) { return b != 0; })) {
        return Status::Corruption(key + ": chunk padding is not zero");
      }
    }
    return Status::Ok();
  };
  {
    SlotReader chunk_reader(slots.size(), chunks.size(), read);
    for (size_t i = 0; i < chunks.size(); ++i) {
      TQKV_ASSIGN_OR_RETURN(size_t slot, chunk_reader.Next());
      chunk_reader.Release(slot);
    }
  }
  PhaseRun run;
  run.end = Clock::now();
  run.seconds = std::chrono::duration<double>(run.end - t0).count();
  run.bytes = object->BytesRead() - before;
  if (run.bytes == 0) run.bytes = reader->file_bytes();
  return run;
}

}  // namespace tqkv::bench
