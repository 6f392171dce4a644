#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "store/store_internal.h"
#include "store/testing/store_testing.h"

namespace tqkv {

struct FaultInjectionStore::State {
  std::mutex mu;
  WriteFaults write_faults;
  std::string write_prefix;
  bool write_set = false;
  ReadFaults read_faults;
  std::string read_prefix;
  bool read_set = false;

  std::atomic<uint64_t> creates{0}, commits{0}, failed_commits{0}, aborts{0}, crashes{0},
      opens{0}, bytes_appended{0}, bytes_read{0}, injected_faults{0};
};

namespace {

using State = FaultInjectionStore::State;

bool Covers(uint64_t begin, uint64_t len, uint64_t at) {
  return at != kNoFault && at >= begin && at - begin < len;
}

class FaultWritable final : public WritableObject, public store_internal::Crashable {
 public:
  FaultWritable(std::shared_ptr<State> state, std::unique_ptr<WritableObject> base,
                std::string key, const WriteFaults& faults)
      : state_(std::move(state)), base_(std::move(base)), key_(std::move(key)), f_(faults) {}

  ~FaultWritable() override {
    if (!done_) state_->aborts.fetch_add(1);
    // base_'s destructor aborts it unless it crashed (then nothing runs, as in a dead process).
  }

  Status Append(std::span<const uint8_t> src) override {
    if (crashed_) return Crashed();
    if (!error_.ok()) return error_;
    if (done_) return base_->Append(src);  // the base reports the misuse
    const uint64_t begin = offset_;
    // The first fault inside [begin, begin + size) wins.
    uint64_t cut = src.size();
    enum class Kind { kNone, kNoSpace, kIoError, kShort, kCrash } kind = Kind::kNone;
    auto consider = [&](uint64_t at, Kind k) {
      if (Covers(begin, src.size(), at) && at - begin < cut) {
        cut = at - begin;
        kind = k;
      } else if (at != kNoFault && at < begin && k == Kind::kShort) {
        cut = 0;
        kind = k;
      }
    };
    consider(f_.no_space_at, Kind::kNoSpace);
    consider(f_.io_error_at, Kind::kIoError);
    consider(f_.crash_at, Kind::kCrash);
    consider(f_.short_write_at, Kind::kShort);
    if (cut > 0) {
      Status s = base_->Append(src.first(cut));
      if (!s.ok()) return Fail(std::move(s));
    }
    offset_ += (kind == Kind::kShort) ? src.size() : cut;
    state_->bytes_appended.fetch_add(kind == Kind::kShort ? src.size() : cut);
    const std::string where = key_ + " at offset " + std::to_string(begin + cut);
    switch (kind) {
      case Kind::kNone:
        return Status::Ok();
      case Kind::kShort:
        if (!short_fired_) state_->injected_faults.fetch_add(1);
        short_fired_ = true;
        return Status::Ok();
      case Kind::kNoSpace:
        state_->injected_faults.fetch_add(1);
        return Fail(Status::NoSpace("injected ENOSPC writing " + where));
      case Kind::kIoError:
        state_->injected_faults.fetch_add(1);
        return Fail(Status::IoError("injected EIO writing " + where));
      case Kind::kCrash:
        state_->injected_faults.fetch_add(1);
        SimulateCrash();
        return Crashed();
    }
    return Status::Ok();
  }

  Status Commit() override {
    if (crashed_) return Crashed();
    if (done_) return base_->Commit();
    if (!error_.ok()) {
      done_ = true;
      (void)base_->Abort();
      state_->failed_commits.fetch_add(1);
      return error_;
    }
    if (f_.crash_before_publish || (f_.crash_at != kNoFault && offset_ >= f_.crash_at)) {
      state_->injected_faults.fetch_add(1);
      SimulateCrash();
      return Crashed();
    }
    done_ = true;
    if (f_.fail_commit) {
      state_->injected_faults.fetch_add(1);
      state_->failed_commits.fetch_add(1);
      (void)base_->Abort();
      return Status::IoError("injected EIO syncing " + key_ + " at commit");
    }
    Status s = base_->Commit();
    (s.ok() ? state_->commits : state_->failed_commits).fetch_add(1);
    return s;
  }

  Status Abort() override {
    if (crashed_) return Crashed();
    if (!done_) state_->aborts.fetch_add(1);
    done_ = true;
    return base_->Abort();
  }

  uint64_t BytesWritten() const override { return offset_; }

  void SimulateCrash() override {
    if (crashed_) return;
    crashed_ = true;
    done_ = true;
    state_->crashes.fetch_add(1);
    if (!store_internal::TrySimulateCrash(base_.get())) {
      // The base cannot leave leftovers behind; the closest thing is to publish nothing.
      (void)base_->Abort();
    }
  }

 private:
  Status Crashed() const {
    return Status::IoError("writer of " + key_ + " crashed (simulated) at offset " +
                           std::to_string(offset_));
  }
  Status Fail(Status s) {
    error_ = s;
    return s;
  }

