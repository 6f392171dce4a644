// FaultInjectionStore over real and in-memory stores: no fault may leave a partial object
// readable, and the next checkpoint of the same key must succeed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "store/shared_store_servers.h"
#include "store/store_test_util.h"
#include "tqkv/store.h"
#include "store/testing/store_testing.h"

namespace tqkv {
namespace {

using testing_util::Pattern;
using testing_util::ReadObject;
using testing_util::ScratchDir;
using testing_util::WriteObject;

struct BaseParam {
  std::string name;
  std::string query;  // empty: memory
  enum Kind { kLocal, kRedis, kNfs } kind = kLocal;
};

std::ostream& operator<<(std::ostream& os, const BaseParam& p) { return os << p.name; }

class FaultInjectionTest : public ::testing::TestWithParam<BaseParam> {
 protected:
  void SetUp() override {
    ASSERT_TRUE(dir_.ok());
    const auto& servers = testing_util::TestServers();
    Result<std::unique_ptr<Store>> base = Status::Internal("no base");
    if (GetParam().kind == BaseParam::kRedis) {
      if (servers.redis.empty() && !servers.redis_missing.empty()) GTEST_SKIP() << servers.redis_missing;
      ASSERT_FALSE(servers.redis.empty()) << "redis did not start: " << servers.start_error;
      base = OpenStore(servers.redis + "/" + testing_util::UniqueName("fi") + GetParam().query);
    } else if (GetParam().kind == BaseParam::kNfs) {
      if (servers.nfs.empty() && !servers.nfs_missing.empty()) GTEST_SKIP() << servers.nfs_missing;
      ASSERT_FALSE(servers.nfs.empty()) << "nfs did not start: " << servers.start_error;
      base = OpenStore(testing_util::WithSubdir(servers.nfs, testing_util::UniqueName("fi")));
    } else {
      base = GetParam().query.empty() ? OpenStore("memory://")
                                      : OpenStore("file://" + dir_.path() + GetParam().query);
    }
    ASSERT_TRUE(base.ok()) << base.status().ToString();
    fault_ = std::make_unique<FaultInjectionStore>(std::move(base).value());
  }

  void TearDown() override {
    if (fault_ == nullptr || GetParam().kind == BaseParam::kLocal) return;
    testing_util::ClearStore(fault_.get());
  }

  bool OnDisk() const { return GetParam().kind == BaseParam::kLocal && !GetParam().query.empty(); }

  size_t TempFiles() const {
    const auto files = dir_.Files();
    return static_cast<size_t>(std::count_if(files.begin(), files.end(), [](const std::string& f) {
      return f.find(".tmp.") != std::string::npos;
    }));
  }

  void ExpectNothingVisible(const std::string& key) {
    EXPECT_TRUE(fault_->Open(key).status().IsNotFound());
    auto l = fault_->List();
    ASSERT_TRUE(l.ok());
    EXPECT_TRUE(l->empty());
  }

  void ExpectNextCheckpointWorks(const std::string& key) {
    fault_->ClearFaults();
    const auto data = Pattern(99, 300000);
    ASSERT_TRUE(WriteObject(fault_.get(), key, data, 50000).ok());
    auto back = ReadObject(fault_.get(), key);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_TRUE(*back == data);
  }

