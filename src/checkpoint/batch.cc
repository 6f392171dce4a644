// Batch restore and checkpoint (include/tqkv/batch.h): objects taken in order by a few worker
// threads, each object through the one restore (or checkpoint) pipeline with the shared pool;
// the restore's per-layer readiness is the minimum over the objects still expected to succeed.
#include "tqkv/batch.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "tqkv/kv_layout.h"

namespace tqkv {
namespace {

using Clock = std::chrono::steady_clock;

// Runs fn(i) for i in [0, n) on up to `in_flight` threads (the caller's among them), starting
// them in order. After a failure no object past it starts; returns the index of the first
// failed object (n when none) and its status.
template <typename Fn>
std::pair<size_t, Status> RunInOrder(size_t n, size_t in_flight, const Fn& fn) {
  std::atomic<size_t> next{0};
  std::mutex mu;
  size_t failed = n;
  Status error;
  const auto work = [&] {
    for (;;) {
      const size_t i = next.fetch_add(1);
      {
        std::lock_guard<std::mutex> lock(mu);
        if (i >= n || i > failed) return;
      }
      Status s = fn(i);
      if (!s.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        if (i < failed) {
          failed = i;
          error = std::move(s);
        }
      }
    }
  };
  std::vector<std::thread> threads;
  const size_t extra = std::min(n, std::max<size_t>(1, in_flight)) - (n > 0 ? 1 : 0);
  for (size_t t = 0; t < extra; ++t) threads.emplace_back(work);
  work();
  for (std::thread& t : threads) t.join();
  return {failed, std::move(error)};
}

// Per-layer readiness of a batch: layer l is ready when every object before the first failure
// has finished it. Callbacks run outside the state lock, in layer order, each layer once.
class BatchReadiness {
 public:
  BatchReadiness(size_t objects, uint32_t layers, const std::function<Status(uint32_t)>& ready)
      : done_(objects, 0), layers_(layers), ready_(ready), live_(objects) {}

  Status LayerDone(size_t object) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++done_[object];
    }
    return Fire();
  }
  Status Failed(size_t object) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      live_ = std::min(live_, object);
    }
    return Fire();
  }
  // Every object has ended: whatever layers are left are in place for every restored object.
  Status Finish() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      finished_ = true;
    }
    return Fire();
  }
  Clock::time_point first_layer() const { return first_; }

 private:
  uint32_t Frontier() {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return layers_;
    uint32_t f = layers_;
    for (size_t i = 0; i < live_; ++i) f = std::min<uint32_t>(f, done_[i]);
    return f;
  }
  Status Fire() {
    std::lock_guard<std::mutex> lock(fire_mu_);
    if (!error_.ok()) return error_;
    for (uint32_t f = Frontier(); fired_ < f; f = Frontier()) {
      if (fired_ == 0) first_ = Clock::now();
      if (ready_) {
        Status s = ready_(fired_);
        if (!s.ok()) return error_ = std::move(s);
      }
      ++fired_;
    }
    return Status::Ok();
  }

  std::mutex mu_;
  std::vector<uint32_t> done_;  // layers finished per object
  const uint32_t layers_;
  const std::function<Status(uint32_t)>& ready_;
  size_t live_;  // objects [0, live_) are still expected to succeed
  bool finished_ = false;
  std::mutex fire_mu_;
  uint32_t fired_ = 0;
  Status error_;
  Clock::time_point first_{};
};

Status NamedError(const Status& s, size_t i, size_t n, const std::string& key) {
  return s.WithContext("object " + std::to_string(i + 1) + " of " + std::to_string(n) + " (" +
                       key + ")");
}

Status CheckPaged(const LayoutTensors& t, const char* what) {
  if (t.layout.block_tokens == 0 || (t.v_layout && t.v_layout->block_tokens == 0)) {
    return Status::InvalidArgument(std::string(what) + ": a batch moves paged tensors "
                                   "(block_tokens > 0), one block list per object");
  }
  return Status::Ok();
}

}  // namespace

