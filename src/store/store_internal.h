// Private helpers shared by the store backends and decorators.
#ifndef TQKV_SRC_STORE_STORE_INTERNAL_H_
#define TQKV_SRC_STORE_STORE_INTERNAL_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tqkv/status.h"
#include "tqkv/store.h"

namespace tqkv::store_internal {

// False when no valid key (ValidateKey) starts with `prefix`: a listing can stop before it asks.
bool CouldPrefixAKey(std::string_view prefix);

// A writer that can "die" the way a crashed process does: it stops, and none of its cleanup
// runs (a posix temp file stays on disk). Used by FaultInjectionStore; decorators forward it.
class Crashable {
 public:
  virtual ~Crashable() = default;
  virtual void SimulateCrash() = 0;
};

// Crashes `w` if it (or what it wraps) supports that; returns false otherwise.
inline bool TrySimulateCrash(WritableObject* w) {
  if (auto* c = dynamic_cast<Crashable*>(w)) {
    c->SimulateCrash();
    return true;
  }
  return false;
}

// Takes the options of a StoreUri one by one; Finish() refuses the ones nobody took.
class UriOptions {
 public:
  explicit UriOptions(const StoreUri& uri) : uri_(uri), used_(uri.options.size(), false) {}

  // nullptr when absent.
  const std::string* Find(std::string_view key);
  // Each leaves *value alone when the option is absent; a bad value is InvalidArgument naming
  // the option and the kind of value it takes.
  Status GetCount(std::string_view key, uint64_t min, uint64_t max, uint64_t* value);  // "16"
  Status GetBytes(std::string_view key, uint64_t min, uint64_t max, uint64_t* value);  // "64KiB"
  // Whole seconds: "90", "90s", "2m" (tqkv/units.h durations).
  Status GetSeconds(std::string_view key, uint64_t min, uint64_t max, uint64_t* value);
  Status GetBool(std::string_view key, bool* value);
  Status Finish() const;

 private:
  const StoreUri& uri_;
  std::vector<bool> used_;
};

// Nanoseconds since the Unix epoch, now.
int64_t NowUnixNs();

}  // namespace tqkv::store_internal

#endif  // TQKV_SRC_STORE_STORE_INTERNAL_H_
