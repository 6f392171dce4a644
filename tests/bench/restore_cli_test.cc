// `tqkv-bench restore` with GPU rows, through the built binary. Without a CUDA device (or in a
// build without CUDA) GPU rows are skipped with the reason, or refused when they are all that
// was asked; with one, their JSON fields are checked. Host rows keep every field they had.
#include <gtest/gtest.h>

#include "tools/cli_util.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "store/store_test_util.h"

namespace {

using tqkv::testing_util::CmdResult;
using tqkv::testing_util::JsonFile;
using tqkv::testing_util::TqkvBench;
using json = nlohmann::json;

std::string ReadText(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

std::string Args(const tqkv::testing_util::ScratchDir& dir) {
  return "restore --model smollm2-135m --workers 1 --tokens 64 --store " + dir.path() +
         "/store --json " + dir.path() + "/out.json --csv " + dir.path() + "/out.csv ";
}

// The fields of a result row before GPU rows existed (the JSON contract).
void ExpectHostContract(const json& r) {
  for (const char* k :
       {"codec", "io", "tokens", "workers", "restore_s_mean", "restore_s_p50", "restore_s_p99",
        "restore_s_min", "restore_s_max", "restore_s_std", "write_s_mean", "write_s_p50",
        "write_s_p99", "write_s_min", "write_s_max", "write_s_std", "restore_wall_s",
        "read_gbps_aggregate", "fp16_gbps_aggregate", "per_worker_gbps", "file_bytes",
        "fp16_bytes", "speedup_vs_fp16_buffered", "nmse", "cosine_mean", "streamed",
        "page_cache_dropped", "read_only_s", "decode_only_s", "read_only_gbps",
        "decode_capacity_fp16_gbps", "bound_fp16_gbps", "per_worker"}) {
    EXPECT_TRUE(r.contains(k)) << k;
  }
  ASSERT_TRUE(r["per_worker"].is_array());
  for (const char* k : {"write_s", "restore_s", "bytes_read", "bytes_written"}) {
    EXPECT_TRUE(r["per_worker"][0].contains(k)) << k;
  }
}

TEST(BenchRestoreCli, HostOnlyRunsKeepTheirOutput) {
  tqkv::testing_util::ScratchDir dir;
  ASSERT_TRUE(dir.ok());
  CmdResult r = TqkvBench(Args(dir) + "--config tq3:direct --config fp16:buffered --no-quality");
  ASSERT_EQ(r.status, 0) << r.out;
  const json j = JsonFile(dir.path() + "/out.json");
  ASSERT_FALSE(j.is_discarded());
  EXPECT_FALSE(j.contains("gpu"));
  ASSERT_EQ(j["results"].size(), 2u);
  for (const json& row : j["results"]) {
    ExpectHostContract(row);
    EXPECT_EQ(row["target"], "host");
    EXPECT_FALSE(row.contains("io_used"));
  }
  const std::string csv = ReadText(dir.path() + "/out.csv");
  EXPECT_EQ(csv.substr(0, csv.find('\n')),
            "codec,io,tokens,workers,restore_s_mean,restore_s_p50,restore_s_p99,write_s_mean,"
            "read_gbps_aggregate,speedup_vs_fp16_buffered,nmse,cosine_mean");
  EXPECT_EQ(r.out.find("GPU rows"), std::string::npos);
}

// --link-gbps 0,X runs every row raw and through the link; TurboQuant rows carry the stages.
TEST(BenchRestoreCli, LinkListAndBreakdown) {
  tqkv::testing_util::ScratchDir dir;
  ASSERT_TRUE(dir.ok());
  CmdResult r = TqkvBench(Args(dir) + "--config tq3:direct --config fp16:buffered --link-gbps 0,2 "
                                 "--no-quality");
  ASSERT_EQ(r.status, 0) << r.out;
  const json j = JsonFile(dir.path() + "/out.json");
  ASSERT_FALSE(j.is_discarded());
  ASSERT_EQ(j["results"].size(), 4u);
  EXPECT_EQ(j["link_gbps"], json::array({0.0, 2.0}));
  for (const json& row : j["results"]) {
    ExpectHostContract(row);
    const bool tq = row["codec"] == "tq3";
    for (const char* k : {"raw_read_gbps", "read_only_gbps", "decode_capacity_fp16_gbps", "overlap"}) {
      EXPECT_EQ(row[k].is_number(), tq) << k << " " << row.dump();
    }
    if (tq) {
      const std::string limit = row["bottleneck"];
      EXPECT_TRUE(limit == "CPU" || limit == (row["link_gbps"].is_null() ? "disk" : "link")) << limit;
      EXPECT_GT(row["raw_read_gbps"].get<double>(), 0);
    }
    EXPECT_DOUBLE_EQ(row["speedup_vs_fp16_buffered"].get<double>() > 0, true);
  }
  EXPECT_TRUE(j["results"][0]["link_gbps"].is_null());
  EXPECT_EQ(j["results"][3]["link_gbps"], 2.0);
  EXPECT_NE(r.out.find("Stages, measured one by one"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("2 GB/s link per worker:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tq3+direct restores"), std::string::npos) << r.out;
  const std::string csv = ReadText(dir.path() + "/out.csv");
  EXPECT_NE(csv.substr(0, csv.find('\n')).find(",link_gbps"), std::string::npos) << csv;
  EXPECT_EQ(TqkvBench(Args(dir) + "--config tq3:direct --link-gbps -1").status == 0, false);
}

// --breakdown measures the stages of fp16 rows too; without room for the in-memory copies their
// decode stage is skipped and the bound is the reads alone.
TEST(BenchRestoreCli, BreakdownOfEveryRow) {
  tqkv::testing_util::ScratchDir dir;
  ASSERT_TRUE(dir.ok());
  CmdResult r = TqkvBench(Args(dir) + "--config fp16:direct --breakdown --no-quality");
  ASSERT_EQ(r.status, 0) << r.out;
  json j = JsonFile(dir.path() + "/out.json");
  ASSERT_EQ(j["results"].size(), 1u);
  EXPECT_GT(j["results"][0]["raw_read_gbps"].get<double>(), 0);
  EXPECT_GT(j["results"][0]["decode_capacity_fp16_gbps"].get<double>(), 0);
  r = TqkvBench(Args(dir) + "--config fp16:direct --breakdown --no-quality --max-memory 4096");
  ASSERT_EQ(r.status, 0) << r.out;
  j = JsonFile(dir.path() + "/out.json");
  EXPECT_TRUE(j["results"][0]["decode_capacity_fp16_gbps"].is_null());
  const json& row = j["results"][0];
  EXPECT_DOUBLE_EQ(row["bound_fp16_gbps"].get<double>(),
                   row["read_only_gbps"].get<double>() * row["fp16_bytes"].get<double>() /
                       row["file_bytes"].get<double>());
  EXPECT_EQ(j["results"][0]["bottleneck"], "disk");
}

TEST(BenchRestoreCli, GpuRowsRunOrAreSkippedWithTheReason) {
  tqkv::testing_util::ScratchDir dir;
  ASSERT_TRUE(dir.ok());
  CmdResult r = TqkvBench(Args(dir) +
                     "--config tq3:direct --config fp16:buffered:gpu --config tq3:gds:gpu");
  ASSERT_EQ(r.status, 0) << r.out;
  const json j = JsonFile(dir.path() + "/out.json");
  ASSERT_FALSE(j.is_discarded());
  ASSERT_TRUE(j.contains("gpu")) << j.dump(2);
  ExpectHostContract(j["results"][0]);
  EXPECT_EQ(j["results"][0]["target"], "host");
  if (j["gpu"]["skipped_rows"].is_string()) {
    // No usable device here: the host row ran, both GPU rows were skipped and the reason is said.
    const std::string why = j["gpu"]["skipped_rows"];
    EXPECT_NE(why.find("skipping 2 GPU row(s)"), std::string::npos) << why;
    EXPECT_TRUE(why.find("no CUDA device") != std::string::npos ||
                why.find("built without CUDA") != std::string::npos)
        << why;
    EXPECT_NE(r.out.find(why), std::string::npos) << r.out;
    EXPECT_EQ(j["results"].size(), 1u);
    return;
  }
  // A usable device: every row ran; GPU rows say which rung the ladder used.
  ASSERT_EQ(j["results"].size(), 3u) << j.dump(2);
  EXPECT_GT(j["gpu"]["probe"]["device_count"].get<int>(), 0);
  for (size_t i = 1; i < 3; ++i) {
    const json& row = j["results"][i];
    ExpectHostContract(row);
    EXPECT_EQ(row["target"], "gpu");
    for (const char* k : {"io_used", "host_io", "io_skipped", "gpu_device", "first_layer_s_mean",
                          "first_layer_s_max", "decode_gpu_s_mean", "copy_gpu_s_mean",
                          "read_busy_s_mean", "setup_s_mean", "link_emulated"}) {
      EXPECT_TRUE(row.contains(k)) << k;
    }
    const std::string used = row["io_used"];
    EXPECT_TRUE(used == "gds" || used == "direct" || used == "buffered") << used;
    EXPECT_GT(row["first_layer_s_mean"].get<double>(), 0);
    EXPECT_LE(row["first_layer_s_mean"].get<double>(), row["restore_s_mean"].get<double>());
    EXPECT_GT(row["decode_gpu_s_mean"].get<double>(), 0);
    EXPECT_TRUE(row["per_worker"][0].contains("first_layer_s"));
    // cuFile reads bypass the store's byte count: RestoreToGpu adds them.
    EXPECT_GE(row["per_worker"][0]["bytes_read"].get<uint64_t>(),
              row["file_bytes"].get<uint64_t>() / 2);
  }
  EXPECT_EQ(j["results"][1]["io_used"], "buffered");  // fp16:buffered:gpu forces the rung
  EXPECT_DOUBLE_EQ(j["results"][1]["speedup_vs_fp16_buffered"].get<double>(), 1.0);
  EXPECT_TRUE(j["results"][2]["speedup_vs_fp16_buffered"].is_number());
  EXPECT_NE(r.out.find("GPU rows"), std::string::npos) << r.out;
}

TEST(BenchRestoreCli, OnlyGpuRowsWithoutADeviceIsAClearError) {
  tqkv::testing_util::ScratchDir dir;
  ASSERT_TRUE(dir.ok());
  CmdResult r = TqkvBench(Args(dir) + "--codec tq3 --io gds --target gpu --no-quality");
  ASSERT_NE(r.status, -1) << r.out;  // exited, did not crash
  if (r.status == 0) {
    const json j = JsonFile(dir.path() + "/out.json");
    ASSERT_EQ(j["results"].size(), 1u);
    EXPECT_EQ(j["results"][0]["target"], "gpu");
    return;
  }
  EXPECT_NE(r.out.find("only GPU rows were asked for"), std::string::npos) << r.out;
  EXPECT_TRUE(r.out.find("no CUDA device") != std::string::npos ||
              r.out.find("built without CUDA") != std::string::npos)
      << r.out;
}

TEST(BenchRestoreCli, BadTargetsAreRefused) {
  tqkv::testing_util::ScratchDir dir;
  ASSERT_TRUE(dir.ok());
  CmdResult a = TqkvBench(Args(dir) + "--target tpu");
  EXPECT_NE(a.status, 0);
  EXPECT_NE(a.out.find("unknown target"), std::string::npos) << a.out;
  CmdResult b = TqkvBench(Args(dir) + "--config tq3:gds");
  EXPECT_NE(b.status, 0);
  EXPECT_NE(b.out.find("GPU row"), std::string::npos) << b.out;
  EXPECT_NE(TqkvBench("restore --help").out.find("--target"), std::string::npos);
}

}  // namespace
