// The one parser of sizes, durations and counts (include/tqkv/units.h): one unit rule, and no
// spelling that is out of range, not finite or not a number gets through as a silent value.
#include "tqkv/units.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <string>

namespace tqkv {
namespace {

using std::chrono::nanoseconds;
using std::chrono::seconds;

TEST(Units, ByteSizeUnitRule) {
  const std::pair<const char*, uint64_t> cases[] = {
      {"0", 0},
      {"1048576", 1048576},
      {"17B", 17},
      {"1KB", 1000},
      {"1kb", 1000},
      {"64MB", 64'000'000},
      {"50GB", 50'000'000'000},
      {"10TB", 10'000'000'000'000},
      {"3.5PB", 3'500'000'000'000'000},
      {"1KiB", 1024},
      {"512MiB", 512ull << 20},
      {"1.5GiB", 3ull << 29},
      {"2TiB", 2ull << 40},
      {"1PiB", 1ull << 50},
      // Bare letters are binary, as in store URIs (chunk=64k) and dd.
      {"64k", 64 << 10},
      {"64K", 64 << 10},
      {"64M", 64ull << 20},
      {"1g", 1ull << 30},
      {"1T", 1ull << 40},
      {"0.5KB", 500},
      {"18446744073709551615", UINT64_MAX},
  };
  for (const auto& [text, want] : cases) {
    auto v = ParseByteSize(text);
    ASSERT_TRUE(v.ok()) << text << ": " << v.status().ToString();
    EXPECT_EQ(*v, want) << text;
  }
}

TEST(Units, ByteSizeRefusesWhatIsNotASize) {
  for (const char* text :
       {"", "nan", "NaN", "inf", "-inf", "1e30", "1e3", "-1", "+1", "0x10", " 1", "1 ", "1 MB",
        "1.", ".5", "1..5", "1,5", "MB", "12XB", "1EiB", "1Mi", "1mib2", "1.0001KB", "0.3B",
        "18446744073709551616", "17179869184GiB", "100000000000000000000000000000"}) {
    auto v = ParseByteSize(text);
    EXPECT_FALSE(v.ok()) << "\"" << text << "\" parsed as " << (v.ok() ? *v : 0);
    if (!v.ok()) EXPECT_EQ(v.status().code(), StatusCode::kInvalidArgument) << text;
  }
}

TEST(Units, ByteSizeRangeAndMessage) {
  EXPECT_EQ(*ParseByteSize("4k", 4096, 1u << 20), 4096u);
  auto low = ParseByteSize("1000", 4096, 1u << 20);
  ASSERT_FALSE(low.ok());
  EXPECT_NE(low.status().message().find("[4096, 1048576]"), std::string::npos)
      << low.status().message();
  auto bad = ParseByteSize("64X");
  ASSERT_FALSE(bad.ok());
  // The message names the text and both spellings of the units.
  EXPECT_NE(bad.status().message().find("\"64X\""), std::string::npos);
  EXPECT_NE(bad.status().message().find("KB"), std::string::npos);
  EXPECT_NE(bad.status().message().find("KiB"), std::string::npos);
}

TEST(Units, Durations) {
  EXPECT_EQ(*ParseDuration("0"), nanoseconds(0));
  EXPECT_EQ(*ParseDuration("3600"), seconds(3600));
  EXPECT_EQ(*ParseDuration("90s"), seconds(90));
  EXPECT_EQ(*ParseDuration("30m"), seconds(1800));
  EXPECT_EQ(*ParseDuration("1h"), seconds(3600));
  EXPECT_EQ(*ParseDuration("1.5h"), seconds(5400));
  EXPECT_EQ(*ParseDuration("7d"), seconds(7 * 86400));
  EXPECT_EQ(*ParseDuration("250ms"), std::chrono::milliseconds(250));
  EXPECT_EQ(*ParseDuration("36500d"), kMaxDuration);
  for (const char* text : {"", "inf", "nan", "-1s", "1e300h", "1e3", "36501d", "1w", "1 h", "h",
                           "1.h", "99999999999999999999999h", "0x10s"}) {
    auto v = ParseDuration(text);
    EXPECT_FALSE(v.ok()) << "\"" << text << "\" parsed as " << (v.ok() ? v->count() : 0);
  }
  auto low = ParseDuration("0s", seconds(1));
  ASSERT_FALSE(low.ok());
  EXPECT_NE(low.status().message().find("out of range"), std::string::npos);
}

TEST(Units, Counts) {
  EXPECT_EQ(*ParseCount("0", 0, 10), 0u);
  EXPECT_EQ(*ParseCount("16", 1, 1024), 16u);
  EXPECT_EQ(*ParseCount("18446744073709551615", 0, UINT64_MAX), UINT64_MAX);
  for (const char* text :
       {"", "-1", "+1", "1e9", "1.0", "0x10", "16k", "nan", " 1", "18446744073709551616"}) {
    EXPECT_FALSE(ParseCount(text, 0, UINT64_MAX).ok()) << text;
  }
  auto big = ParseCount("100000", 0, 1024);
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.status().message().find("[0, 1024]"), std::string::npos) << big.status().message();
}

}  // namespace
}  // namespace tqkv
