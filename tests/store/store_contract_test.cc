// The Store contract (tqkv/store.h), run against every store we have.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "store/shared_store_servers.h"
#include "store/store_test_util.h"
#include "tqkv/aligned_buffer.h"
#include "tqkv/store.h"
#include "store/testing/store_testing.h"

namespace tqkv {
namespace {

using testing_util::Pattern;
using testing_util::ReadObject;
using testing_util::ScratchDir;
using testing_util::WriteObject;

struct StoreParam {
  std::string name;
  // Opens the store in `dir` (a fresh scratch directory).
  std::function<Result<std::unique_ptr<Store>>(const std::string& dir)> make;
  // Skip unless the store really runs in this mode (io_uring may be unavailable at run time).
  std::optional<IoMode> required_mode;
  // Non-empty: why this store cannot run here (its server is not installed); the test skips.
  std::function<std::string()> unavailable = {};
};

std::ostream& operator<<(std::ostream& os, const StoreParam& p) { return os << p.name; }

class StoreContractTest : public ::testing::TestWithParam<StoreParam> {
 protected:
  void SetUp() override {
    ASSERT_TRUE(dir_.ok()) << "cannot create a scratch directory";
    if (GetParam().unavailable) {
      const std::string why = GetParam().unavailable();
      if (!why.empty()) GTEST_SKIP() << why;
    }
    auto store = GetParam().make(dir_.path());
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    store_ = std::move(store).value();
    if (GetParam().required_mode && store_->Caps().io_mode != *GetParam().required_mode) {
      GTEST_SKIP() << "store " << store_->Uri() << " runs as io="
                   << IoModeName(store_->Caps().io_mode) << ", not io="
                   << IoModeName(*GetParam().required_mode)
                   << " (io_uring or O_DIRECT unavailable here)";
    }
  }

  // Shared stores outlive the test: remove what it wrote (temps expire or go with the server).
  void TearDown() override {
    if (store_ == nullptr ||
        (store_->Name() != "redis" && store_->Name() != "nfs" && store_->Name() != "s3")) {
      return;
    }
    auto l = store_->List();
    if (!l.ok()) return;
    for (const auto& info : *l) (void)store_->Remove(info.key);
  }

  // Writes `data` under `key` and checks it reads back whole.
  void RoundTrip(const std::string& key, const std::vector<uint8_t>& data, size_t piece) {
    ASSERT_TRUE(WriteObject(store_.get(), key, data, piece).ok());
    auto r = store_->Open(key);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ((*r)->Size(), data.size());
    if (data.empty()) {
      EXPECT_TRUE((*r)->ReadAt(0, {}).ok());
      return;
    }
    // Aligned destination.
    AlignedBuffer aligned(data.size() + 1);
    ASSERT_TRUE((*r)->ReadAt(0, std::span<uint8_t>(aligned.data(), data.size())).ok());
    EXPECT_EQ(0, std::memcmp(aligned.data(), data.data(), data.size())) << key;
    // Destination off by one byte.
    AlignedBuffer unaligned(data.size() + 1);
    ASSERT_TRUE((*r)->ReadAt(0, std::span<uint8_t>(unaligned.data() + 1, data.size())).ok());
    EXPECT_EQ(0, std::memcmp(unaligned.data() + 1, data.data(), data.size())) << key;
  }

  ScratchDir dir_;
  std::unique_ptr<Store> store_;
};

TEST_P(StoreContractTest, WriteCommitReadBackSizes) {
  const size_t sizes[] = {0, 1, 4095, 4096, 4097, (3u << 20) + 17};
  for (size_t size : sizes) {
    SCOPED_TRACE("size " + std::to_string(size));
    const auto data = Pattern(size, size);
    RoundTrip("size/" + std::to_string(size), data, 0);
    // Odd append sizes exercise the staging buffer across its boundaries.
    RoundTrip("pieces/" + std::to_string(size), data, 1000);
  }
}

TEST_P(StoreContractTest, LargeAppendsFromAlignedAndUnalignedMemory) {
  const size_t size = (9u << 20) + 5;
  const auto data = Pattern(9, size);
  AlignedBuffer src(size + 1);
  std::memcpy(src.data(), data.data(), size);
  auto w = store_->Create("big/aligned");
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->Append(std::span<const uint8_t>(src.data(), size)).ok());
  EXPECT_EQ((*w)->BytesWritten(), size);
  ASSERT_TRUE((*w)->Commit().ok());

