#include "bench/restore_bench_phases.h"

#include <memory>
#include <span>
#include <vector>

#include "checkpoint/chunk_loop.h"
#include "tqkv/container.h"

namespace tqkv::bench {

Result<PhaseRun> ReadLikeRestore(Store& store, const std::string& key, bool verify,
                                 const RestoreOptions& options) {
  TQKV_ASSIGN_OR_RETURN(auto object, store.Open(key));
  (void)object->DropCache();
  const uint64_t before = object->BytesRead();
  const auto t0 = Clock::now();
  TQKV_ASSIGN_OR_RETURN(auto reader, ContainerReader::Open(object.get(), key));
  // The restore's own loop (src/checkpoint/chunk_loop.h) with nothing decoded; without
  // `verify` the batch is only read, not checked.
  DiscardSink sink;
  ChunkLoopOptions loop;
  loop.inflight_bytes = options.inflight_bytes;
  loop.max_slots = 64;  // as the host restore
  loop.read_lanes = options.read_lanes;
  if (!verify) {
    loop.read = [&](std::span<const SlotRead> batch) {
      std::vector<ReadRequest> reqs;
      for (const SlotRead& r : batch) reqs.push_back({reader->ChunkExtentOffset(r.index), r.dst});
      return object->ReadBatch(reqs);
    };
  }
  TQKV_RETURN_IF_ERROR(RunChunkLoop(*reader, sink, loop));
  PhaseRun run;
  run.end = Clock::now();
  run.seconds = std::chrono::duration<double>(run.end - t0).count();
  run.bytes = object->BytesRead() - before;
  if (run.bytes == 0) run.bytes = reader->file_bytes();
  return run;
}

}  // namespace tqkv::bench
