#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include "store/store_internal.h"
#include "store/testing/store_testing.h"

namespace tqkv {

namespace {

using Clock = std::chrono::steady_clock;

// A token bucket kept as a "paid until" time: each transfer pushes it by bytes / rate, and the
// caller sleeps until then. Idle time earns at most `burst` bytes of credit, so a long transfer
// takes (bytes - burst) / rate. Time lost to oversleeping (a loaded machine wakes sleepers late)
// is not idle time: the next transfer may use it, so the long-run rate stays on target.
class TokenBucket {
 public:
  TokenBucket(double bytes_per_sec, uint64_t burst_bytes) : rate_(bytes_per_sec) {
    if (rate_ <= 0) return;  // unlimited
    const double burst =
        burst_bytes > 0 ? static_cast<double>(burst_bytes)
                        : std::max(64.0 * 1024.0, bytes_per_sec * 0.002);  // 2 ms worth
    credit_ = std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(std::min(burst / rate_, 3600.0)));
    paid_until_ = Clock::now() - credit_;
  }

  void Acquire(uint64_t bytes) {
    if (rate_ <= 0 || bytes == 0) return;
    Clock::time_point wake;
    {
      std::lock_guard<std::mutex> lock(mu_);
      const Clock::time_point now = Clock::now();
      paid_until_ = std::max(paid_until_, now - credit_ - overslept_);
      overslept_ = Clock::duration::zero();
      paid_until_ += std::chrono::duration_cast<Clock::duration>(
          std::chrono::duration<double>(std::min(static_cast<double>(bytes) / rate_, 1e6)));
      wake = paid_until_;
      if (wake <= now) return;
    }
    std::this_thread::sleep_until(wake);
    const Clock::duration late = Clock::now() - wake;
    std::lock_guard<std::mutex> lock(mu_);
    overslept_ = std::max(overslept_, late);
  }

 private:
  const double rate_;
  Clock::duration credit_{};
  std::mutex mu_;
  Clock::time_point paid_until_;
  Clock::duration overslept_{};
};

std::shared_ptr<TokenBucket> MakeBucket(double rate, uint64_t burst) {
  return std::make_shared<TokenBucket>(rate, burst);
}

// Every byte but RFC 3986's unreserved ones as %XX: the inner URI as one option value.
std::string PercentEncode(std::string_view s) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
        c == '.' || c == '_' || c == '~') {
      out += c;
    } else {
      out += {'%', kHex[u >> 4], kHex[u & 15]};
    }
  }
  return out;
}

class ThrottledReadable final : public ReadableObject {
 public:
  ThrottledReadable(std::unique_ptr<ReadableObject> base, std::shared_ptr<TokenBucket> bucket)
      : base_(std::move(base)), bucket_(std::move(bucket)) {}

  uint64_t Size() const override { return base_->Size(); }
  uint64_t BytesRead() const override { return base_->BytesRead(); }
  ReadPathBytes PathBytes() const override { return base_->PathBytes(); }
  Status DropCache() override { return base_->DropCache(); }

  Status ReadAt(uint64_t offset, std::span<uint8_t> dst) override {
    if (offset <= Size() && dst.size() <= Size() - offset) bucket_->Acquire(dst.size());
    return base_->ReadAt(offset, dst);
  }

  Status ReadBatch(std::span<const ReadRequest> reqs) override {
    uint64_t total = 0;
    for (const ReadRequest& r : reqs) total += r.dst.size();
    bucket_->Acquire(total);
    return base_->ReadBatch(reqs);
  }

 private:
  std::unique_ptr<ReadableObject> base_;
  std::shared_ptr<TokenBucket> bucket_;
};

class ThrottledWritable final : public WritableObject, public store_internal::Crashable {
 public:
  ThrottledWritable(std::unique_ptr<WritableObject> base, std::shared_ptr<TokenBucket> bucket)
      : base_(std::move(base)), bucket_(std::move(bucket)) {}

  Status Append(std::span<const uint8_t> src) override {
    bucket_->Acquire(src.size());
    return base_->Append(src);
  }
  Status Commit() override { return base_->Commit(); }
  Status Abort() override { return base_->Abort(); }
  uint64_t BytesWritten() const override { return base_->BytesWritten(); }
  void SimulateCrash() override {
    if (!store_internal::TrySimulateCrash(base_.get())) (void)base_->Abort();
  }

