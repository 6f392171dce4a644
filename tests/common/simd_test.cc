// SIMD level names, detection invariants, TQKV_SIMD and ForceSimdLevel refusing what this CPU
// cannot run (include/tqkv/simd.h).
#include "tqkv/simd.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>

namespace tqkv {
namespace {

constexpr SimdLevel kAll[] = {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512,
                              SimdLevel::kNeon};

bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// Sets TQKV_SIMD for one test and restores it (and the active level) afterwards.
class SimdEnv : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const char* v = std::getenv("TQKV_SIMD")) saved_ = v;
  }
  void TearDown() override {
    if (saved_) {
      setenv("TQKV_SIMD", saved_->c_str(), 1);
    } else {
      unsetenv("TQKV_SIMD");
    }
    ResetSimdLevel();
  }
  std::optional<std::string> saved_;
};

TEST(Simd, NamesRoundTrip) {
  for (SimdLevel l : kAll) {
    const auto parsed = ParseSimdLevel(SimdLevelName(l));
    ASSERT_TRUE(parsed.has_value()) << SimdLevelName(l);
    EXPECT_EQ(*parsed, l);
  }
  EXPECT_EQ(SimdLevelName(SimdLevel::kAvx512), "avx512");
  EXPECT_EQ(SimdLevelName(SimdLevel::kNeon), "neon");
  for (const char* bad : {"", "AVX2", "avx", "avx-512", "avx512 ", "sse4", "unknown"}) {
    EXPECT_FALSE(ParseSimdLevel(bad).has_value()) << bad;
  }
}

TEST(Simd, SupportedLevelsAreConsistent) {
  const auto levels = SupportedSimdLevels();
  ASSERT_FALSE(levels.empty());
  EXPECT_EQ(levels.front(), SimdLevel::kScalar);
  EXPECT_EQ(levels.back(), BestSimdLevel());
  for (SimdLevel l : kAll) {
    const bool listed = std::find(levels.begin(), levels.end(), l) != levels.end();
    EXPECT_EQ(listed, SimdLevelSupported(l)) << SimdLevelName(l);
  }
  // AVX-512 kernels may use AVX2 instructions; x86 and Arm levels never meet on one CPU.
  if (SimdLevelSupported(SimdLevel::kAvx512)) {
    EXPECT_TRUE(SimdLevelSupported(SimdLevel::kAvx2));
  }
  if (SimdLevelSupported(SimdLevel::kNeon)) {
    EXPECT_FALSE(SimdLevelSupported(SimdLevel::kAvx2));
  }
#if defined(__aarch64__)
  EXPECT_TRUE(SimdLevelSupported(SimdLevel::kNeon));
#endif
  for (SimdLevel l : levels) {
    EXPECT_TRUE(Contains(SupportedSimdLevelNames(), std::string(SimdLevelName(l))));
  }
}

TEST(Simd, ForceRefusesUnsupportedLevels) {
  for (SimdLevel l : kAll) {
    ASSERT_TRUE(ForceSimdLevel(SimdLevel::kScalar).ok());
    const Status s = ForceSimdLevel(l);
    if (SimdLevelSupported(l)) {
      EXPECT_TRUE(s.ok()) << s.ToString();
      EXPECT_EQ(ActiveSimdLevel(), l);
    } else {
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << SimdLevelName(l);
      EXPECT_TRUE(Contains(s.message(), std::string(SimdLevelName(l)))) << s.message();
      EXPECT_TRUE(Contains(s.message(), SupportedSimdLevelNames())) << s.message();
      EXPECT_EQ(ActiveSimdLevel(), SimdLevel::kScalar);  // unchanged, not clamped
    }
  }
  ResetSimdLevel();
}

TEST_F(SimdEnv, EnvironmentPicksEverySupportedLevel) {
  for (SimdLevel l : SupportedSimdLevels()) {
    setenv("TQKV_SIMD", std::string(SimdLevelName(l)).c_str(), 1);
    EXPECT_TRUE(SimdEnvironmentStatus().ok()) << SimdLevelName(l);
    ResetSimdLevel();
    EXPECT_EQ(ActiveSimdLevel(), l);
  }
  unsetenv("TQKV_SIMD");
  EXPECT_TRUE(SimdEnvironmentStatus().ok());
  ResetSimdLevel();
  EXPECT_EQ(ActiveSimdLevel(), BestSimdLevel());
  setenv("TQKV_SIMD", "", 1);
  EXPECT_TRUE(SimdEnvironmentStatus().ok());
}

TEST_F(SimdEnv, EnvironmentRefusesUnknownNames) {
  setenv("TQKV_SIMD", "sse9", 1);
  const Status s = SimdEnvironmentStatus();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s.message(), "sse9")) << s.message();
  EXPECT_TRUE(Contains(s.message(), SupportedSimdLevelNames())) << s.message();
  ResetSimdLevel();  // the library keeps the best level (and warns once)
  EXPECT_EQ(ActiveSimdLevel(), BestSimdLevel());
}

TEST_F(SimdEnv, EnvironmentRefusesLevelsThisCpuLacks) {
  bool any = false;
  for (SimdLevel l : kAll) {
    if (SimdLevelSupported(l)) continue;
    any = true;
    setenv("TQKV_SIMD", std::string(SimdLevelName(l)).c_str(), 1);
    const Status s = SimdEnvironmentStatus();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << SimdLevelName(l);
    EXPECT_TRUE(Contains(s.message(), "does not support")) << s.message();
    ResetSimdLevel();
    EXPECT_EQ(ActiveSimdLevel(), BestSimdLevel());
  }
  EXPECT_TRUE(any);  // no CPU runs both the x86 levels and NEON
}

}  // namespace
}  // namespace tqkv
