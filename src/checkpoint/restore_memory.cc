#include "checkpoint/restore_memory.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <mutex>
#include <utility>
#include <vector>

#include "tqkv/checkpoint.h"

namespace tqkv {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;

struct Kept {
  std::mutex mu;
  std::vector<AlignedBuffer> regions;
  size_t bytes = 0;
};

Kept& Pool() {
  static Kept* pool = new Kept;  // never destroyed: restores may end during static destruction
  return *pool;
}

}  // namespace

Result<AlignedBuffer> TakeRestoreMemory(size_t bytes) {
  {
    Kept& k = Pool();
    std::lock_guard<std::mutex> lock(k.mu);
    size_t best = k.regions.size();
    for (size_t i = 0; i < k.regions.size(); ++i) {
      const size_t have = k.regions[i].size();
      if (have >= bytes && (best == k.regions.size() || have < k.regions[best].size())) best = i;
    }
    if (best < k.regions.size()) {
      AlignedBuffer r = std::move(k.regions[best]);
      k.regions.erase(k.regions.begin() + static_cast<std::ptrdiff_t>(best));
      k.bytes -= r.size();
      return r;
    }
  }
  AlignedBuffer r(0, kHugePage);
  TQKV_RETURN_IF_ERROR(r.TryReserve(bytes));
  return r;
}

void ReturnRestoreMemory(AlignedBuffer region) {
  if (region.data() == nullptr) return;
  Kept& k = Pool();
  std::lock_guard<std::mutex> lock(k.mu);
  if (k.bytes + region.size() > kRestoreMemoryKept) return;  // freed on the way out
  k.bytes += region.size();
  k.regions.push_back(std::move(region));
}

Result<uint64_t> WarmRestoreMemory(size_t concurrent, const RestoreOptions& options) {
  const size_t bytes = static_cast<size_t>(AlignUp(options.inflight_bytes, kHugePage));
  if (concurrent > kRestoreMemoryKept / std::max<size_t>(bytes, 1)) {
    return Status::InvalidArgument("warm restore memory: " + std::to_string(concurrent) +
                                   " restores of " + std::to_string(bytes) +
                                   " bytes are more than the " + std::to_string(kRestoreMemoryKept) +
                                   " bytes kept");
  }
  // Taken all at once, so each restore gets a region of its own.
  std::vector<AlignedBuffer> regions;
  for (size_t i = 0; i < concurrent; ++i) {
    TQKV_ASSIGN_OR_RETURN(AlignedBuffer r, TakeRestoreMemory(bytes));
    std::memset(r.data(), 0, r.size());  // the first touch, here rather than in a restore
    regions.push_back(std::move(r));
  }
  for (AlignedBuffer& r : regions) ReturnRestoreMemory(std::move(r));
  return static_cast<uint64_t>(RestoreMemoryKeptBytes());
}

size_t RestoreMemoryKeptBytes() {
  Kept& k = Pool();
  std::lock_guard<std::mutex> lock(k.mu);
  return k.bytes;
}

}  // namespace tqkv
