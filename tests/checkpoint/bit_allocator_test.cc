// The bit allocator (docs/codec.md §10): the greedy choice, the exact file size it budgets with,
// and auto:B checkpoints that never exceed their budget and record the choice.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <utility>

#include "checkpoint/bit_allocator.h"
#include "checkpoint/session_util.h"
#include "tqkv/checkpoint.h"
#include "tqkv/settings.h"
#include "tqkv/container.h"
#include "tqkv/describe.h"
#include "tqkv/memory_store.h"

namespace tqkv {
namespace {

TEST(BitAllocator, GreedyTakesTheBestGainPerByteWithinTheBudget) {
  // Two tensors (one layer), three candidates at 10, 20, 40 bytes.
  CandidateErrors errors(1);
  errors[0][0] = {{9, 1, 0}, {3, 1, 0}, {2.5, 1, 0}};  // K: big gain from 10 to 20 bytes
  errors[0][1] = {{1, 1, 0}, {0.5, 1, 0}, {0.1, 1, 0}};
  TensorBytes bytes(1);
  bytes[0][0] = {10, 20, 40};
  bytes[0][1] = {10, 20, 40};
  using Choice = std::vector<std::array<uint8_t, 2>>;
  EXPECT_EQ(*AllocateGreedy(errors, bytes, 20), (Choice{{0, 0}}));
  EXPECT_EQ(*AllocateGreedy(errors, bytes, 30), (Choice{{1, 0}}));  // K first: 0.6 per byte
  EXPECT_EQ(*AllocateGreedy(errors, bytes, 40), (Choice{{1, 1}}));
  // 60: after K 10 -> 20 bytes (0.6 per byte) and V 10 -> 20 (0.05), K 20 -> 40 (0.025) beats
  // V 20 -> 40 (0.02): sum 2.5 + 0.5, less than 3 + 0.1.
  EXPECT_EQ(*AllocateGreedy(errors, bytes, 60), (Choice{{2, 1}}));
  EXPECT_EQ(*AllocateGreedy(errors, bytes, 1000), (Choice{{2, 2}}));
  EXPECT_EQ(AllocateGreedy(errors, bytes, 19).status().code(), StatusCode::kInvalidArgument);
  // A dearer candidate that is worse is never taken.
  errors[0][1][2] = {2, 1, 0};
  EXPECT_EQ(*AllocateGreedy(errors, bytes, 1000), (Choice{{2, 1}}));
}

TEST(BitAllocator, ContainerFileBytesIsWhatTheWriterWrites) {
  auto session = testing_util::MakeSession({3, 2, 64}, 700, DType::kF16, 3);
  for (const char* spec : {"tq3", "tq2.5", "k4v2", "fp16"}) {
    for (uint32_t exact : {0u, 5u}) {
      MemoryStore store;
      CheckpointOptions o;
      SetCodec(o, ParseKvCodecSpec(spec).value());
      o.exact_head = exact;
      auto st = Checkpoint(session->cache(), o, store, "x");
      ASSERT_TRUE(st.ok()) << st.status().ToString();
      auto object = store.Open("x");
      auto reader = ContainerReader::Open(object->get(), "x");
      ASSERT_TRUE(reader.ok());
      EXPECT_EQ(*ContainerFileBytes((*reader)->header()), st->bytes_written) << spec << exact;
    }
  }
}

TEST(BitAllocator, AutoSpecParsesAndFormats) {
  auto a = ParseKvCodecSpec("auto:3.4");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_DOUBLE_EQ(a->auto_bits, 3.4);
  EXPECT_EQ(FormatKvCodecSpec(*a), "auto:3.4");
  for (const char* bad : {"auto:", "auto:0", "auto:-1", "auto:65", "auto:3.4x", "auto:nan"}) {
    EXPECT_EQ(ParseKvCodecSpec(bad).status().code(), StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(ParseLayerCodec("0:auto:3").status().code(), StatusCode::kInvalidArgument);
  CheckpointOptions o;
  SetCodec(o, *a);
  EXPECT_DOUBLE_EQ(o.allocate_bits, 3.4);
  EXPECT_EQ(o.allocate_from, AllocatorFamily::kTurboQuant);
  SetCodec(o, ParseKvCodecSpec("tq3").value());
  EXPECT_EQ(o.allocate_bits, 0);
  // The candidate family: from=tq is the default and is not printed.
  const std::pair<const char*, const char*> round_trips[] = {
      {"auto:2.6,from=kl", "auto:2.6,from=kl"},
      {"auto:3,from=all", "auto:3,from=all"},
      {"auto:3,from=tq", "auto:3"}};
  for (const auto& [text, formatted] : round_trips) {
    auto f = ParseKvCodecSpec(text);
    ASSERT_TRUE(f.ok()) << text << ": " << f.status().ToString();
    EXPECT_EQ(FormatKvCodecSpec(*f), formatted);
  }
  SetCodec(o, ParseKvCodecSpec("auto:2.6,from=kl").value());
  EXPECT_EQ(o.allocate_from, AllocatorFamily::kTransform);
  for (const char* bad : {"auto:3,", "auto:3,from=", "auto:3,from=kl2", "auto:3,form=kl",
                          "auto:3,from=kl,from=tq", "auto:,from=kl"}) {
    EXPECT_EQ(ParseKvCodecSpec(bad).status().code(), StatusCode::kInvalidArgument) << bad;
  }
}

double SumRelErr(const std::vector<TensorCodecError>& e) {
  double s = 0;
  for (const auto& x : e) s += RelativeError(x);
  return s;
}

double BitsPerValue(uint64_t bytes, const ModelGeometry& g, uint64_t tokens) {
  return 8.0 * bytes / (2.0 * g.layers * tokens * g.token_elems());
}

// Layer 0's keys share a dominant mean and the rest is kv data: with key means off the
// allocator must spend its bits where the error is, and never exceed the budget.
TEST(BitAllocator, AutoCheckpointStaysWithinBudgetAndBeatsTheFixedPreset) {
  const ModelGeometry g{4, 2, 128};
  const uint64_t tokens = 512;
  auto session = testing_util::MakeSession(g, tokens, DType::kF32, 9);
  auto shared = testing_util::SharedMeanSession(g, tokens);
  std::memcpy(session->cache().k(0), shared->cache().k(0), session->cache().tensor_bytes());
  for (uint32_t key_means : {0u, kDefaultKeyMeanBlock}) {
    SCOPED_TRACE(key_means);
    // The fixed preset at 3.25 + overhead bits/value.
    MemoryStore store;
    CheckpointOptions fixed;
    fixed.codec = ParseCodecSpec("tq3").value();
    fixed.key_mean_block = key_means;
    auto f = Checkpoint(session->cache(), fixed, store, "fixed");
    ASSERT_TRUE(f.ok());
    const double budget = BitsPerValue(f->bytes_written, g, tokens);
    CheckpointOptions a = fixed;
    a.allocate_bits = budget;
    auto st = Checkpoint(session->cache(), a, store, "auto");
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    EXPECT_LE(BitsPerValue(st->bytes_written, g, tokens), budget);
    EXPECT_LE(SumRelErr(st->codec_error), SumRelErr(f->codec_error));
    ASSERT_EQ(st->allocated.size(), g.layers);
    auto object = store.Open("auto");
    auto reader = ContainerReader::Open(object->get(), "auto");
    ASSERT_TRUE(reader.ok());
    const ContainerHeader& h = (*reader)->header();
    EXPECT_EQ(h.allocated_bits, static_cast<float>(budget));
    EXPECT_EQ(h.codec_error, st->codec_error);
    const ContainerDescription d = DescribeContainer(**reader);
    for (uint32_t l = 0; l < g.layers; ++l) {
      EXPECT_EQ(d.layer_codecs[l], JoinKvLabels(st->allocated[l][0], st->allocated[l][1]));
    }
    if (key_means == 0) {  // the plain shared-mean keys of layer 0 get the most bits there are
      EXPECT_EQ(st->allocated[0][0], "tq4");
    }
    // Tighter and looser budgets: always within them; the loosest has the least error.
    std::vector<double> sums;
    for (double b : {2.5, 3.0, 3.6, 4.6}) {
      a.allocate_bits = b;
      auto s2 = Checkpoint(session->cache(), a, store, "b");
      ASSERT_TRUE(s2.ok()) << b << ": " << s2.status().ToString();
      EXPECT_LE(BitsPerValue(s2->bytes_written, g, tokens), b);
      sums.push_back(SumRelErr(s2->codec_error));
    }
    EXPECT_LT(sums.back(), sums.front());
  }
}

TEST(BitAllocator, TooSmallABudgetIsRefusedAndLeavesNothing) {
  auto session = testing_util::MakeSession({2, 2, 64}, 100, DType::kF16, 1);
  MemoryStore store;
  CheckpointOptions o;
  o.allocate_bits = 2.0;  // tq2 alone is 2.5 bits/value at head_dim 64
  auto st = Checkpoint(session->cache(), o, store, "x");
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.status().message().find("auto:2"), std::string::npos) << st.status().ToString();
  EXPECT_FALSE(store.Open("x").ok());
  o.layer_overrides.push_back(ParseLayerCodec("0:tq4").value());
  o.allocate_bits = 5;
  EXPECT_EQ(Checkpoint(session->cache(), o, store, "x").status().code(),
            StatusCode::kInvalidArgument);
}

// from=kl / from=all: the transform codec's budgets are candidates; the file stays within the
// budget, records kl codecs per layer and restores; under tq2's size only kl can fit.
TEST(BitAllocator, TransformCandidatesAreChosenWithinTheBudget) {
  const ModelGeometry g{3, 2, 128};
  const uint64_t tokens = 600;
  auto session = testing_util::MakeSession(g, tokens, DType::kF16, 4);
  MemoryStore store;
  CheckpointOptions o;
  o.allocate_bits = 2.2;  // below tq2's 2.25 + overhead
  auto refused = Checkpoint(session->cache(), o, store, "tq");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("auto:2.2:"), std::string::npos)
      << refused.status().ToString();
  for (AllocatorFamily from : {AllocatorFamily::kTransform, AllocatorFamily::kAll}) {
    for (double b : {2.2, 2.6, 3.4}) {
      SCOPED_TRACE(testing::Message() << static_cast<int>(from) << " " << b);
      o.allocate_from = from;
      o.allocate_bits = b;
      auto st = Checkpoint(session->cache(), o, store, "kl");
      ASSERT_TRUE(st.ok()) << st.status().ToString();
      EXPECT_LE(BitsPerValue(st->bytes_written, g, tokens), b);
      ASSERT_EQ(st->allocated.size(), g.layers);
      bool any_kl = false;
      for (const auto& layer : st->allocated) {
        for (const std::string& c : layer) {
          any_kl |= c.substr(0, 3) == "kl:";
          if (from == AllocatorFamily::kTransform) {
            EXPECT_EQ(c.substr(0, 3), "kl:") << c;
          }
        }
      }
      if (b == 2.2) {
        EXPECT_TRUE(any_kl);  // no TurboQuant preset fits there
      }
      auto object = store.Open("kl");
      auto reader = ContainerReader::Open(object->get(), "kl");
      ASSERT_TRUE(reader.ok());
      const ContainerDescription d = DescribeContainer(**reader);
      for (uint32_t l = 0; l < g.layers; ++l) {
        EXPECT_EQ(d.layer_codecs[l], JoinKvLabels(st->allocated[l][0], st->allocated[l][1]));
      }
      RestoreOptions ro;
      ro.dtype = DType::kF32;
      auto restored = Restore(store, "kl", ro);
      ASSERT_TRUE(restored.ok()) << restored.status().ToString();
      for (const auto& e : st->codec_error) EXPECT_LT(RelativeError(e), 0.5);
    }
  }
}

}  // namespace
}  // namespace tqkv
