// PlanCapacity: the codec's session bytes are those of a real checkpoint, and the arithmetic.
#include <gtest/gtest.h>

#include <cmath>

#include "tqkv/capacity.h"
#include "tqkv/store.h"
#include "tqkv/synthetic_source.h"

namespace tqkv {
namespace {

CapacityOptions Options() {
  CapacityOptions o;
  o.model = "toy";
  o.geometry = ModelGeometry{4, 2, 64};
  o.tokens = 300;
  o.checkpoint.codec = ParseCodecSpec("tq3").value();
  o.capacity_bytes = 1e9;
  return o;
}

TEST(PlanCapacity, CountsTheContainerACheckpointWrites) {
  const CapacityOptions o = Options();
  auto plan = PlanCapacity(o);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  auto store = OpenStore("memory://").value();
  auto source = MakeSyntheticSource(o.model, o.geometry, DType::kF16, o.tokens, 1);
  auto st = Checkpoint(*source, o.checkpoint, *store, "k");
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(plan->codec_session_bytes, st->bytes_written);
  EXPECT_EQ(plan->fp16_session_bytes, 2ull * 4 * 300 * 2 * 64 * 2);
  EXPECT_DOUBLE_EQ(plan->ratio, static_cast<double>(plan->fp16_session_bytes) /
                                    static_cast<double>(plan->codec_session_bytes));
  EXPECT_EQ(plan->sessions_fp16, std::floor(1e9 / plan->fp16_session_bytes));
  EXPECT_EQ(plan->sessions_codec, std::floor(1e9 / plan->codec_session_bytes));
  EXPECT_EQ(plan->per_gpu_bytes_codec, 0.0);  // no per-GPU figure asked for
  EXPECT_EQ(plan->cluster_bytes_codec, 0.0);
}

TEST(PlanCapacity, PerGpuClusterAndExactRows) {
  CapacityOptions o = Options();
  o.per_gpu_bytes = 16e12;
  o.gpus = 10;
  auto plain = PlanCapacity(o);
  ASSERT_TRUE(plain.ok());
  EXPECT_DOUBLE_EQ(plain->per_gpu_bytes_codec, 16e12 / plain->ratio);
  EXPECT_DOUBLE_EQ(plain->cluster_bytes_fp16, 16e13);
  EXPECT_DOUBLE_EQ(plain->cluster_bytes_codec, 16e13 / plain->ratio);
  o.checkpoint.exact_head = 4;
  o.checkpoint.exact_tail = 16;
  auto exact = PlanCapacity(o);
  ASSERT_TRUE(exact.ok());
  // 20 tokens x 2 (K, V) x 4 layers x 2 heads x 64 dims at f16, plus at most a page per layer.
  const uint64_t rows = 20ull * 2 * 4 * 2 * 64 * 2;
  EXPECT_GE(exact->codec_session_bytes, plain->codec_session_bytes + rows);
  EXPECT_LE(exact->codec_session_bytes, plain->codec_session_bytes + rows + 4 * 4096);
}

TEST(PlanCapacity, BadGeometryIsAnError) {
  CapacityOptions o = Options();
  o.geometry = ModelGeometry{0, 2, 64};
  EXPECT_FALSE(PlanCapacity(o).ok());
}

}  // namespace
}  // namespace tqkv
