#include "tqkv/status.h"

#include <gtest/gtest.h>

#include <cerrno>

namespace tqkv {
namespace {

Result<int> Half(int x) {
  if (x % 2) return Status::InvalidArgument("odd");
  return x / 2;
}

Status UseHalf(int x, int* out) {
  TQKV_ASSIGN_OR_RETURN(int h, Half(x));
  *out = h;
  return Status::Ok();
}

TEST(StatusTest, OkAndErrors) {
  EXPECT_TRUE(Status::Ok().ok());
  Status s = Status::Corruption("chunk 3 at offset 8192");
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(s.IsCorruption());
  EXPECT_EQ(s.ToString(), "Corruption: chunk 3 at offset 8192");
  EXPECT_EQ(s.WithContext("s.tqkv").message(), "s.tqkv: chunk 3 at offset 8192");
  EXPECT_TRUE(Status::FromErrno("write", "f", ENOSPC).IsNoSpace());
}

TEST(StatusTest, ResultPropagates) {
  int out = 0;
  EXPECT_TRUE(UseHalf(8, &out).ok());
  EXPECT_EQ(out, 4);
  Status s = UseHalf(7, &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(out, 4);
}

}  // namespace
}  // namespace tqkv
