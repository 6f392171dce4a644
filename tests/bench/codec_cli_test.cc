// `tqkv-bench codec` through the built binary: the level TQKV_SIMD picks (and one the CPU cannot
// honour stops the run), --simd levels interleaved in one run.
#include <gtest/gtest.h>

#include "tools/cli_util.h"

#include <nlohmann/json.hpp>
#include <string>

#include "store/store_test_util.h"
#include "tqkv/simd.h"

namespace {

using tqkv::testing_util::CmdResult;
using tqkv::testing_util::JsonFile;
using tqkv::testing_util::Tqkv;
using tqkv::testing_util::TqkvBench;

// TQKV_SIMD picks the level a run uses, and one this CPU cannot honour stops the run.
TEST(Cli, SimdLevelFromTheEnvironment) {
  tqkv::testing_util::ScratchDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string json = dir.path() + "/codec.json";
  CmdResult ok = TqkvBench("codec --codec tq3 --vectors 64 --groups 1 --reps 1 --json " + json,
                      "TQKV_SIMD=scalar");
  ASSERT_EQ(ok.status, 0) << ok.out;
  const auto j = JsonFile(json);
  ASSERT_FALSE(j.is_discarded());
  EXPECT_EQ(j["results"][0]["simd"], "scalar");

  CmdResult bad = Tqkv("--version", "TQKV_SIMD=sse9");
  EXPECT_EQ(bad.status, 2);
  EXPECT_NE(bad.out.find("TQKV_SIMD=sse9"), std::string::npos) << bad.out;
  EXPECT_NE(bad.out.find(tqkv::SupportedSimdLevelNames()), std::string::npos) << bad.out;
  for (tqkv::SimdLevel l : {tqkv::SimdLevel::kAvx2, tqkv::SimdLevel::kAvx512,
                            tqkv::SimdLevel::kNeon}) {
    if (tqkv::SimdLevelSupported(l)) continue;
    CmdResult r = Tqkv("--version", "TQKV_SIMD=" + std::string(tqkv::SimdLevelName(l)));
    EXPECT_EQ(r.status, 2) << r.out;
    EXPECT_NE(r.out.find("does not support"), std::string::npos) << r.out;
  }
}

// --simd times several levels in the same repetitions: one row per level, the later ones with
// their ratios against the first; a level this CPU lacks is refused, naming those it has.
TEST(Cli, BenchCodecInterleavesSimdLevels) {
  tqkv::testing_util::ScratchDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string json = dir.path() + "/codec.json";
  const std::string best(tqkv::SimdLevelName(tqkv::BestSimdLevel()));
  CmdResult ok = TqkvBench("codec --codec tq3 --codec kl:2.5 --vectors 64 --groups 1 --reps 2 "
                      "--simd scalar --simd " + best + " --json " + json);
  ASSERT_EQ(ok.status, 0) << ok.out;
  const auto j = JsonFile(json);
  ASSERT_FALSE(j.is_discarded());
  ASSERT_EQ(j["results"].size(), 4u) << j.dump();
  for (int c = 0; c < 2; ++c) {
    const auto& first = j["results"][2 * c];
    const auto& second = j["results"][2 * c + 1];
    EXPECT_EQ(first["simd"], "scalar");
    EXPECT_FALSE(first.contains("versus"));
    EXPECT_EQ(second["simd"], best);
    EXPECT_EQ(second["versus"], "scalar");
    EXPECT_GT(second["decode_ratio"].get<double>(), 0.0);
    EXPECT_EQ(first["nmse"], second["nmse"]);  // every level decodes the same bytes
  }
  for (tqkv::SimdLevel l : {tqkv::SimdLevel::kAvx2, tqkv::SimdLevel::kAvx512,
                            tqkv::SimdLevel::kNeon}) {
    if (tqkv::SimdLevelSupported(l)) continue;
    const std::string name(tqkv::SimdLevelName(l));
    CmdResult r = TqkvBench("codec --codec tq3 --vectors 64 --groups 1 --reps 1 --simd " + name);
    EXPECT_NE(r.status, 0) << r.out;
    EXPECT_NE(r.out.find("--simd " + name), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(tqkv::SupportedSimdLevelNames()), std::string::npos) << r.out;
  }
}

}  // namespace