  ScratchDir dir_;
  std::unique_ptr<FaultInjectionStore> fault_;
};

TEST_P(FaultInjectionTest, NoSpaceMidWrite) {
  WriteFaults f;
  f.no_space_at = 123457;
  fault_->SetWriteFaults(f);
  auto w = fault_->Create("ckpt/a");
  ASSERT_TRUE(w.ok());
  const auto data = Pattern(1, 300000);
  Status first_error;
  for (size_t off = 0; off < data.size() && first_error.ok(); off += 50000) {
    first_error = (*w)->Append(std::span<const uint8_t>(data).subspan(off, 50000));
  }
  EXPECT_TRUE(first_error.IsNoSpace()) << first_error.ToString();
  EXPECT_NE(first_error.message().find("ckpt/a"), std::string::npos) << first_error.ToString();
  EXPECT_EQ((*w)->BytesWritten(), 123457u);
  EXPECT_TRUE((*w)->Append(data).IsNoSpace()) << "the failure is sticky";
  EXPECT_TRUE((*w)->Commit().IsNoSpace());
  ExpectNothingVisible("ckpt/a");
  w->reset();
  if (OnDisk()) {
    EXPECT_EQ(TempFiles(), 0u);
  }
  ExpectNextCheckpointWorks("ckpt/a");
  const auto c = fault_->counters();
  EXPECT_EQ(c.injected_faults, 1u);
  EXPECT_EQ(c.failed_commits, 1u);
  EXPECT_EQ(c.commits, 1u);
}

TEST_P(FaultInjectionTest, IoErrorOnWriteAndFailedCommit) {
  WriteFaults f;
  f.io_error_at = 10;
  fault_->SetWriteFaults(f);
  Status s = WriteObject(fault_.get(), "w", Pattern(2, 100));
  EXPECT_EQ(s.code(), StatusCode::kIoError) << s.ToString();
  ExpectNothingVisible("w");

  WriteFaults g;
  g.fail_commit = true;
  fault_->SetWriteFaults(g);
  s = WriteObject(fault_.get(), "w", Pattern(2, 100));
  EXPECT_EQ(s.code(), StatusCode::kIoError) << s.ToString();
  ExpectNothingVisible("w");
  if (OnDisk()) {
    EXPECT_EQ(TempFiles(), 0u);
  }
  ExpectNextCheckpointWorks("w");
}

TEST_P(FaultInjectionTest, CrashBeforePublishLeavesNothingReadable) {
  WriteFaults f;
  f.crash_before_publish = true;
  fault_->SetWriteFaults(f);
  const auto data = Pattern(3, 200000);
  Status s = WriteObject(fault_.get(), "sess/1", data, 30000);
  EXPECT_FALSE(s.ok());
  ExpectNothingVisible("sess/1");
  if (OnDisk()) {
    EXPECT_EQ(TempFiles(), 1u) << "a crashed writer leaves its temp file behind";
  }
  EXPECT_EQ(fault_->counters().crashes, 1u);

  ExpectNextCheckpointWorks("sess/1");
  auto l = fault_->List();
  ASSERT_TRUE(l.ok());
  ASSERT_EQ(l->size(), 1u) << "the leftover is never listed";
  EXPECT_EQ((*l)[0].key, "sess/1");

  // A leftover younger than the age limit stays; with no age limit it goes.
  auto kept = fault_->RemoveStaleTemps(std::chrono::hours(1));
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(*kept, 0u);
  auto removed = fault_->RemoveStaleTemps(std::chrono::seconds(0));
  ASSERT_TRUE(removed.ok()) << removed.status().ToString();
  if (GetParam().kind == BaseParam::kRedis) {
    EXPECT_GE(*removed, 1u) << "the crashed writer's temp chunks";
  } else {
    EXPECT_EQ(*removed, OnDisk() || GetParam().kind == BaseParam::kNfs ? 1u : 0u);
  }
  if (OnDisk()) {
    EXPECT_EQ(TempFiles(), 0u);
  }
  auto back = ReadObject(fault_.get(), "sess/1");
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(*back == Pattern(99, 300000));
}

TEST_P(FaultInjectionTest, CrashMidWrite) {
  WriteFaults f;
  f.crash_at = 70000;
  fault_->SetWriteFaults(f);
  auto w = fault_->Create("mid");
  ASSERT_TRUE(w.ok());
  const auto data = Pattern(4, 200000);
  EXPECT_TRUE((*w)->Append(std::span<const uint8_t>(data).first(60000)).ok());
  EXPECT_FALSE((*w)->Append(std::span<const uint8_t>(data).subspan(60000)).ok());
  EXPECT_FALSE((*w)->Commit().ok());
  EXPECT_FALSE((*w)->Abort().ok()) << "a dead writer runs no cleanup";
  w->reset();
  ExpectNothingVisible("mid");
  if (OnDisk()) {
    EXPECT_EQ(TempFiles(), 1u);
  }
  ExpectNextCheckpointWorks("mid");
}

TEST_P(FaultInjectionTest, CrashAtTheLastByteCrashesInCommit) {
  WriteFaults f;
  f.crash_at = 5000;
  fault_->SetWriteFaults(f);
  auto w = fault_->Create("end");
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->Append(Pattern(1, 5000)).ok());
  EXPECT_FALSE((*w)->Commit().ok());
  w->reset();
  ExpectNothingVisible("end");
  EXPECT_EQ(fault_->counters().crashes, 1u);
  ExpectNextCheckpointWorks("end");
}

TEST_P(FaultInjectionTest, ShortWriteIsSilentAndPublishesATruncatedObject) {
  WriteFaults f;
  f.short_write_at = 5000;
  fault_->SetWriteFaults(f);
  const auto data = Pattern(5, 20000);
  ASSERT_TRUE(WriteObject(fault_.get(), "lie", data, 3000).ok());
  auto back = ReadObject(fault_.get(), "lie");
  ASSERT_TRUE(back.ok());
  ASSERT_EQ(back->size(), 5000u);
  EXPECT_TRUE(std::equal(back->begin(), back->end(), data.begin()));
  EXPECT_EQ(fault_->counters().injected_faults, 1u);
}

TEST_P(FaultInjectionTest, ReadIoErrorAndCorruption) {
  const auto data = Pattern(6, 100000);
  ASSERT_TRUE(WriteObject(fault_.get(), "r", data).ok());
  ReadFaults f;
  f.io_error_at = 50000;
  f.corrupt_at = 10;
  fault_->SetReadFaults(f, "r");
  auto r = fault_->Open("r");
  ASSERT_TRUE(r.ok());
  std::vector<uint8_t> buf(100000);
  ASSERT_TRUE((*r)->ReadAt(0, std::span<uint8_t>(buf.data(), 1000)).ok());
  EXPECT_EQ(buf[10], static_cast<uint8_t>(data[10] ^ 0xff));
  EXPECT_EQ(buf[11], data[11]);
  Status s = (*r)->ReadAt(40000, std::span<uint8_t>(buf.data(), 20000));
  EXPECT_EQ(s.code(), StatusCode::kIoError) << s.ToString();
  EXPECT_NE(s.message().find("50000"), std::string::npos) << s.ToString();
  const ReadRequest reqs[] = {{0, std::span<uint8_t>(buf.data(), 10)},
                              {49999, std::span<uint8_t>(buf.data() + 10, 2)}};
  EXPECT_EQ((*r)->ReadBatch(reqs).code(), StatusCode::kIoError);
  ASSERT_TRUE((*r)->ReadAt(50001, std::span<uint8_t>(buf.data(), 49999)).ok());
  EXPECT_EQ(0, std::memcmp(buf.data(), data.data() + 50001, 49999));

  // Objects opened after ClearFaults read clean; the prefix scopes faults.
  fault_->ClearFaults();
  auto clean = ReadObject(fault_.get(), "r");
  ASSERT_TRUE(clean.ok());
  EXPECT_TRUE(*clean == data);
}

TEST_P(FaultInjectionTest, FaultsOnlyForMatchingKeys) {
  WriteFaults f;
  f.no_space_at = 0;
  fault_->SetWriteFaults(f, "doomed/");
  EXPECT_TRUE(WriteObject(fault_.get(), "doomed/x", Pattern(1, 10)).IsNoSpace());
  EXPECT_TRUE(WriteObject(fault_.get(), "fine/x", Pattern(1, 10)).ok());
  auto l = fault_->List();
  ASSERT_TRUE(l.ok());
  ASSERT_EQ(l->size(), 1u);
  EXPECT_EQ((*l)[0].key, "fine/x");
  const auto c = fault_->counters();
  EXPECT_EQ(c.creates, 2u);
  EXPECT_EQ(c.commits, 1u);
  EXPECT_EQ(c.bytes_appended, 10u);
}

const BaseParam kBases[] = {
    {"posix_buffered", "?io=buffered"},
    {"posix_direct", "?io=direct"},
    {"posix_uring", "?io=uring"},
    {"memory", ""},
    {"redis", "?chunk=64k", BaseParam::kRedis},
    {"nfs", "", BaseParam::kNfs},
};

INSTANTIATE_TEST_SUITE_P(Bases, FaultInjectionTest, ::testing::ValuesIn(kBases),
                         [](const ::testing::TestParamInfo<BaseParam>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace tqkv