  std::shared_ptr<State> state_;
  std::unique_ptr<WritableObject> base_;
  std::string key_;
  WriteFaults f_;
  uint64_t offset_ = 0;
  Status error_;
  bool done_ = false;
  bool crashed_ = false;
  bool short_fired_ = false;
};

class FaultReadable final : public ReadableObject {
 public:
  FaultReadable(std::shared_ptr<State> state, std::unique_ptr<ReadableObject> base,
                std::string key, const ReadFaults& faults)
      : state_(std::move(state)), base_(std::move(base)), key_(std::move(key)), f_(faults) {}

  uint64_t Size() const override { return base_->Size(); }
  uint64_t BytesRead() const override { return base_->BytesRead(); }
  ReadPathBytes PathBytes() const override { return base_->PathBytes(); }
  Status DropCache() override { return base_->DropCache(); }

  Status ReadAt(uint64_t offset, std::span<uint8_t> dst) override {
    TQKV_RETURN_IF_ERROR(Before(offset, dst.size()));
    TQKV_RETURN_IF_ERROR(base_->ReadAt(offset, dst));
    After(offset, dst);
    return Status::Ok();
  }

  Status ReadBatch(std::span<const ReadRequest> reqs) override {
    for (const ReadRequest& r : reqs) TQKV_RETURN_IF_ERROR(Before(r.offset, r.dst.size()));
    TQKV_RETURN_IF_ERROR(base_->ReadBatch(reqs));
    for (const ReadRequest& r : reqs) After(r.offset, r.dst);
    return Status::Ok();
  }

 private:
  Status Before(uint64_t offset, uint64_t len) {
    if (Covers(offset, len, f_.io_error_at)) {
      state_->injected_faults.fetch_add(1);
      return Status::IoError("injected EIO reading " + key_ + " at offset " +
                             std::to_string(f_.io_error_at));
    }
    return Status::Ok();
  }
  void After(uint64_t offset, std::span<uint8_t> dst) {
    state_->bytes_read.fetch_add(dst.size());
    if (Covers(offset, dst.size(), f_.corrupt_at)) {
      dst[f_.corrupt_at - offset] ^= 0xff;
      state_->injected_faults.fetch_add(1);
    }
  }

  std::shared_ptr<State> state_;
  std::unique_ptr<ReadableObject> base_;
  std::string key_;
  ReadFaults f_;
};

bool HasPrefix(std::string_view key, std::string_view prefix) {
  return key.size() >= prefix.size() && key.substr(0, prefix.size()) == prefix;
}

}  // namespace

FaultInjectionStore::FaultInjectionStore(std::unique_ptr<Store> base)
    : StoreWrapper(std::move(base)), state_(std::make_shared<State>()) {}
FaultInjectionStore::~FaultInjectionStore() = default;

std::string FaultInjectionStore::Uri() const { return "fault+" + base_->Uri(); }

void FaultInjectionStore::SetWriteFaults(const WriteFaults& faults, std::string key_prefix) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->write_faults = faults;
  state_->write_prefix = std::move(key_prefix);
  state_->write_set = true;
}

void FaultInjectionStore::SetReadFaults(const ReadFaults& faults, std::string key_prefix) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->read_faults = faults;
  state_->read_prefix = std::move(key_prefix);
  state_->read_set = true;
}

void FaultInjectionStore::ClearFaults() {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->write_faults = WriteFaults();
  state_->read_faults = ReadFaults();
  state_->write_set = state_->read_set = false;
}

FaultInjectionStore::Counters FaultInjectionStore::counters() const {
  Counters c;
  c.creates = state_->creates.load();
  c.commits = state_->commits.load();
  c.failed_commits = state_->failed_commits.load();
  c.aborts = state_->aborts.load();
  c.crashes = state_->crashes.load();
  c.opens = state_->opens.load();
  c.bytes_appended = state_->bytes_appended.load();
  c.bytes_read = state_->bytes_read.load();
  c.injected_faults = state_->injected_faults.load();
  return c;
}

Result<std::unique_ptr<WritableObject>> FaultInjectionStore::Create(std::string_view key) {
  WriteFaults faults;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (state_->write_set && HasPrefix(key, state_->write_prefix)) faults = state_->write_faults;
  }
  TQKV_ASSIGN_OR_RETURN(std::unique_ptr<WritableObject> base, base_->Create(key));
  state_->creates.fetch_add(1);
  return std::unique_ptr<WritableObject>(
      std::make_unique<FaultWritable>(state_, std::move(base), std::string(key), faults));
}

Result<std::unique_ptr<ReadableObject>> FaultInjectionStore::Open(std::string_view key) {
  ReadFaults faults;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (state_->read_set && HasPrefix(key, state_->read_prefix)) faults = state_->read_faults;
  }
  TQKV_ASSIGN_OR_RETURN(std::unique_ptr<ReadableObject> base, base_->Open(key));
  state_->opens.fetch_add(1);
  return std::unique_ptr<ReadableObject>(
      std::make_unique<FaultReadable>(state_, std::move(base), std::string(key), faults));
}

}  // namespace tqkv
