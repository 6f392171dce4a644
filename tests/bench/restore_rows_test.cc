// Rows of `tqkv-bench restore` (bench/restore_bench_rows.h): option parsing, GPU-row skipping and
// the JSON fields GPU rows add. No GPU needed.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "bench/restore_bench_rows.h"

namespace {

using tqkv::bench::DropGpuRows;
using tqkv::bench::ExpandRowConfigs;
using tqkv::bench::GpuWorker;
using tqkv::bench::RowConfig;
using tqkv::bench::Target;
using Strings = std::vector<std::string>;

constexpr Target kHost = Target::kHost;
constexpr Target kGpu = Target::kGpu;

TEST(BenchRows, DefaultIsTheHostCrossProduct) {
  auto rows = ExpandRowConfigs({}, {"fp16", "tq3"}, {"buffered", "direct"}, {});
  ASSERT_TRUE(rows.ok()) << rows.status().ToString();
  const std::vector<RowConfig> want{{"fp16", "buffered", kHost}, {"fp16", "direct", kHost},
                                    {"tq3", "buffered", kHost}, {"tq3", "direct", kHost}};
  EXPECT_EQ(*rows, want);
}

TEST(BenchRows, TargetsMultiplyTheCrossProduct) {
  auto rows = ExpandRowConfigs({}, {"tq3"}, {"direct"}, {"host", "gpu", "gpu"});
  ASSERT_TRUE(rows.ok()) << rows.status().ToString();
  const std::vector<RowConfig> want{{"tq3", "direct", kHost}, {"tq3", "direct", kGpu}};
  EXPECT_EQ(*rows, want);
  auto gds = ExpandRowConfigs({}, {"tq3"}, {"gds"}, {"gpu"});
  ASSERT_TRUE(gds.ok()) << gds.status().ToString();
  EXPECT_EQ(gds->at(0), (RowConfig{"tq3", "gds", kGpu}));
}

TEST(BenchRows, ConfigsTakeAnOptionalTarget) {
  auto rows = ExpandRowConfigs({"fp16:buffered", "fp16:buffered:gpu", "tq3:gds:gpu",
                                "tq3:direct:host", "tq:b=3,nc=1:uring:gpu", "tq:b=3:direct"},
                               {"ignored"}, {"ignored"}, {});
  ASSERT_TRUE(rows.ok()) << rows.status().ToString();
  const std::vector<RowConfig> want{{"fp16", "buffered", kHost},     {"fp16", "buffered", kGpu},
                                    {"tq3", "gds", kGpu},            {"tq3", "direct", kHost},
                                    {"tq:b=3,nc=1", "uring", kGpu}, {"tq:b=3", "direct", kHost}};
  EXPECT_EQ(*rows, want);
}

TEST(BenchRows, ConfigsWithoutTargetTakeEveryTarget) {
  auto rows = ExpandRowConfigs({"tq3:direct", "fp16:buffered:host"}, {}, {}, {"host", "gpu"});
  ASSERT_TRUE(rows.ok()) << rows.status().ToString();
  const std::vector<RowConfig> want{{"tq3", "direct", kHost}, {"tq3", "direct", kGpu},
                                    {"fp16", "buffered", kHost}};
  EXPECT_EQ(*rows, want);
}

TEST(BenchRows, BadRowsAreClearErrors) {
  auto expect_error = [](const Strings& configs, const Strings& targets, const std::string& what) {
    auto r = ExpandRowConfigs(configs, {"tq3"}, {"direct"}, targets);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find(what), std::string::npos) << r.status().ToString();
  };
  expect_error({"tq3"}, {}, "want CODEC:IO");
  expect_error({":direct"}, {}, "want CODEC:IO");
  expect_error({"tq3:"}, {}, "want CODEC:IO");
  expect_error({"tq3:gds"}, {}, "ask for a GPU row");  // gds has no host form
  expect_error({"tq3:nvme:gpu"}, {}, "unknown GPU I/O path");
  expect_error({"tq3:direct:tpu"}, {}, "neither a target");
  expect_error({"tq9.9:direct:gpu"}, {}, "tq9.9");
  expect_error({}, {"tpu"}, "unknown target");
  auto bad_io = ExpandRowConfigs({}, {"tq3"}, {"nvme"}, {});
  EXPECT_FALSE(bad_io.ok());
}

