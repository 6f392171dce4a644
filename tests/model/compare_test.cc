// `tqkv-bench migrate`'s comparison figures (bench/migrate/compare.h) against the cases that
// tests/python/test_compare.py holds lab/llama_migrate.py to: one definition, two languages.
#include "bench/migrate/compare.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <string>
#include <vector>

#include "tqkv/types.h"
#include "test_paths.h"

namespace tqkv {
namespace {

nlohmann::json Cases() {
  std::ifstream in(tqkv::test::SourceDir() + "/tests/data/compare_cases.json");
  return nlohmann::json::parse(in);
}

std::vector<uint16_t> Halves(const nlohmann::json& values) {
  std::vector<uint16_t> out;
  for (float v : values.get<std::vector<float>>()) out.push_back(FloatToHalf(v));
  return out;
}

TEST(Compare, LogitFiguresMatchThePythonRunner) {
  const auto c = Cases()["logits"];
  const size_t steps = c["steps"], vocab = c["vocab"];
  const auto ref = c["ref"].get<std::vector<float>>(), got = c["got"].get<std::vector<float>>();
  const LogitStats s = CompareLogits(ref, got, steps, vocab);
  EXPECT_EQ(s.top1, c["top1"].get<uint32_t>());
  EXPECT_EQ(s.disagree, c["disagree"].get<std::vector<uint32_t>>());
  ASSERT_EQ(s.kl.size(), steps);
  for (size_t i = 0; i < steps; ++i) EXPECT_NEAR(s.kl[i], c["kl"][i].get<double>(), 1e-12) << i;
  EXPECT_NEAR(s.kl_mean, c["kl_mean"].get<double>(), 1e-12);
  EXPECT_NEAR(s.kl_max, c["kl_max"].get<double>(), 1e-12);
  EXPECT_EQ(s.max_logit_diff, c["max_logit_diff"].get<double>());
  EXPECT_EQ(Margins(ref, steps, vocab), c["margins"].get<std::vector<double>>());
}

TEST(Compare, CosinesMatchThePythonRunner) {
  for (const char* name : {"cosine", "cosine_empty"}) {
    const auto c = Cases()[name];
    const auto ref = Halves(c["ref"]), got = Halves(c["got"]);
    EXPECT_NEAR(MeanCosine(ref.data(), got.data(), c["vectors"], c["dim"]), c["mean"].get<double>(),
                1e-12)
        << name;
  }
}

}  // namespace
}  // namespace tqkv
