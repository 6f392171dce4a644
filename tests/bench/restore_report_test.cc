// The breakdown's verdict (what limits a restore) and the summary lines built from cells.
#include "bench/restore_bench_report.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace tqkv::bench {
namespace {

Cell TqCell(double link, double read_gbps, double decode_fp16_gbps, double restore_s) {
  Cell c;
  c.codec = "tq3";
  c.io = "direct";
  c.tokens = 10000;
  c.workers = 4;
  c.link_gbps = link;
  c.file_bytes = 100;
  c.fp16_bytes = 492;  // ratio 4.92
  c.read_only_gbps = read_gbps;
  c.read_only_s = 1.0;
  c.decode_capacity_fp16_gbps = decode_fp16_gbps;
  c.decode_only_s = 0.5;
  c.bound_fp16_gbps = std::min(4.92 * read_gbps, decode_fp16_gbps);
  c.wall_s = 1.2;
  c.restore.mean = restore_s;
  return c;
}

TEST(RestoreReport, BottleneckIsTheSlowerStage) {
  EXPECT_EQ(TqCell(0, 0.9, 2.0, 1).bottleneck(), "CPU");   // reads could give 4.43 fp16-eq
  EXPECT_EQ(TqCell(0, 0.3, 2.0, 1).bottleneck(), "disk");  // 1.48 < 2.0
  EXPECT_EQ(TqCell(0.05, 0.2, 2.0, 1).bottleneck(), "link");
  Cell none;
  EXPECT_EQ(none.bottleneck(), "");
  EXPECT_FALSE(none.has_breakdown());
  EXPECT_NEAR(TqCell(0, 0.9, 2.0, 1).overlap(), 1.2, 1e-12);  // wall over the slower stage
}

TEST(RestoreReport, SummarySaysHowMuchFasterAndWhy) {
  Cell fp16_buf, fp16_dir, fp16_link;
  for (Cell* c : {&fp16_buf, &fp16_dir, &fp16_link}) {
    c->codec = "fp16";
    c->tokens = 10000;
    c->workers = 4;
  }
  fp16_buf.io = "buffered";
  fp16_buf.restore.mean = 3.0;
  fp16_dir.io = "direct";
  fp16_dir.restore.mean = 2.0;  // fp16's fastest path is the baseline
  fp16_link.io = "buffered";
  fp16_link.link_gbps = 0.05;
  fp16_link.restore.mean = 11.0;
  const std::vector<Cell> cells = {fp16_buf, fp16_dir, TqCell(0, 0.9, 2.0, 1.0), fp16_link,
                                   TqCell(0.05, 0.19, 2.0, 2.5)};
  testing::internal::CaptureStdout();
  PrintSummary(cells);
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("raw disk:"), std::string::npos) << out;
  EXPECT_NE(out.find("tq3+direct restores 2.00x faster than fp16+direct"), std::string::npos) << out;
  EXPECT_NE(out.find("CPU-bound: decode 2.00 GB/s fp16-eq < reads 0.900 GB/s x 4.92 = 4.43"),
            std::string::npos) << out;
  EXPECT_NE(out.find("0.05 GB/s link per worker:"), std::string::npos) << out;
  EXPECT_NE(out.find("4.40x faster than fp16+buffered"), std::string::npos) << out;
  EXPECT_NE(out.find("link-bound: reads 0.190 GB/s x 4.92 = 0.93"), std::string::npos) << out;
}

}  // namespace
}  // namespace tqkv::bench