  std::memcpy(src.data() + 1, data.data(), size);
  auto w2 = store_->Create("big/unaligned");
  ASSERT_TRUE(w2.ok());
  ASSERT_TRUE((*w2)->Append(std::span<const uint8_t>(src.data() + 1, 17)).ok());
  ASSERT_TRUE((*w2)->Append(std::span<const uint8_t>(src.data() + 18, size - 17)).ok());
  ASSERT_TRUE((*w2)->Commit().ok());

  for (const char* key : {"big/aligned", "big/unaligned"}) {
    auto back = ReadObject(store_.get(), key);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_TRUE(*back == data) << key;
  }
}

TEST_P(StoreContractTest, RandomReadsIncludingUnaligned) {
  const size_t size = (3u << 20) + 17;
  const auto data = Pattern(42, size);
  ASSERT_TRUE(WriteObject(store_.get(), "obj", data, 65536 + 3).ok());
  auto r = store_->Open("obj");
  ASSERT_TRUE(r.ok());
  std::mt19937_64 rng(7);
  AlignedBuffer buf(size + 8192);
  for (int i = 0; i < 300; ++i) {
    uint64_t off;
    uint64_t len;
    size_t shift;
    switch (i % 4) {
      case 0:  // everything aligned
        off = (rng() % (size / 4096)) * 4096;
        len = std::min<uint64_t>((1 + rng() % 64) * 4096, size - off);
        shift = 0;
        break;
      case 1:  // aligned offset, odd length, aligned buffer
        off = (rng() % (size / 4096)) * 4096;
        len = std::min<uint64_t>(1 + rng() % 300000, size - off);
        shift = 0;
        break;
      case 2:  // buffer and offset with the same misalignment
        off = rng() % size;
        len = std::min<uint64_t>(1 + rng() % 300000, size - off);
        shift = off % 4096;
        break;
      default:  // anything
        off = rng() % size;
        len = std::min<uint64_t>(1 + rng() % 2000000, size - off);
        shift = rng() % 4096;
        break;
    }
    if (i % 50 == 0) {  // the tail: last partial block
      off = size - 1 - rng() % 5000;
      len = size - off;
    }
    std::span<uint8_t> dst(buf.data() + shift, len);
    ASSERT_TRUE((*r)->ReadAt(off, dst).ok()) << "off " << off << " len " << len;
    ASSERT_EQ(0, std::memcmp(dst.data(), data.data() + off, len))
        << "off " << off << " len " << len << " shift " << shift;
  }
  EXPECT_GT((*r)->BytesRead() + (store_->Name() == "memory" ? 1 : 0), 0u);
}

TEST_P(StoreContractTest, ReadBatchManyRequests) {
  const size_t size = (5u << 20) + 333;
  const auto data = Pattern(5, size);
  ASSERT_TRUE(WriteObject(store_.get(), "batch", data).ok());
  auto r = store_->Open("batch");
  ASSERT_TRUE(r.ok());
  std::mt19937_64 rng(11);
  std::vector<ReadRequest> reqs;
  std::vector<std::pair<uint64_t, uint64_t>> want;
  AlignedBuffer buf(64u << 20);
  size_t cursor = 0;
  for (int i = 0; i < 400; ++i) {
    uint64_t off = (i % 3 == 0) ? (rng() % (size / 4096)) * 4096 : rng() % size;
    uint64_t len = std::min<uint64_t>((i % 7 == 0) ? 1 + rng() % (3u << 20) : 1 + rng() % 70000,
                                      size - off);
    if (i % 3 == 0) cursor = AlignUp(cursor, 4096);
    else cursor += rng() % 64;
    if (cursor + len > buf.size()) break;
    reqs.push_back(ReadRequest{off, std::span<uint8_t>(buf.data() + cursor, len)});
    want.emplace_back(off, len);
    cursor += len;
  }
  ASSERT_GT(reqs.size(), 100u);
  ASSERT_TRUE((*r)->ReadBatch(reqs).ok());
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_EQ(0, std::memcmp(reqs[i].dst.data(), data.data() + want[i].first, want[i].second))
        << "request " << i;
  }
  EXPECT_TRUE((*r)->ReadBatch({}).ok());
}

