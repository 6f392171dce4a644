// The in-process store (tqkv/memory_store.h).
#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "store/publishing_writer.h"
#include "store/store_internal.h"
#include "tqkv/memory_store.h"

namespace tqkv {

namespace {

struct Blob {
  std::vector<uint8_t> bytes;
  int64_t mtime_ns = 0;
};

}  // namespace

struct MemoryStore::State {
  std::mutex mu;
  std::map<std::string, std::shared_ptr<const Blob>, std::less<>> objects;
};

namespace {

class MemoryReadable final : public ReadableObject {
 public:
  MemoryReadable(std::string key, std::shared_ptr<const Blob> blob)
      : key_(std::move(key)), blob_(std::move(blob)) {}

  uint64_t Size() const override { return blob_->bytes.size(); }
  uint64_t BytesRead() const override { return bytes_read_.load(std::memory_order_relaxed); }

  Status ReadAt(uint64_t offset, std::span<uint8_t> dst) override {
    const uint64_t size = blob_->bytes.size();
    if (offset > size || dst.size() > size - offset) {
      return Status::Corruption("read of " + std::to_string(dst.size()) + " bytes at offset " +
                                std::to_string(offset) + " is past the end of memory object " +
                                key_ + " (size " + std::to_string(size) + ")");
    }
    if (!dst.empty()) std::memcpy(dst.data(), blob_->bytes.data() + offset, dst.size());
    bytes_read_.fetch_add(dst.size(), std::memory_order_relaxed);
    return Status::Ok();
  }

 private:
  std::string key_;
  std::shared_ptr<const Blob> blob_;  // a published blob never changes
  std::atomic<uint64_t> bytes_read_{0};
};

class MemoryWritable final : public store_internal::PublishingWriter {
 public:
  MemoryWritable(std::shared_ptr<MemoryStore::State> state, std::string key)
      : PublishingWriter("memory", std::move(key)),
        state_(std::move(state)),
        blob_(std::make_shared<Blob>()) {}
  ~MemoryWritable() override { DiscardIfUnfinished(); }

  uint64_t BytesWritten() const override { return blob_ ? blob_->bytes.size() : written_; }

 private:
  Status AppendBytes(std::span<const uint8_t> src) override {
    blob_->bytes.insert(blob_->bytes.end(), src.begin(), src.end());
    return Status::Ok();
  }

  Status Publish() override {
    blob_->mtime_ns = store_internal::NowUnixNs();
    written_ = blob_->bytes.size();
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->objects[key()] = std::move(blob_);
    return Status::Ok();
  }

  Status Discard() override {
    if (blob_) written_ = blob_->bytes.size();
    blob_.reset();
    return Status::Ok();
  }

  // Nothing of an unfinished memory writer is visible anywhere, so a crash is a discard.
  void Stop() override { (void)Discard(); }

  std::shared_ptr<MemoryStore::State> state_;
  std::shared_ptr<Blob> blob_;
  uint64_t written_ = 0;
};

}  // namespace

MemoryStore::MemoryStore() : state_(std::make_shared<State>()) {}
MemoryStore::~MemoryStore() = default;

StoreCaps MemoryStore::Caps() const {
  StoreCaps caps;
  caps.io_alignment = 1;
  caps.atomic_publish = true;
  caps.drop_cache = false;
  caps.io_mode = IoMode::kBuffered;
  return caps;
}

Result<std::unique_ptr<WritableObject>> MemoryStore::Create(std::string_view key) {
  TQKV_RETURN_IF_ERROR(ValidateKey(key));
  return std::unique_ptr<WritableObject>(
      std::make_unique<MemoryWritable>(state_, std::string(key)));
}

Result<std::unique_ptr<ReadableObject>> MemoryStore::Open(std::string_view key) {
  TQKV_RETURN_IF_ERROR(ValidateKey(key));
  std::shared_ptr<const Blob> blob;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    auto it = state_->objects.find(key);
    if (it == state_->objects.end()) {
      return Status::NotFound("no memory object " + std::string(key));
    }
    blob = it->second;
  }
  return std::unique_ptr<ReadableObject>(
      std::make_unique<MemoryReadable>(std::string(key), std::move(blob)));
}

Status MemoryStore::Remove(std::string_view key) {
  TQKV_RETURN_IF_ERROR(ValidateKey(key));
  std::lock_guard<std::mutex> lock(state_->mu);
  auto it = state_->objects.find(key);
  if (it == state_->objects.end()) {
    return Status::NotFound("no memory object " + std::string(key));
  }
  state_->objects.erase(it);
  return Status::Ok();
}

Result<std::vector<ObjectInfo>> MemoryStore::List(std::string_view prefix) {
  std::vector<ObjectInfo> out;
  std::lock_guard<std::mutex> lock(state_->mu);
  for (auto it = state_->objects.lower_bound(prefix); it != state_->objects.end(); ++it) {
    if (it->first.compare(0, prefix.size(), prefix) != 0) break;
    out.push_back(ObjectInfo{it->first, it->second->bytes.size(), it->second->mtime_ns});
  }
  return out;
}

}  // namespace tqkv
