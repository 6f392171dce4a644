// CodecLabel: stored params name the spec they were resolved from (what `tqkv inspect` shows).
#include <gtest/gtest.h>

#include <string>

#include "tqkv/codec.h"

namespace tqkv {
namespace {

std::string LabelOf(const std::string& spec, uint32_t head_dim) {
  auto s = ParseCodecSpec(spec);
  EXPECT_TRUE(s.ok()) << spec;
  auto c = Codec::Create(*s, head_dim);
  EXPECT_TRUE(c.ok()) << spec << ": " << c.status().ToString();
  return c.ok() ? CodecLabel((*c)->params()) : std::string();
}

TEST(CodecLabel, RawDtypes) {
  EXPECT_EQ(LabelOf("fp16", 128), "fp16");
  EXPECT_EQ(LabelOf("bf16", 128), "bf16");
  EXPECT_EQ(LabelOf("fp32", 64), "fp32");
}

// A preset or a canonical spec comes back as written, whatever the head dimension: the automatic
// rotation stays "auto" for both a power of two (Hadamard) and not (Kronecker); a split preset
// written with rot=haar (what auto gave before the Kronecker kind) says so.
TEST(CodecLabel, InvertsSpecResolution) {
  for (const char* spec : {"tq2", "tq3", "tq4", "tq2.5", "tq3.5"}) {
    for (uint32_t d : {64u, 96u, 128u}) EXPECT_EQ(LabelOf(spec, d), spec) << "d=" << d;
  }
  for (const char* spec : {"tq:b=3,rot=haar", "tq:b=3,rot=hd2", "tq3,norm=f16", "tq2.5,rot=haar"}) {
    const std::string formatted = FormatCodecSpec(*ParseCodecSpec(spec));
    EXPECT_EQ(LabelOf(spec, 128), formatted) << spec;
  }
}

// The seed is not part of the label: two seeds, one name.
TEST(CodecLabel, SeedsAside) {
  EXPECT_EQ(LabelOf("tq:b=3,seed=7", 128), LabelOf("tq3", 128));
}

}  // namespace
}  // namespace tqkv