TEST_P(StoreContractTest, ReadPastEndIsAnErrorNotACrash) {
  const auto data = Pattern(1, 10000);
  ASSERT_TRUE(WriteObject(store_.get(), "short", data).ok());
  auto r = store_->Open("short");
  ASSERT_TRUE(r.ok());
  std::vector<uint8_t> buf(20000);
  Status s = (*r)->ReadAt(9990, std::span<uint8_t>(buf.data(), 20));
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  EXPECT_NE(s.message().find("short"), std::string::npos) << "names the object: " << s.ToString();
  EXPECT_TRUE((*r)->ReadAt(10001, std::span<uint8_t>(buf.data(), 0)).IsCorruption());
  EXPECT_TRUE((*r)->ReadAt(UINT64_MAX, std::span<uint8_t>(buf.data(), 1)).IsCorruption());
  EXPECT_TRUE((*r)->ReadAt(10000, std::span<uint8_t>(buf.data(), 0)).ok());
  EXPECT_TRUE((*r)->ReadAt(0, std::span<uint8_t>(buf.data(), 20000)).IsCorruption());
  const ReadRequest reqs[] = {{0, std::span<uint8_t>(buf.data(), 100)},
                              {9999, std::span<uint8_t>(buf.data() + 100, 2)}};
  EXPECT_FALSE((*r)->ReadBatch(reqs).ok());
  // The object is still usable afterwards.
  ASSERT_TRUE((*r)->ReadAt(9000, std::span<uint8_t>(buf.data(), 1000)).ok());
  EXPECT_EQ(0, std::memcmp(buf.data(), data.data() + 9000, 1000));
}

TEST_P(StoreContractTest, NotVisibleBeforeCommit) {
  auto w = store_->Create("pending/x");
  ASSERT_TRUE(w.ok());
  const auto data = Pattern(3, 100000);
  ASSERT_TRUE((*w)->Append(data).ok());
  EXPECT_TRUE(store_->Open("pending/x").status().IsNotFound());
  auto listed = store_->List();
  ASSERT_TRUE(listed.ok());
  EXPECT_TRUE(listed->empty());
  ASSERT_TRUE((*w)->Commit().ok());
  auto back = ReadObject(store_.get(), "pending/x");
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(*back == data);
  // Misuse after commit is refused, not fatal.
  EXPECT_EQ((*w)->Append(data).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*w)->Commit().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*w)->Abort().code(), StatusCode::kInvalidArgument);
}

TEST_P(StoreContractTest, AbortLeavesNothing) {
  auto w = store_->Create("gone");
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->Append(Pattern(4, 50000)).ok());
  ASSERT_TRUE((*w)->Abort().ok());
  EXPECT_TRUE(store_->Open("gone").status().IsNotFound());
  EXPECT_EQ((*w)->Commit().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(store_->Open("gone").status().IsNotFound());
  auto listed = store_->List();
  ASSERT_TRUE(listed.ok());
  EXPECT_TRUE(listed->empty());
  if (store_->Name() == "posix" || store_->Name() == "fault") {
    EXPECT_TRUE(dir_.Files().empty()) << "leftover " << dir_.Files().front();
  }
}

TEST_P(StoreContractTest, DestroyedWriterLeavesNothingReadable) {
  {
    auto w = store_->Create("dropped/obj");
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->Append(Pattern(5, 70000)).ok());
  }
  EXPECT_TRUE(store_->Open("dropped/obj").status().IsNotFound());
  auto listed = store_->List();
  ASSERT_TRUE(listed.ok());
  EXPECT_TRUE(listed->empty());
  if (store_->Name() == "posix" || store_->Name() == "fault") {
    EXPECT_TRUE(dir_.Files().empty()) << "leftover " << dir_.Files().front();
  }
  // And the key is free for the next writer.
  ASSERT_TRUE(WriteObject(store_.get(), "dropped/obj", Pattern(6, 10)).ok());
  EXPECT_TRUE(store_->Open("dropped/obj").ok());
}

