// RestoreOptions::prefault: Restore() touches the destination before its clock starts; the data is
// the same and the allocation's time is reported apart (what `tqkv restore` prints as alloc_s).
#include <gtest/gtest.h>

#include <cstring>

#include "tqkv/checkpoint.h"
#include "tqkv/store.h"
#include "tqkv/synthetic_source.h"

namespace tqkv {
namespace {

TEST(RestorePrefault, SameBytesAllocationTimedApart) {
  auto store = OpenStore("memory://").value();
  const ModelGeometry g{4, 2, 64};
  auto source = MakeSyntheticSource("toy", g, DType::kF16, 2000, 3);
  CheckpointOptions co;
  co.codec = ParseCodecSpec("tq3").value();
  ASSERT_TRUE(Checkpoint(*source, co, *store, "p").ok());

  RestoreOptions plain;
  RestoreStats ps;
  auto a = Restore(*store, "p", plain, &ps);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(ps.alloc_seconds, 0.0);

  RestoreOptions pre = plain;
  pre.prefault = true;
  RestoreStats st;
  auto b = Restore(*store, "p", pre, &st);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_GT(st.alloc_seconds, 0.0);
  EXPECT_GE(st.seconds, 0.0);
  EXPECT_LE(st.first_layer_seconds, st.seconds);
  EXPECT_EQ(st.tokens, 2000u);
  const KvCache& x = (*a)->cache();
  const KvCache& y = (*b)->cache();
  for (uint32_t l = 0; l < g.layers; ++l) {
    EXPECT_EQ(std::memcmp(x.k(l), y.k(l), x.tensor_bytes()), 0) << l;
    EXPECT_EQ(std::memcmp(x.v(l), y.v(l), x.tensor_bytes()), 0) << l;
  }
}

}  // namespace
}  // namespace tqkv