// The store's host I/O of a GPU row is the GPU restore's rule (GpuStoreIo, tests/gpu_ladder).
TEST(BenchRows, ForcedRung) {
  EXPECT_EQ(tqkv::bench::ForcedGpuIo({"tq3", "gds", kGpu}), "");  // the whole ladder
  EXPECT_EQ(tqkv::bench::ForcedGpuIo({"tq3", "direct", kGpu}), "direct");
  EXPECT_EQ(tqkv::bench::ForcedGpuIo({"fp16", "buffered", kGpu}), "buffered");
}

TEST(BenchRows, GpuRowsAreSkippedWithTheReason) {
  const std::vector<RowConfig> mixed{{"tq3", "direct", kHost}, {"tq3", "gds", kGpu},
                                     {"fp16", "buffered", kGpu}};
  std::string note;
  auto kept = DropGpuRows(mixed, "no CUDA device: insufficient driver", &note);
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(*kept, (std::vector<RowConfig>{{"tq3", "direct", kHost}}));
  EXPECT_NE(note.find("skipping 2 GPU row(s)"), std::string::npos) << note;
  EXPECT_NE(note.find("no CUDA device"), std::string::npos) << note;

  auto all = DropGpuRows(mixed, "", &note);  // a usable GPU: nothing dropped
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(*all, mixed);
  EXPECT_TRUE(note.empty());

  auto host_only = DropGpuRows({{"tq3", "direct", kHost}}, "no CUDA device", &note);
  ASSERT_TRUE(host_only.ok());
  EXPECT_TRUE(note.empty());

  auto only_gpu = DropGpuRows({{"tq3", "gds", kGpu}}, "built without CUDA", &note);
  ASSERT_FALSE(only_gpu.ok());
  EXPECT_EQ(only_gpu.status().code(), tqkv::StatusCode::kInvalidArgument);
  EXPECT_NE(only_gpu.status().message().find("only GPU rows"), std::string::npos);
  EXPECT_NE(only_gpu.status().message().find("built without CUDA"), std::string::npos);
}

TEST(BenchRows, GpuRowJsonFields) {
  GpuWorker a;
  a.io_used = "gds";
  a.host_io = "cufile";
  a.first_layer_s = 0.1;
  a.decode_gpu_s = 0.2;
  a.copy_gpu_s = 0;
  a.read_busy_s = 0.5;
  a.setup_s = 0.05;
  GpuWorker b = a;
  b.io_used = "direct";  // gds setup failed on this worker's file: the ladder went one down
  b.host_io = "direct";
  b.skipped = {"gds: cuFileHandleRegister: ..."};
  b.first_layer_s = 0.3;
  b.decode_gpu_s = 0.4;
  b.copy_gpu_s = 0.1;
  const nlohmann::json j = tqkv::bench::GpuRowJson({a, b}, "NVIDIA H200 (sm_90, 143000 MiB)");
  EXPECT_EQ(j["io_used"], "gds,direct");
  EXPECT_EQ(j["host_io"], "cufile");
  EXPECT_EQ(j["io_skipped"], nlohmann::json::array({"gds: cuFileHandleRegister: ..."}));
  EXPECT_EQ(j["gpu_device"], "NVIDIA H200 (sm_90, 143000 MiB)");
  EXPECT_DOUBLE_EQ(j["first_layer_s_mean"].get<double>(), 0.2);
  EXPECT_DOUBLE_EQ(j["first_layer_s_max"].get<double>(), 0.3);
  EXPECT_DOUBLE_EQ(j["decode_gpu_s_mean"].get<double>(), 0.3);
  EXPECT_DOUBLE_EQ(j["copy_gpu_s_mean"].get<double>(), 0.05);
  EXPECT_DOUBLE_EQ(j["read_busy_s_mean"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(j["setup_s_mean"].get<double>(), 0.05);
  const nlohmann::json w = tqkv::bench::GpuWorkerJson(b);
  for (const char* k : {"io_used", "host_io", "first_layer_s", "decode_gpu_s", "copy_gpu_s",
                        "read_busy_s", "setup_s"}) {
    EXPECT_TRUE(w.contains(k)) << k;
  }
  EXPECT_EQ(w["io_used"], "direct");
}

}  // namespace
