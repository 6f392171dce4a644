// Failures during checkpoint never leave a restorable partial session and never block the next
// checkpoint; damaged stored sessions fail restore and verify with a clear error.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "store/store_test_util.h"
#include "tqkv/checkpoint.h"
#include "store/testing/store_testing.h"
#include "tqkv/synthetic.h"

namespace tqkv::fault_test {
namespace {

constexpr ModelGeometry kGeo{2, 2, 64};
constexpr uint64_t kTokens = 48;

std::unique_ptr<KvCacheBuffer> Session(uint64_t seed) {
  auto buf = KvCacheBuffer::Allocate("m", kGeo, DType::kF16, kTokens).value();
  SyntheticKv(SyntheticKind::kKv, kGeo, seed).FillCache(buf->cache()).ok();
  return buf;
}

CheckpointOptions Opts() {
  CheckpointOptions o;
  o.codec = ParseCodecSpec("tq3").value();
  o.token_block = 16;
  return o;
}

bool Equal(const KvCache& a, const KvCache& b) {
  for (uint32_t l = 0; l < a.geometry().layers; ++l) {
    if (std::memcmp(a.k(l), b.k(l), a.tensor_bytes()) || std::memcmp(a.v(l), b.v(l), a.tensor_bytes())) {
      return false;
    }
  }
  return true;
}

class CheckpointFaults : public ::testing::TestWithParam<bool> {  // param: posix (else memory)
 protected:
  std::unique_ptr<Store> Base() {
    if (!GetParam()) return std::make_unique<MemoryStore>();
    return OpenStore("file://" + dir_.path()).value();
  }
  testing_util::ScratchDir dir_;
};

TEST_P(CheckpointFaults, NoPartialSessionAndNextCheckpointSucceeds) {
  auto session_old = Session(1), session_new = Session(2);
  // Size of a full container, to place faults across it.
  uint64_t full = 0;
  {
    MemoryStore probe;
    full = Checkpoint(session_new->cache(), Opts(), probe, "x").value().bytes_written;
  }
  ASSERT_GT(full, 3 * 4096u);
  for (int with_previous = 0; with_previous < 2; ++with_previous) {
    for (uint64_t at : {uint64_t{0}, uint64_t{100}, uint64_t{4096}, full / 2, full - 64, full - 1}) {
      for (int kind = 0; kind < 5; ++kind) {
        FaultInjectionStore store(Base());
        const std::string key = "sess-" + std::to_string(with_previous) + "-" + std::to_string(at) +
                                "-" + std::to_string(kind);
        if (with_previous) {
          ASSERT_TRUE(Checkpoint(session_old->cache(), Opts(), store, key).ok());
        }
        WriteFaults f;
        if (kind == 0) f.no_space_at = at;
        if (kind == 1) f.io_error_at = at;
        if (kind == 2) f.crash_at = at;
        if (kind == 3) f.crash_before_publish = true;
        if (kind == 4) f.fail_commit = true;
        store.SetWriteFaults(f);
        auto st = Checkpoint(session_new->cache(), Opts(), store, key);
        ASSERT_FALSE(st.ok()) << "fault kind " << kind << " at " << at;
        if (kind == 0) {
          EXPECT_EQ(st.status().code(), StatusCode::kNoSpace) << st.status().ToString();
        }
        store.ClearFaults();
        // Nothing new is readable: either the old session, intact, or nothing.
        auto restored = Restore(store, key, {});
        if (with_previous) {
          ASSERT_TRUE(restored.ok()) << restored.status().ToString();
          MemoryStore ref;
          ASSERT_TRUE(Checkpoint(session_old->cache(), Opts(), ref, "o").ok());
          auto old_decoded = Restore(ref, "o", {}).value();
          EXPECT_TRUE(Equal((*restored)->cache(), old_decoded->cache()));
        } else {
          EXPECT_EQ(restored.status().code(), StatusCode::kNotFound) << restored.status().ToString();
        }
        // The next checkpoint of the same session succeeds and restores the new data.
        ASSERT_TRUE(Checkpoint(session_new->cache(), Opts(), store, key).ok());
        MemoryStore ref;
        ASSERT_TRUE(Checkpoint(session_new->cache(), Opts(), ref, "n").ok());
        EXPECT_TRUE(Equal(Restore(store, key, {}).value()->cache(), Restore(ref, "n", {}).value()->cache()));
        if (GetParam()) (void)store.RemoveStaleTemps(std::chrono::seconds(0));
      }
    }
  }
  if (GetParam()) {
    // Only published sessions remain once stale temporaries are collected.
    for (const auto& f : dir_.Files()) EXPECT_EQ(f.find(".tmp"), std::string::npos) << f;
  }
}

INSTANTIATE_TEST_SUITE_P(Stores, CheckpointFaults, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "posix" : "memory"; });

TEST(CheckpointCorruption, SilentlyDroppedBytesAreCaughtOnRestore) {
  FaultInjectionStore store(std::make_unique<MemoryStore>());
  auto session = Session(3);
  WriteFaults f;
  f.short_write_at = 9000;  // a lying device: the object is published truncated
  store.SetWriteFaults(f);
  ASSERT_TRUE(Checkpoint(session->cache(), Opts(), store, "short").ok());
  store.ClearFaults();
  auto r = Restore(store, "short", {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kCorruption) << r.status().ToString();
  EXPECT_FALSE(VerifyObject(store, "short").ok());
}

TEST(CheckpointCorruption, BitRotAnywhereFailsRestoreAndVerify) {
  auto session = Session(4);
  MemoryStore clean;
  const uint64_t size = Checkpoint(session->cache(), Opts(), clean, "s").value().bytes_written;
  // Every 37th byte, padding included (the container tests flip every byte of the format).
  for (uint64_t at = 0; at < size; at += 37) {
    FaultInjectionStore store(std::make_unique<MemoryStore>());
    ASSERT_TRUE(Checkpoint(session->cache(), Opts(), store, "s").ok());
    ReadFaults rf;
    rf.corrupt_at = at;
    store.SetReadFaults(rf);
    auto r = Restore(store, "s", {});
    ASSERT_FALSE(r.ok()) << "undetected change at byte " << at;
    EXPECT_TRUE(r.status().code() == StatusCode::kCorruption ||
                r.status().code() == StatusCode::kUnsupported)
        << at << ": " << r.status().ToString();
    EXPECT_FALSE(VerifyObject(store, "s").ok());
  }
}

TEST(CheckpointCorruption, ReadErrorsSurface) {
  FaultInjectionStore store(std::make_unique<MemoryStore>());
  auto session = Session(5);
  ASSERT_TRUE(Checkpoint(session->cache(), Opts(), store, "e").ok());
  ReadFaults rf;
  rf.io_error_at = 5000;
  store.SetReadFaults(rf);
  auto r = Restore(store, "e", {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kIoError) << r.status().ToString();
}

}  // namespace
}  // namespace tqkv::fault_test
