// Decorators for tests and benchmarks that wrap any Store (as RocksDB's FileSystemWrapper does)
// to inject faults or limit bandwidth; CMake target tqkv_testing, never installed. The in-process MemoryStore is a production store of its
// own (tqkv/memory_store.h, included here for the tests that pair it with a decorator).
//
// Both keep the Store contract of tqkv/store.h (atomic publish, last committed writer wins,
// thread-safe Store methods). Objects they hand out stay valid after the store is destroyed.
#ifndef TQKV_SRC_STORE_TESTING_STORE_TESTING_H_
#define TQKV_SRC_STORE_TESTING_STORE_TESTING_H_

#include <chrono>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tqkv/memory_store.h"
#include "tqkv/status.h"
#include "tqkv/store.h"

namespace tqkv {

inline constexpr uint64_t kNoFault = std::numeric_limits<uint64_t>::max();

// Forwards every call to a base store; a decorator derives from it and overrides only what it
// changes (the shape of RocksDB's EnvWrapper).
class StoreWrapper : public Store {
 public:
  explicit StoreWrapper(std::unique_ptr<Store> base) : base_(std::move(base)) {}
  Store* base() const { return base_.get(); }

  StoreCaps Caps() const override { return base_->Caps(); }
  Result<std::unique_ptr<WritableObject>> Create(std::string_view key) override {
    return base_->Create(key);
  }
  Result<std::unique_ptr<ReadableObject>> Open(std::string_view key) override {
    return base_->Open(key);
  }
  Status Remove(std::string_view key) override { return base_->Remove(key); }
  Result<std::vector<ObjectInfo>> List(std::string_view prefix = {}) override {
    return base_->List(prefix);
  }
  Result<uint64_t> RemoveStaleTemps(std::chrono::seconds min_age) override {
    return base_->RemoveStaleTemps(min_age);
  }
  Result<uint64_t> CountStaleTemps(std::chrono::seconds min_age) override {
    return base_->CountStaleTemps(min_age);
  }

 protected:
  std::unique_ptr<Store> base_;
};

// Offsets are byte offsets inside one object. A fault set with no offset (kNoFault) never fires.
struct WriteFaults {
  // Append writes the bytes before this offset, then fails with NoSpace (as ENOSPC would).
  uint64_t no_space_at = kNoFault;
  // Same with IoError (as EIO would).
  uint64_t io_error_at = kNoFault;
  // Bytes from this offset on are silently dropped: a lying device or a lost short write. Append
  // and Commit succeed and the object is published truncated; readers must notice (checksums).
  uint64_t short_write_at = kNoFault;
  // Commit fails with IoError before publishing (as fsync returning EIO); the object is aborted.
  bool fail_commit = false;
  // The writer's process "dies" once the object reaches this many bytes (at the latest in
  // Commit): from then on every call returns IoError, nothing is published, and no cleanup runs
  // (a posix temp file stays on disk, as after a real crash; see Store::RemoveStaleTemps).
  uint64_t crash_at = kNoFault;
  // Same, at Commit: every byte is written, then the writer dies before publishing.
  bool crash_before_publish = false;
};

struct ReadFaults {
  // ReadAt/ReadBatch requests that cover this byte fail with IoError.
  uint64_t io_error_at = kNoFault;
  // The byte at this offset is returned with all bits flipped (bit rot the storage did not see).
  uint64_t corrupt_at = kNoFault;
};

// Wraps any Store and injects faults into the objects it creates or opens afterwards.
class FaultInjectionStore : public StoreWrapper {
 public:
  struct Counters {
    uint64_t creates = 0;
    uint64_t commits = 0;          // successful
    uint64_t failed_commits = 0;
    uint64_t aborts = 0;           // explicit Abort() and destroyed uncommitted writers
    uint64_t crashes = 0;          // simulated writer deaths
    uint64_t opens = 0;
    uint64_t bytes_appended = 0;   // accepted by Append (including silently dropped ones)
    uint64_t bytes_read = 0;       // requested by successful reads
    uint64_t injected_faults = 0;  // faults that fired
  };

  explicit FaultInjectionStore(std::unique_ptr<Store> base);
  ~FaultInjectionStore() override;

  // Faults for objects created (write) or opened (read) from now on whose key starts with
  // `key_prefix` (empty: all). Objects already open keep the faults they started with.
  void SetWriteFaults(const WriteFaults& faults, std::string key_prefix = {});
  void SetReadFaults(const ReadFaults& faults, std::string key_prefix = {});
  void ClearFaults();
  Counters counters() const;

  std::string_view Name() const override { return "fault"; }
  std::string Uri() const override;
  Result<std::unique_ptr<WritableObject>> Create(std::string_view key) override;
  Result<std::unique_ptr<ReadableObject>> Open(std::string_view key) override;

  struct State;

 private:
  std::shared_ptr<State> state_;
};

struct ThrottleOptions {
  double read_bytes_per_sec = 0;   // 0: unlimited
  double write_bytes_per_sec = 0;  // 0: unlimited
  // false: one bucket per direction for the whole store (a shared link);
  // true: each opened or created object gets its own buckets.
  bool per_object = false;
  // Bucket depth: bytes that may pass at once after an idle period. 0 picks
  // max(64 KiB, 2 ms worth of bandwidth).
  uint64_t burst_bytes = 0;
};

// Wraps any Store and limits read and write bandwidth with token buckets. A transfer waits
// (sleeps, never spins) until its bytes are paid for, then runs; for transfers of 100 ms or more
// the achieved rate is within a few percent of the limit (less when the base store is slower).
class ThrottledStore : public StoreWrapper {
 public:
  ThrottledStore(std::unique_ptr<Store> base, const ThrottleOptions& options);
  ~ThrottledStore() override;

  const ThrottleOptions& options() const { return options_; }

  std::string_view Name() const override { return "throttled"; }
  // The throttle:// URI that opens an equal store (docs/store.md §5).
  std::string Uri() const override;
  Result<std::unique_ptr<WritableObject>> Create(std::string_view key) override;
  Result<std::unique_ptr<ReadableObject>> Open(std::string_view key) override;

  struct State;

 private:
  ThrottleOptions options_;
  std::shared_ptr<State> state_;
};

// A ThrottledStore from its URI, "throttle://?store=<inner URI, percent-encoded>&read_rate=50MB
// &write_rate=0&per_object=0&burst=64KiB": rates in bytes per second (units.h sizes, 0 or absent:
// unlimited). The inner store opens with OpenStore(); unknown options are InvalidArgument.
Result<std::unique_ptr<Store>> OpenThrottledStoreFromUri(const StoreUri& uri);

// Makes OpenStore() accept the test schemes (throttle://). Idempotent. The tests call it; a
// program that wants the schemes at load links register_testing_schemes.cc (the CMake object
// library tqkv_testing_schemes), as the development build of the Python module does.
Status RegisterTestingStoreSchemes();

}  // namespace tqkv

#endif  // TQKV_SRC_STORE_TESTING_STORE_TESTING_H_