TEST_P(StoreContractTest, OverwriteLastCommitWins) {
  const auto v1 = Pattern(1, 20000);
  const auto v2 = Pattern(2, 30000);
  const auto v3 = Pattern(3, 5000);
  ASSERT_TRUE(WriteObject(store_.get(), "k", v1).ok());
  auto old_reader = store_->Open("k");
  ASSERT_TRUE(old_reader.ok());

  auto w2 = store_->Create("k");
  auto w3 = store_->Create("k");
  ASSERT_TRUE(w2.ok() && w3.ok());
  ASSERT_TRUE((*w2)->Append(v2).ok());
  ASSERT_TRUE((*w3)->Append(v3).ok());
  ASSERT_TRUE((*w3)->Commit().ok());
  ASSERT_TRUE((*w2)->Commit().ok());  // committed last: wins
  auto back = ReadObject(store_.get(), "k");
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(*back == v2);

  // A reader opened before the overwrite keeps seeing the whole old object; on s3, whose
  // objects are replaced in place, it gets NotFound (its ETag is gone), never new bytes.
  ASSERT_EQ((*old_reader)->Size(), v1.size());
  std::vector<uint8_t> old(v1.size());
  Status old_read = (*old_reader)->ReadAt(0, old);
  if (store_->Name() == "s3") {
    EXPECT_TRUE(old_read.IsNotFound()) << old_read.ToString();
  } else {
    ASSERT_TRUE(old_read.ok()) << old_read.ToString();
    EXPECT_TRUE(old == v1);
  }

  auto listed = store_->List();
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].size, v2.size());
}

int64_t UnixNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