Status RestoreBatch(Store& store, std::span<const BatchObject> objects, const LayoutTensors& dst,
                    const RestoreOptions& options, const BatchOptions& batch, BatchStats* stats) {
  const auto t0 = Clock::now();
  BatchStats st;
  TQKV_RETURN_IF_ERROR(CheckPaged(dst, "RestoreBatch"));
  const size_t n = objects.size();
  BatchReadiness ready(n, dst.geometry.layers, options.layer_ready);
  std::vector<RestoreStats> per(n);
  auto [failed, error] = RunInOrder(n, batch.objects_in_flight, [&](size_t i) -> Status {
    const BatchObject& o = objects[i];
    LayoutTensors mine = dst;
    mine.SetBlockIds(o.block_ids);
    if (o.tokens != 0) mine.tokens = o.tokens;
    RestoreOptions opts = options;
    if (!o.model.empty()) opts.expect_model = o.model;
    opts.layer_ready = [&ready, i](uint32_t) { return ready.LayerDone(i); };
    Status s = RestoreInto(store, o.key, mine, opts, &per[i]);
    if (!s.ok()) {
      s = NamedError(s, i, n, o.key);
      Status r = ready.Failed(i);  // the layers no longer wait for this object
      if (!r.ok()) return r;
    }
    return s;
  });
  Status finish = ready.Finish();
  for (size_t i = 0; i < failed; ++i) {
    st.bytes += per[i].bytes_read;
    st.fp16_bytes += per[i].fp16_bytes;
    st.tokens += per[i].tokens;
  }
  st.done = failed;
  st.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (ready.first_layer() != Clock::time_point{}) {
    st.first_layer_seconds = std::chrono::duration<double>(ready.first_layer() - t0).count();
  }
  if (stats != nullptr) *stats = st;
  if (!error.ok()) return error;
  return finish;
}

Status CheckpointBatch(Store& store, std::span<const BatchObject> objects,
                       const LayoutTensors& src, const CheckpointOptions& options,
                       const BatchOptions& batch, BatchStats* stats) {
  const auto t0 = Clock::now();
  BatchStats st;
  TQKV_RETURN_IF_ERROR(CheckPaged(src, "CheckpointBatch"));
  if (options.exact_tail != 0) {
    return Status::InvalidArgument(
        "CheckpointBatch: exact_tail must be 0 (the objects are chunks of a prompt whose last "
        "tokens change every turn; exact_head applies to the prompt's first tokens)");
  }
  const size_t n = objects.size();
  std::vector<CheckpointStats> per(n);
  std::vector<char> skipped(n, 0);
  auto [failed, error] = RunInOrder(n, batch.objects_in_flight, [&](size_t i) -> Status {
    const BatchObject& o = objects[i];
    if (batch.skip_existing && store.Open(o.key).ok()) {
      skipped[i] = 1;
      return Status::Ok();
    }
    LayoutTensors mine = src;
    mine.SetBlockIds(o.block_ids);
    if (o.tokens != 0) mine.tokens = o.tokens;
    Status s = ValidateKvLayout(mine.layout, mine.geometry, mine.tokens, mine.tensor_elems);
    if (s.ok() && mine.v_layout) {
      s = ValidateKvLayout(*mine.v_layout, mine.geometry, mine.tokens, mine.tensor_elems);
    }
    if (!s.ok()) return NamedError(s, i, n, o.key);
    LayoutKvSource source(o.model, mine.geometry, mine.dtype, mine.tokens, mine.layout,
                          {mine.k.begin(), mine.k.end()}, {mine.v.begin(), mine.v.end()},
                          mine.v_layout);
    CheckpointOptions opts = options;
    opts.exact_head = o.first_token < options.exact_head
                          ? static_cast<uint32_t>(options.exact_head - o.first_token)
                          : 0;
    Result<CheckpointStats> r = Checkpoint(source, opts, store, o.key);
    if (!r.ok()) return NamedError(r.status(), i, n, o.key);
    per[i] = std::move(r).value();
    return Status::Ok();
  });
  for (size_t i = 0; i < failed; ++i) {
    st.skipped += skipped[i];
    st.bytes += per[i].bytes_written;
    st.fp16_bytes += per[i].fp16_bytes;
    if (!skipped[i]) st.tokens += objects[i].tokens != 0 ? objects[i].tokens : src.tokens;
  }
  st.done = failed;
  st.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (stats != nullptr) *stats = st;
  return error;
}

}  // namespace tqkv
