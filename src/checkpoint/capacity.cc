// PlanCapacity: one real checkpoint into a counting store, then arithmetic.
#include "tqkv/capacity.h"

#include <cmath>

#include "tqkv/store.h"
#include "tqkv/synthetic_source.h"

namespace tqkv {
namespace {

// A store that keeps nothing and counts the bytes of each committed object.
class CountingStore final : public Store {
 public:
  class Writer final : public WritableObject {
   public:
    explicit Writer(uint64_t* committed) : committed_(committed) {}
    Status Append(std::span<const uint8_t> src) override {
      bytes_ += src.size();
      return Status::Ok();
    }
    Status Commit() override {
      *committed_ = bytes_;
      return Status::Ok();
    }
    Status Abort() override { return Status::Ok(); }
    uint64_t BytesWritten() const override { return bytes_; }

   private:
    uint64_t* committed_;
    uint64_t bytes_ = 0;
  };
  std::string_view Name() const override { return "counting"; }
  std::string Uri() const override { return "counting://"; }
  StoreCaps Caps() const override { return {}; }
  Result<std::unique_ptr<WritableObject>> Create(std::string_view) override {
    return std::unique_ptr<WritableObject>(new Writer(&committed_));
  }
  Result<std::unique_ptr<ReadableObject>> Open(std::string_view key) override {
    return Status::NotFound(std::string(key));
  }
  Status Remove(std::string_view key) override { return Status::NotFound(std::string(key)); }
  Result<std::vector<ObjectInfo>> List(std::string_view) override {
    return std::vector<ObjectInfo>{};
  }
  uint64_t committed() const { return committed_; }

 private:
  uint64_t committed_ = 0;
};

}  // namespace

Result<CapacityPlan> PlanCapacity(const CapacityOptions& o) {
  CountingStore counter;
  auto source = MakeSyntheticSource(o.model, o.geometry, DType::kF16, o.tokens, 1);
  TQKV_ASSIGN_OR_RETURN(CheckpointStats st, Checkpoint(*source, o.checkpoint, counter, "capacity"));
  CapacityPlan p;
  p.fp16_session_bytes = st.fp16_bytes;
  p.codec_session_bytes = counter.committed();
  const double fp16 = static_cast<double>(p.fp16_session_bytes);
  const double codec = static_cast<double>(p.codec_session_bytes);
  p.ratio = fp16 / codec;
  p.sessions_fp16 = std::floor(o.capacity_bytes / fp16);
  p.sessions_codec = std::floor(o.capacity_bytes / codec);
  p.per_gpu_bytes_codec = o.per_gpu_bytes / p.ratio;
  p.cluster_bytes_fp16 = o.per_gpu_bytes * o.gpus;
  p.cluster_bytes_codec = o.per_gpu_bytes * o.gpus / p.ratio;
  return p;
}

}  // namespace tqkv
