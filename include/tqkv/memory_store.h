// The in-process store, "memory://" in OpenStore: objects live in this process's memory and go
// with it. Keeps the Store contract of tqkv/store.h (atomic publish, last committed writer wins,
// thread-safe methods); objects it hands out stay valid after the store is destroyed.
#ifndef TQKV_INCLUDE_TQKV_MEMORY_STORE_H_
#define TQKV_INCLUDE_TQKV_MEMORY_STORE_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tqkv/status.h"
#include "tqkv/store.h"

namespace tqkv {

// Objects live in process memory; "memory://" in OpenStore. Caps: io_alignment 1, no drop_cache.
class MemoryStore : public Store {
 public:
  MemoryStore();
  ~MemoryStore() override;

  std::string_view Name() const override { return "memory"; }
  std::string Uri() const override { return "memory://"; }
  StoreCaps Caps() const override;
  Result<std::unique_ptr<WritableObject>> Create(std::string_view key) override;
  Result<std::unique_ptr<ReadableObject>> Open(std::string_view key) override;
  Status Remove(std::string_view key) override;
  Result<std::vector<ObjectInfo>> List(std::string_view prefix = {}) override;

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace tqkv

#endif  // TQKV_INCLUDE_TQKV_MEMORY_STORE_H_
