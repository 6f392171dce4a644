// RunMigrate called as a library (what `tqkv-bench migrate` and a binding do): option errors
// before any model is loaded, and the fp16 path bit-exact through a store and a worker process.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "model/model_test_util.h"
#include "store/store_test_util.h"
#include "bench/migrate/migrate.h"
#include "test_paths.h"

namespace tqkv {
namespace {

using model::testing::FileExists;

constexpr const char* kPrompt = "/usr/share/common-licenses/GPL-3";

Status MigrateStatus(const MigrateOptions& o) { return RunMigrate(o).status(); }

TEST(MigrateLibrary, OptionErrorsComeFirst) {
  MigrateOptions o;
  o.model = "/nonexistent/model.bin";
  o.codecs = {"fp16"};
  o.steps = 0;
  EXPECT_NE(MigrateStatus(o).message().find("--steps must be at least 1"), std::string::npos);
  o.steps = 4;
  o.only = "x";
  EXPECT_NE(MigrateStatus(o).message().find("--only takes k or v"), std::string::npos);
  o.only = "k";
  o.center_keys = 16;
  EXPECT_NE(MigrateStatus(o).message().find("do not combine"), std::string::npos);
  o.only.clear();
  o.center_keys = 0;
  o.activations = "f16";
  EXPECT_NE(MigrateStatus(o).message().find("--activations"), std::string::npos);
  o.activations = "f32";
  o.codecs.clear();
  EXPECT_NE(MigrateStatus(o).message().find("give at least one --codec"), std::string::npos);
  o.codecs = {"fp16"};
  o.exact_tokens = "4";
  EXPECT_NE(MigrateStatus(o).message().find("FIRST,LAST"), std::string::npos);
  o.exact_tokens.clear();
  EXPECT_FALSE(MigrateStatus(o).ok());  // the model file is missing
}

TEST(MigrateLibrary, StoriesFp16IsExactThroughTheWorker) {
  const std::string bin = model::testing::StoriesBin(), tok = model::testing::StoriesTok();
  if (!FileExists(bin) || !FileExists(tok)) GTEST_SKIP() << "stories260K not found";
  if (!FileExists(kPrompt)) GTEST_SKIP() << kPrompt << " not found";
  testing_util::ScratchDir dir;
  ASSERT_TRUE(dir.ok());
  MigrateOptions o;
  o.model = bin;
  o.tokenizer = tok;
  o.prompt_file = kPrompt;
  o.store = dir.path() + "/store";
  o.codecs = {"fp16"};
  o.tokens = 100;
  o.steps = 6;
  o.threads = 2;
  o.worker_command = {tqkv::test::BinaryDir() + "/tqkv-bench", "migrate-worker"};
  std::string progress;
  o.progress = [&](std::string_view text) { progress += text; };
  auto report = RunMigrate(o);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->model, "stories260K");
  EXPECT_EQ(report->steps, 6u);
  ASSERT_EQ(report->results.size(), 1u);
  const MigrateRow& row = report->results[0];
  EXPECT_EQ(row.codec, "fp16");
  EXPECT_EQ(row.top1, 6u);
  EXPECT_EQ(row.kl_max, 0.0);
  EXPECT_EQ(row.max_logit_diff, 0.0);
  EXPECT_EQ(row.k_cosine_per_layer.size(), report->layers);
  for (double c : row.k_cosine_per_layer) EXPECT_EQ(c, 1.0);
  EXPECT_NE(progress.find("worker (restore + 6 steps)"), std::string::npos) << progress;
  const auto j = nlohmann::json::parse(MigrateReportJson(*report));
  EXPECT_EQ(j["results"][0]["codec"], "fp16");
  EXPECT_EQ(j["results"][0]["top1"], 6);
  EXPECT_EQ(j["prompt_tokens"], 100);
  EXPECT_FALSE(j["results"][0].contains("center_keys_block"));
}

}  // namespace
}  // namespace tqkv
