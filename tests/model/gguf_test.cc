// GGUF parsing: every metadata value type (arrays included), alignment, tensor table checks.
#include "model/gguf.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>

#include "model/model.h"
#include "model_test_util.h"

namespace tqkv::model {
namespace {

using testing::GgufBuilder;

Result<std::unique_ptr<GgufFile>> ParseBytes(const std::string& bytes, const std::string& name) {
  const std::string path = testing::TempPath(name);
  testing::WriteFile(path, bytes);
  auto g = GgufFile::Open(path);
  std::remove(path.c_str());
  return g;
}

TEST(GgufTest, ParsesAllValueTypesAndTensors) {
  GgufBuilder b;
  b.KvScalar<uint8_t>("u8", GgufValueType::kUint8, 200);
  b.KvScalar<int8_t>("i8", GgufValueType::kInt8, -100);
  b.KvScalar<uint16_t>("u16", GgufValueType::kUint16, 60000);
  b.KvScalar<int16_t>("i16", GgufValueType::kInt16, -30000);
  b.KvU32("u32", 4000000000u);
  b.KvI32("i32", -2000000000);
  b.KvF32("f32", 1.5f);
  b.KvBool("bool", true);
  b.KvStr("str", "hello");
  b.KvScalar<uint64_t>("u64", GgufValueType::kUint64, 1ull << 40);
  b.KvScalar<int64_t>("i64", GgufValueType::kInt64, -(1ll << 40));
  b.KvScalar<double>("f64", GgufValueType::kFloat64, 0.25);
  b.KvStrArray("strs", {"a", "", "ccc"});
  b.KvArray<int32_t>("ints", GgufValueType::kInt32, {1, -2, 3});
  b.KvArray<float>("floats", GgufValueType::kFloat32, {0.5f});
  {  // array of arrays of u8
    std::string e;
    GgufBuilder::Put<uint32_t>(&e, static_cast<uint32_t>(GgufValueType::kArray));
    GgufBuilder::Put<uint64_t>(&e, 2);
    for (int k = 0; k < 2; ++k) {
      GgufBuilder::Put<uint32_t>(&e, static_cast<uint32_t>(GgufValueType::kUint8));
      GgufBuilder::Put<uint64_t>(&e, 2);
      GgufBuilder::Put<uint8_t>(&e, static_cast<uint8_t>(k));
      GgufBuilder::Put<uint8_t>(&e, 9);
    }
    b.KvRaw("nested", GgufValueType::kArray, e);
  }
  b.KvU32("general.alignment", 64);
  std::vector<float> x(64 * 3);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i) * 0.01f;
  b.Matrix("m.q41", 64, 3, GgmlType::kQ4_1, x.data());
  b.Matrix("m.f16", 64, 3, GgmlType::kF16, x.data());
  b.Vector("v", 5, x.data());
  for (uint32_t version : {2u, 3u}) {
    auto g = ParseBytes(b.Build(version, 64), "all.gguf");
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    const GgufFile& f = **g;
    EXPECT_EQ(f.version(), version);
    EXPECT_EQ(f.alignment(), 64u);
    EXPECT_EQ(f.data_offset() % 64, 0u);
    EXPECT_EQ(*f.GetUint("u8"), 200u);
    EXPECT_EQ(f.Find("i8")->AsInt(), -100);
    EXPECT_EQ(*f.GetUint("u16"), 60000u);
    EXPECT_EQ(f.Find("i16")->AsInt(), -30000);
    EXPECT_EQ(*f.GetUint("u32"), 4000000000u);
    EXPECT_EQ(f.Find("i32")->AsInt(), -2000000000);
    EXPECT_FALSE(f.GetUint("i32").ok());
    EXPECT_EQ(*f.GetDouble("f32"), 1.5);
    EXPECT_TRUE(f.Find("bool")->b);
    EXPECT_EQ(*f.GetString("str"), "hello");
    EXPECT_EQ(*f.GetUint("u64"), 1ull << 40);
    EXPECT_EQ(f.Find("i64")->AsInt(), -(1ll << 40));
    EXPECT_EQ(*f.GetDouble("f64"), 0.25);
    EXPECT_TRUE(f.GetString("u8").status().IsCorruption());
    EXPECT_TRUE(f.GetUint("missing").status().IsNotFound());
    EXPECT_EQ(*f.GetUintOr("missing", 7), 7u);
    const GgufValue* strs = f.Find("strs");
    ASSERT_NE(strs, nullptr);
    ASSERT_EQ(strs->count, 3u);
    EXPECT_EQ(strs->ArrayElement(2).str, "ccc");
    EXPECT_EQ(strs->ArrayStrings(), (std::vector<std::string_view>{"a", "", "ccc"}));
    EXPECT_EQ(f.Find("ints")->ArrayElement(1).AsInt(), -2);
    EXPECT_EQ(f.Find("ints")->ArrayElement(3).type, GgufValueType::kUint8);  // out of range
    EXPECT_EQ(f.Find("floats")->ArrayElement(0).AsDouble(), 0.5);
    EXPECT_TRUE(f.Find("ints")->ArrayStrings().empty());
    const GgufValue* nested = f.Find("nested");
    ASSERT_EQ(nested->count, 2u);
    const GgufValue inner = nested->ArrayElement(1);
    EXPECT_EQ(inner.count, 2u);
    EXPECT_EQ(inner.ArrayElement(0).AsUint(), 1u);
    EXPECT_EQ(inner.ArrayElement(1).AsUint(), 9u);
    ASSERT_EQ(f.tensors().size(), 3u);
    const GgufTensorInfo* q = f.FindTensor("m.q41");
    ASSERT_NE(q, nullptr);
    EXPECT_EQ(q->type, GgmlType::kQ4_1);
    EXPECT_EQ(q->ne[0], 64u);
    EXPECT_EQ(q->ne[1], 3u);
    EXPECT_EQ(q->bytes, 3u * 2 * 20);
    std::vector<float> row(64);
    DequantizeRow(GgmlType::kF16, f.FindTensor("m.f16")->data + 128, 64, row.data());
    EXPECT_NEAR(row[10], x[74], 1e-3);
    EXPECT_EQ(f.FindTensor("v")->elements, 5u);
    EXPECT_EQ(f.FindTensor("nope"), nullptr);
  }
}

TEST(GgufTest, HugeArrayClaimsAreRejectedWithoutAllocating) {
  GgufBuilder b;
  std::string e;
  GgufBuilder::Put<uint32_t>(&e, static_cast<uint32_t>(GgufValueType::kString));
  GgufBuilder::Put<uint64_t>(&e, uint64_t{1} << 61);
  b.KvRaw("a", GgufValueType::kArray, e);
  auto g = ParseBytes(b.Build(), "huge.gguf");
  ASSERT_FALSE(g.ok());
  EXPECT_TRUE(g.status().IsCorruption());
  // A large but real u8 array is kept in the file, not expanded.
  GgufBuilder c;
  c.KvArray<uint8_t>("bytes", GgufValueType::kUint8, std::vector<uint8_t>(1 << 20, 7));
  auto h = ParseBytes(c.Build(), "big.gguf");
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ((*h)->Find("bytes")->count, 1u << 20);
  EXPECT_EQ((*h)->Find("bytes")->ArrayElement((1 << 20) - 1).AsUint(), 7u);
}

TEST(GgufTest, RejectsBadTensorTables) {
  auto one = [](std::vector<uint64_t> ne, uint32_t type, uint64_t bytes) {
    GgufBuilder b;
    b.Tensor("t", std::move(ne), static_cast<GgmlType>(type), std::string(bytes, '\0'));
    return b;
  };
  // Unsupported type (q6_K = 14) -> Unsupported, naming the type.
  auto g = ParseBytes(one({32}, 14, 64).Build(), "t14.gguf");
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(g.status().message().find("q6_k"), std::string::npos) << g.status().ToString();
  // Row not a multiple of the block.
  EXPECT_TRUE(ParseBytes(one({33}, 2, 64).Build(), "t33.gguf").status().IsCorruption());
  // Zero dimension; shape product overflow.
  EXPECT_TRUE(ParseBytes(one({0}, 0, 0).Build(), "t0.gguf").status().IsCorruption());
  EXPECT_TRUE(
      ParseBytes(one({1ull << 40, 1ull << 40}, 0, 4).Build(), "tov.gguf").status().IsCorruption());
  // Data past the end of the file.
  EXPECT_TRUE(ParseBytes(one({64, 64}, 0, 100).Build(), "tshort.gguf").status().IsCorruption());
  // Duplicate keys and tensors.
  GgufBuilder d;
  d.KvU32("k", 1);
  d.KvU32("k", 2);
  EXPECT_TRUE(ParseBytes(d.Build(), "dup.gguf").status().IsCorruption());
  GgufBuilder e;
  e.Tensor("t", {8}, GgmlType::kF32, std::string(32, '\0'));
  e.Tensor("t", {8}, GgmlType::kF32, std::string(32, '\0'));
  EXPECT_TRUE(ParseBytes(e.Build(), "dupt.gguf").status().IsCorruption());
  // Unknown metadata value type, bad bool, bad alignment.
  GgufBuilder u;
  u.KvRaw("x", static_cast<GgufValueType>(13), "");
  EXPECT_TRUE(ParseBytes(u.Build(), "u13.gguf").status().IsCorruption());
  GgufBuilder bb;
  bb.KvScalar<uint8_t>("b", GgufValueType::kBool, 2);
  EXPECT_TRUE(ParseBytes(bb.Build(), "bool.gguf").status().IsCorruption());
  GgufBuilder al;
  al.KvU32("general.alignment", 0);
  EXPECT_TRUE(ParseBytes(al.Build(), "al.gguf").status().IsCorruption());
  // Empty file, not a GGUF.
  EXPECT_TRUE(ParseBytes("", "empty.gguf").status().IsCorruption());
  EXPECT_TRUE(ParseBytes("GGUF", "magic.gguf").status().IsCorruption());
}

TEST(GgufTest, ModelLoaderRejectsNonLlamaOrIncompleteModels) {
  GgufBuilder b;
  b.KvStr("general.architecture", "gpt2");
  const std::string path = testing::TempPath("arch.gguf");
  testing::WriteFile(path, b.Build());
  EXPECT_EQ(Model::Load(path).status().code(), StatusCode::kUnsupported);
  GgufBuilder c;
  c.KvStr("general.architecture", "llama");
  c.KvU32("llama.block_count", 1);
  c.KvU32("llama.embedding_length", 64);
  c.KvU32("llama.attention.head_count", 4);
  c.KvU32("llama.feed_forward_length", 128);
  testing::WriteFile(path, c.Build());
  auto m = Model::Load(path);
  ASSERT_FALSE(m.ok());
  EXPECT_TRUE(m.status().IsCorruption());
  EXPECT_NE(m.status().message().find("token_embd"), std::string::npos) << m.status().ToString();
  std::remove(path.c_str());
}

}  // namespace
}  // namespace tqkv::model