TEST_P(StoreContractTest, ListAndRemove) {
  const int64_t before_ns = UnixNowNs();
  ASSERT_TRUE(WriteObject(store_.get(), "b/d/e", Pattern(1, 3)).ok());
  ASSERT_TRUE(WriteObject(store_.get(), "a", Pattern(1, 1)).ok());
  ASSERT_TRUE(WriteObject(store_.get(), "bb", Pattern(1, 4)).ok());
  ASSERT_TRUE(WriteObject(store_.get(), "b/c", Pattern(1, 2)).ok());
  ASSERT_TRUE(WriteObject(store_.get(), "b.x", Pattern(1, 5)).ok());

  auto keys = [&](std::string_view prefix) {
    std::vector<std::string> out;
    auto l = store_->List(prefix);
    EXPECT_TRUE(l.ok()) << l.status().ToString();
    if (l.ok()) {
      for (const auto& info : *l) out.push_back(info.key);
    }
    return out;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(keys(""), (V{"a", "b.x", "b/c", "b/d/e", "bb"}));
  EXPECT_EQ(keys("b/"), (V{"b/c", "b/d/e"}));
  EXPECT_EQ(keys("b"), (V{"b.x", "b/c", "b/d/e", "bb"}));
  EXPECT_EQ(keys("b/d"), (V{"b/d/e"}));
  EXPECT_EQ(keys("b/d/e"), (V{"b/d/e"}));
  EXPECT_EQ(keys("zz"), V{});
  EXPECT_EQ(keys("../"), V{});

  auto all = store_->List();
  ASSERT_TRUE(all.ok());
  for (const auto& info : *all) {
    // Publish time, give or take the filesystem's timestamp granularity.
    EXPECT_GE(info.mtime_ns, before_ns - 2'000'000'000) << info.key;
    EXPECT_LE(info.mtime_ns, UnixNowNs() + 2'000'000'000) << info.key;
    if (info.key == "b/d/e") {
      EXPECT_EQ(info.size, 3u);
    }
    if (info.key == "b.x") {
      EXPECT_EQ(info.size, 5u);
    }
  }

  EXPECT_TRUE(store_->Remove("b/c").ok());
  EXPECT_TRUE(store_->Open("b/c").status().IsNotFound());
  EXPECT_TRUE(store_->Remove("b/c").IsNotFound());
  EXPECT_TRUE(store_->Remove("nothing/here").IsNotFound());
  EXPECT_EQ(keys("b/"), (V{"b/d/e"}));
}

TEST_P(StoreContractTest, BadKeysRejected) {
  const std::string bad[] = {"../x", "/abs", "a//b", "a/./b", "", std::string("a\0b", 3),
                             std::string(300, 'k'), "a/", "..", ".", "a/../b", "sp ace",
                             "dir.tqkv/x", "back\\slash",
                             // the stores' own names (issue 13, defects 3 and 4)
                             ".tqkv-probe.x", "a.tqkv.tmp.x", "a.tqkv.pin", ".a.tqkv.tmp.1.tqkv",
                             "d/.tqkv-probe.1"};
  for (const std::string& key : bad) {
    SCOPED_TRACE("key \"" + key + "\"");
    EXPECT_EQ(store_->Create(key).status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(store_->Open(key).status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(store_->Remove(key).code(), StatusCode::kInvalidArgument);
  }
  // Nothing escaped the store's directory.
  EXPECT_TRUE(dir_.Files().empty());
  // And the edge of the good side works.
  const std::string longest(200, 'k');
  ASSERT_TRUE(WriteObject(store_.get(), longest, Pattern(1, 7)).ok());
  ASSERT_TRUE(WriteObject(store_.get(), ".hidden-ish_key.v1", Pattern(1, 7)).ok());
  // ".tqkv" may end a key; names that only look like internal ones are ordinary keys.
  ASSERT_TRUE(WriteObject(store_.get(), "x.tqkv", Pattern(1, 7)).ok());
  ASSERT_TRUE(WriteObject(store_.get(), "tqkv.tmp.x", Pattern(1, 7)).ok());
  auto l = store_->List();
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->size(), 4u);
}

// Only a store of local files has a local path, and it is the file of the committed object.
TEST_P(StoreContractTest, LocalPathIsTheCommittedObjectsFile) {
  const auto data = Pattern(3, 5000);
  ASSERT_TRUE(WriteObject(store_.get(), "lp/k", data).ok());
  const std::optional<std::string> path = store_->LocalPath("lp/k");
  const bool local = store_->Name() == "posix";
  ASSERT_EQ(path.has_value(), local) << store_->Name();
  EXPECT_EQ(store_->LocalRoot().has_value(), local);
  EXPECT_FALSE(store_->LocalPath("../x").has_value());
  if (!local) return;
  EXPECT_EQ(*path, *store_->LocalRoot() + "/lp/k.tqkv");
  struct stat st {};
  ASSERT_EQ(::stat(path->c_str(), &st), 0) << *path;
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), data.size());
}

// Content derived from (writer, round): a reader can tell whose whole object it got.
std::vector<uint8_t> WriterContent(uint32_t writer, uint32_t round) {
  const size_t size = 40000 + writer * 9001 + round * 13;
  auto v = Pattern(writer * 1000 + round, size);
  std::memcpy(v.data(), &writer, 4);
  std::memcpy(v.data() + 4, &round, 4);
  return v;
}

TEST_P(StoreContractTest, ConcurrentWritersNeverTornForReaders) {
  constexpr uint32_t kWriters = 4;
  constexpr uint32_t kRounds = 12;
  ASSERT_TRUE(WriteObject(store_.get(), "shared/key", WriterContent(0, 0)).ok());
  std::atomic<int> writers_left{kWriters};
  std::atomic<int> failures{0};
  std::atomic<int> reads{0};
  std::atomic<int> raced{0};
  std::vector<std::thread> threads;
  for (uint32_t w = 0; w < kWriters; ++w) {
    threads.emplace_back([&, w] {
      for (uint32_t round = 1; round <= kRounds; ++round) {
        // Odd append sizes so writers interleave mid-object.
        if (!WriteObject(store_.get(), "shared/key", WriterContent(w, round), 7777).ok()) {
          failures.fetch_add(1);
        }
      }
      writers_left.fetch_sub(1);
    });
  }
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&] {
      while (writers_left.load() > 0 || reads.load() < 4) {
        auto r = store_->Open("shared/key");
        if (!r.ok()) {
          failures.fetch_add(1);
          continue;
        }
        std::vector<uint8_t> got((*r)->Size());
        Status read = got.size() < 8 ? Status::Corruption("short") : (*r)->ReadAt(0, got);
        // s3 replaces objects in place: a version replaced after Open is NotFound, and the
        // reader opens again (docs/store.md). Never torn bytes.
        if (read.IsNotFound() && store_->Name() == "s3") {
          raced.fetch_add(1);
          continue;
        }
        if (!read.ok()) {
          failures.fetch_add(1);
          continue;
        }
        uint32_t writer;
        uint32_t round;
        std::memcpy(&writer, got.data(), 4);
        std::memcpy(&round, got.data() + 4, 4);
        if (writer >= kWriters || round > kRounds || got != WriterContent(writer, round)) {
          failures.fetch_add(1);
        }
        reads.fetch_add(1);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_GE(reads.load(), 4);
  auto l = store_->List();
  ASSERT_TRUE(l.ok());
  ASSERT_EQ(l->size(), 1u);
  auto last = ReadObject(store_.get(), "shared/key");
  ASSERT_TRUE(last.ok());
  uint32_t writer;
  uint32_t round;
  std::memcpy(&writer, last->data(), 4);
  std::memcpy(&round, last->data() + 4, 4);
  EXPECT_EQ(round, kRounds);  // every writer's last commit is its round kRounds
  EXPECT_TRUE(*last == WriterContent(writer, round));
}

TEST_P(StoreContractTest, ObjectsOutliveTheirStore) {
  const auto data = Pattern(12, 70000);
  ASSERT_TRUE(WriteObject(store_.get(), "old", data).ok());
  auto r = store_->Open("old");
  auto w = store_->Create("new");
  ASSERT_TRUE(r.ok() && w.ok());
  store_.reset();
  std::vector<uint8_t> back(data.size());
  ASSERT_TRUE((*r)->ReadAt(0, back).ok());
  EXPECT_TRUE(back == data);
  ASSERT_TRUE((*w)->Append(data).ok());
  EXPECT_TRUE((*w)->Commit().ok());
}

TEST_P(StoreContractTest, DropCacheWhenSupported) {
  ASSERT_TRUE(WriteObject(store_.get(), "dc", Pattern(8, 100000)).ok());
  auto r = store_->Open("dc");
  ASSERT_TRUE(r.ok());
  Status s = (*r)->DropCache();
  if (store_->Caps().drop_cache) {
    EXPECT_TRUE(s.ok()) << s.ToString();
  } else {
    EXPECT_EQ(s.code(), StatusCode::kUnsupported);
  }
  std::vector<uint8_t> back(100000);
  ASSERT_TRUE((*r)->ReadAt(0, back).ok());
  EXPECT_TRUE(back == Pattern(8, 100000));
}

Result<std::unique_ptr<Store>> Posix(const std::string& dir, const char* query) {
  return OpenStore("file://" + dir + query);
}

// Shared stores: each test gets its own key prefix (redis) or directory (nfs).
std::string RedisUnavailable() {
  const auto& s = testing_util::TestServers();
  return s.redis.empty() && !s.redis_missing.empty() ? s.redis_missing + "; redis store not tested"
                                                     : "";
}
std::string RedisClusterUnavailable() {
  const auto& s = testing_util::TestServers();
  return s.redis_cluster.empty() ? s.redis_cluster_skip + "; redis cluster store not tested" : "";
}
std::string NfsUnavailable() {
  const auto& s = testing_util::TestServers();
  return s.nfs.empty() && !s.nfs_missing.empty() ? s.nfs_missing + "; nfs store not tested" : "";
}
Result<std::unique_ptr<Store>> Shared(const std::string& uri, const char* what) {
  if (uri.empty()) {
    return Status::IoError(std::string(what) + " test server did not start: " +
                           testing_util::TestServers().start_error);
  }
  return OpenStore(uri);
}
Result<std::unique_ptr<Store>> Redis(const std::string& base, const std::string& query) {
  if (base.empty()) return Shared(base, "redis");
  return Shared(base + "/" + testing_util::UniqueName("ct") + query, "redis");
}
Result<std::unique_ptr<Store>> Nfs(const std::string& query) {
  const auto& s = testing_util::TestServers();
  if (s.nfs.empty()) return Shared(s.nfs, "nfs");
  return Shared(testing_util::WithSubdir(s.nfs, testing_util::UniqueName("ct"), query), "nfs");
}

std::string S3Unavailable() {
  const std::string why = testing_util::S3Skip();
  return why.empty() ? why : why + "; s3 store not tested";
}
Result<std::unique_ptr<Store>> S3(const std::string& opts) {
  const std::string uri = testing_util::S3UriWithPrefix(testing_util::UniqueName("ct"), opts);
  return Shared(uri, "s3");
}

const StoreParam kStores[] = {
    // part=5MiB: the 9 MiB objects go up as multipart uploads, the smaller ones in one PUT.
    {"s3", [](const std::string&) { return S3("part=5MiB&lanes=4&get=1MiB"); }, {}, S3Unavailable},
    {"redis_tcp",
     [](const std::string&) { return Redis(testing_util::TestServers().redis, "?chunk=64k"); },
     {}, RedisUnavailable},
    {"redis_unix",
     [](const std::string&) {
       return Redis(testing_util::TestServers().redis_unix, "?chunk=1MiB&io=buffered");
     },
     {}, RedisUnavailable},
    {"redis_cluster",
     [](const std::string&) {
       return Redis(testing_util::TestServers().redis_cluster, "?chunk=64k");
     },
     {}, RedisClusterUnavailable},
    {"nfs", [](const std::string&) { return Nfs("chunk=256k&io=buffered"); }, {}, NfsUnavailable},
    {"fault_over_nfs",
     [](const std::string&) -> Result<std::unique_ptr<Store>> {
       TQKV_ASSIGN_OR_RETURN(auto base, Nfs(""));
       return std::unique_ptr<Store>(std::make_unique<FaultInjectionStore>(std::move(base)));
     },
     {}, NfsUnavailable},
    {"posix_buffered", [](const std::string& d) { return Posix(d, "?io=buffered"); }, {}},
    {"posix_direct", [](const std::string& d) { return Posix(d, "?io=direct"); },
     IoMode::kDirect},
    {"posix_direct_threads",
     [](const std::string& d) { return Posix(d, "?io=direct&engine=threads&chunk=64k"); },
     IoMode::kDirect},
    {"posix_uring", [](const std::string& d) { return Posix(d, "?io=uring&qd=8&chunk=256k"); },
     IoMode::kUring},
    {"posix_plain_path", [](const std::string& d) { return OpenStore(d); }, {}},
    {"memory", [](const std::string&) { return OpenStore("memory://"); }, {}},
    {"fault_over_posix",
     [](const std::string& d) -> Result<std::unique_ptr<Store>> {
       TQKV_ASSIGN_OR_RETURN(auto base, Posix(d, "?io=direct"));
       return std::unique_ptr<Store>(std::make_unique<FaultInjectionStore>(std::move(base)));
     },
     {}},
    {"throttled_over_memory",
     [](const std::string&) -> Result<std::unique_ptr<Store>> {
       ThrottleOptions o;
       o.read_bytes_per_sec = 4e9;
       o.write_bytes_per_sec = 4e9;
       return std::unique_ptr<Store>(
           std::make_unique<ThrottledStore>(std::make_unique<MemoryStore>(), o));
     },
     {}},
};

INSTANTIATE_TEST_SUITE_P(AllStores, StoreContractTest, ::testing::ValuesIn(kStores),
                         [](const ::testing::TestParamInfo<StoreParam>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace tqkv
