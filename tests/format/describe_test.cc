// DescribeContainer / ContainerDescriptionJson: what `tqkv inspect` shows, from a real checkpoint.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "tqkv/checkpoint.h"
#include "tqkv/settings.h"
#include "tqkv/describe.h"
#include "tqkv/store.h"
#include "tqkv/synthetic_source.h"

namespace tqkv {
namespace {

struct Described {
  std::unique_ptr<Store> store;
  ContainerDescription d;
  size_t chunks = 0;
};

Described Make(const CheckpointOptions& opts, uint64_t tokens) {
  Described out;
  out.store = OpenStore("memory://").value();
  const ModelGeometry g{3, 2, 64};
  auto source = MakeSyntheticSource("toy", g, DType::kF16, tokens, 5);
  EXPECT_TRUE(Checkpoint(*source, opts, *out.store, "s").ok());
  auto object = out.store->Open("s").value();
  auto reader = ContainerReader::Open(object.get(), "s").value();
  out.d = DescribeContainer(*reader);
  out.chunks = reader->chunks().size();
  return out;
}

TEST(DescribeContainer, FiguresAndLabels) {
  CheckpointOptions opts;
  opts.codec = ParseCodecSpec("tq3").value();
  opts.layer_overrides.push_back(ParseLayerCodec("2:tq4").value());
  opts.exact_head = 2;
  opts.exact_tail = 5;
  opts.token_block = 16;
  const Described x = Make(opts, 40);
  const ContainerDescription& d = x.d;
  EXPECT_EQ(d.header.model, "toy");
  EXPECT_EQ(d.header.tokens, 40u);
  EXPECT_EQ(d.header.exact_head, 2u);
  EXPECT_EQ(d.header.exact_tail, 5u);
  EXPECT_EQ(d.fp16_bytes, 2ull * 3 * 40 * 2 * 64 * 2);
  ASSERT_GT(d.file_bytes, 0u);
  EXPECT_DOUBLE_EQ(d.ratio, static_cast<double>(d.fp16_bytes) / d.file_bytes);
  EXPECT_DOUBLE_EQ(d.bits_per_value, 8.0 * d.file_bytes / (2.0 * 3 * 40 * 2 * 64));
  EXPECT_EQ(d.codec, "tq3");
  ASSERT_EQ(d.codecs.size(), 2u);
  EXPECT_EQ(d.codecs[d.header.layer_codec[2]], "tq4");
  EXPECT_EQ(d.chunks.size(), x.chunks);
  std::set<std::string> labels;
  for (const ChunkEntry& e : d.chunks) labels.insert(std::string(ChunkTypeLabel(e)));
  EXPECT_EQ(labels, (std::set<std::string>{"K", "V", "exact", "means"}));
}

TEST(DescribeContainer, JsonWithAndWithoutChunks) {
  CheckpointOptions opts;
  opts.codec = ParseCodecSpec("tq2.5").value();  // split: a meta chunk per layer
  const Described x = Make(opts, 20);
  const auto j = nlohmann::json::parse(ContainerDescriptionJson(x.d, false));
  EXPECT_FALSE(j.contains("chunks"));
  EXPECT_EQ(j["codec"], "tq2.5");
  EXPECT_EQ(j["tokens"], 20);
  EXPECT_EQ(j["layers"], 3);
  EXPECT_EQ(j["source_dtype"], "f16");
  EXPECT_EQ(j["exact_tokens"]["first"], 0);
  EXPECT_EQ(j["key_means"]["block"], 20);  // the default 128, one block for 20 tokens
  EXPECT_EQ(j["key_means"]["dtype"], "f16");
  EXPECT_EQ(j["format_version"], 6);  // key means and the guard's figures
  EXPECT_EQ(j["guard"]["recorded"], true);
  EXPECT_EQ(j["guard"]["layers"].size(), 3u);
  EXPECT_EQ(j["guard"]["sample_stride"], 1);
  EXPECT_GT(j["guard"]["layers"][0]["k"]["rel_err"].get<double>(), 0.0);
  EXPECT_EQ(j["allocated_bits"], 0.0);
  EXPECT_EQ(j["file_bytes"], x.d.file_bytes);
  EXPECT_EQ(j["layer_codec"].size(), 3u);
  const auto c = nlohmann::json::parse(ContainerDescriptionJson(x.d, true));
  ASSERT_EQ(c["chunks"].size(), x.chunks);
  EXPECT_EQ(c["chunks"][0]["type"], "meta");
  EXPECT_EQ(c["chunks"][0]["offset"], x.d.chunks[0].offset);
  EXPECT_EQ(c["chunks"][0]["checksum"], x.d.chunks[0].checksum);
}

}  // namespace
}  // namespace tqkv