 private:
  std::unique_ptr<WritableObject> base_;
  std::shared_ptr<TokenBucket> bucket_;
};

}  // namespace

struct ThrottledStore::State {
  std::shared_ptr<TokenBucket> read;   // per-store buckets (unused when per_object)
  std::shared_ptr<TokenBucket> write;
};

ThrottledStore::ThrottledStore(std::unique_ptr<Store> base, const ThrottleOptions& options)
    : StoreWrapper(std::move(base)), options_(options), state_(std::make_shared<State>()) {
  state_->read = MakeBucket(options_.read_bytes_per_sec, options_.burst_bytes);
  state_->write = MakeBucket(options_.write_bytes_per_sec, options_.burst_bytes);
}

ThrottledStore::~ThrottledStore() = default;

std::string ThrottledStore::Uri() const {
  char rates[96];
  std::snprintf(rates, sizeof(rates), "&read_rate=%.0f&write_rate=%.0f&per_object=%d",
                options_.read_bytes_per_sec, options_.write_bytes_per_sec,
                options_.per_object ? 1 : 0);
  std::string uri = "throttle://?store=" + PercentEncode(base_->Uri()) + rates;
  if (options_.burst_bytes > 0) uri += "&burst=" + std::to_string(options_.burst_bytes);
  return uri;
}

Result<std::unique_ptr<WritableObject>> ThrottledStore::Create(std::string_view key) {
  TQKV_ASSIGN_OR_RETURN(std::unique_ptr<WritableObject> base, base_->Create(key));
  auto bucket = options_.per_object
                    ? MakeBucket(options_.write_bytes_per_sec, options_.burst_bytes)
                    : state_->write;
  return std::unique_ptr<WritableObject>(
      std::make_unique<ThrottledWritable>(std::move(base), std::move(bucket)));
}

Result<std::unique_ptr<ReadableObject>> ThrottledStore::Open(std::string_view key) {
  TQKV_ASSIGN_OR_RETURN(std::unique_ptr<ReadableObject> base, base_->Open(key));
  auto bucket = options_.per_object
                    ? MakeBucket(options_.read_bytes_per_sec, options_.burst_bytes)
                    : state_->read;
  return std::unique_ptr<ReadableObject>(
      std::make_unique<ThrottledReadable>(std::move(base), std::move(bucket)));
}

Result<std::unique_ptr<Store>> OpenThrottledStoreFromUri(const StoreUri& uri) {
  if (!uri.authority.empty() || !(uri.path.empty() || uri.path == "/")) {
    return Status::InvalidArgument("throttle:// takes no host or path (the store is its store= "
                                   "option), got " + uri.authority + uri.path);
  }
  store_internal::UriOptions opts(uri);
  const std::string* inner = opts.Find("store");
  if (inner == nullptr || inner->empty()) {
    return Status::InvalidArgument("throttle:// needs store=<the inner store's URI, "
                                   "percent-encoded>");
  }
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  ThrottleOptions o;
  uint64_t read = 0, write = 0;
  TQKV_RETURN_IF_ERROR(opts.GetBytes("read_rate", 0, kMax, &read));
  TQKV_RETURN_IF_ERROR(opts.GetBytes("write_rate", 0, kMax, &write));
  TQKV_RETURN_IF_ERROR(opts.GetBool("per_object", &o.per_object));
  TQKV_RETURN_IF_ERROR(opts.GetBytes("burst", 1, kMax, &o.burst_bytes));
  TQKV_RETURN_IF_ERROR(opts.Finish());
  o.read_bytes_per_sec = static_cast<double>(read);
  o.write_bytes_per_sec = static_cast<double>(write);
  TQKV_ASSIGN_OR_RETURN(std::unique_ptr<Store> base, OpenStore(*inner));
  return std::unique_ptr<Store>(std::make_unique<ThrottledStore>(std::move(base), o));
}

Status RegisterTestingStoreSchemes() {
  static const Status registered = RegisterStoreScheme("throttle", OpenThrottledStoreFromUri);
  return registered;
}

}  // namespace tqkv
