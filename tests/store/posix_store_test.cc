// What is specific to the POSIX store: file layout, temp files, fallbacks, URI options.
#include "store/posix/posix_store.h"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <cerrno>
#include <filesystem>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

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

std::vector<uint8_t> FileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

std::unique_ptr<Store> MustOpen(const std::string& uri) {
  auto s = OpenStore(uri);
  EXPECT_TRUE(s.ok()) << uri << ": " << s.status().ToString();
  return s.ok() ? std::move(s).value() : nullptr;
}

TEST(PosixStoreTest, KeyMapsToFileUnderDirectory) {
  ScratchDir dir;
  for (const char* io : {"buffered", "direct"}) {
    auto store = MustOpen("file://" + dir.path() + "?io=" + io);
    ASSERT_NE(store, nullptr);
    const auto data = Pattern(1, 4097);
    const std::string key = std::string("sessions/") + io + "/s1";
    ASSERT_TRUE(WriteObject(store.get(), key, data, 100).ok());
    const std::string path = dir.path() + "/" + key + ".tqkv";
    struct stat st {};
    ASSERT_EQ(::stat(path.c_str(), &st), 0) << path;
    EXPECT_EQ(static_cast<uint64_t>(st.st_size), 4097u) << "O_DIRECT padding is truncated away";
    EXPECT_TRUE(FileBytes(path) == data);
  }
}

TEST(PosixStoreTest, WriterUsesHiddenUniqueTempThatIsNeverListed) {
  ScratchDir dir;
  auto store = MustOpen(dir.path());
  ASSERT_NE(store, nullptr);
  auto w1 = store->Create("a/k");
  auto w2 = store->Create("a/k");
  ASSERT_TRUE(w1.ok() && w2.ok());
  ASSERT_TRUE((*w1)->Append(Pattern(1, 10)).ok());
  ASSERT_TRUE((*w2)->Append(Pattern(2, 10)).ok());
  auto files = dir.Files();
  ASSERT_EQ(files.size(), 2u);
  for (const auto& f : files) {
    EXPECT_EQ(f.rfind("a/.k.tqkv.tmp.", 0), 0u) << f;
  }
  EXPECT_NE(files[0], files[1]);
  auto l = store->List();
  ASSERT_TRUE(l.ok());
  EXPECT_TRUE(l->empty());
  ASSERT_TRUE((*w1)->Abort().ok());
  ASSERT_TRUE((*w2)->Commit().ok());
  files = dir.Files();
  ASSERT_EQ(files.size(), 1u);
  EXPECT_EQ(files[0], "a/k.tqkv");
}

TEST(PosixStoreTest, StaleTempFromCrashedProcessIsHarmlessAndCollected) {
  ScratchDir dir;
  auto store = MustOpen(dir.path());
  ASSERT_NE(store, nullptr);
  // What a writer killed mid-checkpoint leaves: a temp file, and a directory it created.
  ASSERT_EQ(::mkdir((dir.path() + "/s").c_str(), 0755), 0);
  const std::string stale = dir.path() + "/s/.x.tqkv.tmp.4242.0123456789abcdef";
  { std::ofstream(stale) << "half a checkpoint"; }
  struct timespec old_times[2] = {{1000, 0}, {1000, 0}};  // 1970: very old
  ASSERT_EQ(::utimensat(AT_FDCWD, stale.c_str(), old_times, 0), 0);
  const std::string fresh = dir.path() + "/s/.y.tqkv.tmp.4243.0123456789abcdef";
  { std::ofstream(fresh) << "someone still writing"; }

  EXPECT_TRUE(store->Open("s/x").status().IsNotFound());
  const auto data = Pattern(3, 5000);
  ASSERT_TRUE(WriteObject(store.get(), "s/x", data).ok());
  auto l = store->List();
  ASSERT_TRUE(l.ok());
  ASSERT_EQ(l->size(), 1u);
  EXPECT_EQ((*l)[0].key, "s/x");

  auto removed = store->RemoveStaleTemps(std::chrono::minutes(10));
  ASSERT_TRUE(removed.ok()) << removed.status().ToString();
  EXPECT_EQ(*removed, 1u);
  EXPECT_NE(::access(fresh.c_str(), F_OK), -1) << "a recent temp may belong to a live writer";
  EXPECT_EQ(::access(stale.c_str(), F_OK), -1);
  auto back = ReadObject(store.get(), "s/x");
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(*back == data);
}

TEST(PosixStoreTest, JunkFilesInTheDirectoryAreNotObjects) {
  ScratchDir dir;
  auto store = MustOpen(dir.path());
  ASSERT_NE(store, nullptr);
  { std::ofstream(dir.path() + "/notes.txt") << "x"; }
  { std::ofstream(dir.path() + "/bad name.tqkv") << "x"; }
  ASSERT_EQ(::symlink("/etc/passwd", (dir.path() + "/link.tqkv").c_str()), 0);
  ASSERT_TRUE(WriteObject(store.get(), "real", Pattern(1, 3)).ok());
  auto l = store->List();
  ASSERT_TRUE(l.ok());
  ASSERT_EQ(l->size(), 1u);
  EXPECT_EQ((*l)[0].key, "real");
}

TEST(PosixStoreTest, DirectFallsBackToBufferedWhenRefused) {
  ScratchDir dir;
  for (IoMode mode : {IoMode::kDirect, IoMode::kUring}) {
    PosixStoreOptions o;
    o.dir = dir.path();
    o.io = mode;
    o.simulate_no_direct = true;
    auto store = OpenPosixStore(o);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    const StoreCaps caps = (*store)->Caps();
    EXPECT_EQ(caps.io_mode, IoMode::kBuffered);
    EXPECT_TRUE(caps.io_fell_back);
    const auto data = Pattern(2, 100001);
    const std::string key = std::string("fb/") + std::string(IoModeName(mode));
    ASSERT_TRUE(WriteObject(store->get(), key, data, 777).ok());
    auto back = ReadObject(store->get(), key);
    ASSERT_TRUE(back.ok());
    EXPECT_TRUE(*back == data);
    auto r = (*store)->Open(key);
    ASSERT_TRUE(r.ok());
    std::vector<uint8_t> some(5000);
    ASSERT_TRUE((*r)->ReadAt(100, some).ok());
    EXPECT_EQ((*r)->PathBytes().direct, 0u);
    EXPECT_EQ((*r)->PathBytes().page_cache, (*r)->BytesRead());
  }
}

TEST(PosixStoreTest, ShortTransfersAreResumed) {
  ScratchDir dir;
  for (IoMode mode : {IoMode::kBuffered, IoMode::kDirect, IoMode::kUring}) {
    SCOPED_TRACE(std::string(IoModeName(mode)));
    PosixStoreOptions o;
    o.dir = dir.path() + "/" + std::string(IoModeName(mode));
    o.io = mode;
    o.direct_threads = mode == IoMode::kDirect;  // the preads, whose transfers are simulated
    o.simulate_short_io = true;
    o.write_buffer_bytes = 64 * 1024;
    auto store = OpenPosixStore(o);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    const auto data = Pattern(3, (1u << 20) + 3);
    ASSERT_TRUE(WriteObject(store->get(), "s", data, 10000).ok());
    auto r = (*store)->Open("s");
    ASSERT_TRUE(r.ok());
    AlignedBuffer buf(data.size() + 1);
    ASSERT_TRUE((*r)->ReadAt(0, std::span<uint8_t>(buf.data(), data.size())).ok());
    EXPECT_EQ(0, std::memcmp(buf.data(), data.data(), data.size()));
    ASSERT_TRUE((*r)->ReadAt(4097, std::span<uint8_t>(buf.data() + 1, 300000)).ok());
    EXPECT_EQ(0, std::memcmp(buf.data() + 1, data.data() + 4097, 300000));
    const ReadPathBytes p = (*r)->PathBytes();
    EXPECT_EQ(p.direct + p.page_cache, (*r)->BytesRead()) << "every byte is counted once";
    if (mode == IoMode::kBuffered) {
      EXPECT_EQ(p.direct, 0u);
    }
    // A short O_DIRECT transfer inside the file: the rest goes through the page cache, and the
    // counters say so (what `tqkv restore` warns about).
    if (mode == IoMode::kDirect && (*store)->Caps().io_mode == IoMode::kDirect) {
      EXPECT_GT(p.direct, 0u);
      EXPECT_GT(p.page_cache, 0u);
    }
  }
}

TEST(PosixStoreTest, ReportsTheIoModeInUse) {
  ScratchDir dir;
  auto buffered = MustOpen("file://" + dir.path());
  ASSERT_NE(buffered, nullptr);
  EXPECT_EQ(buffered->Caps().io_mode, IoMode::kBuffered);
  EXPECT_FALSE(buffered->Caps().io_fell_back);
  EXPECT_EQ(buffered->Caps().io_alignment, 4096u);
  EXPECT_TRUE(buffered->Caps().drop_cache);
  auto uring = MustOpen("file://" + dir.path() + "?io=uring&qd=4");
  ASSERT_NE(uring, nullptr);
  // uring falls back to direct (or buffered) only with io_fell_back set.
  EXPECT_EQ(uring->Caps().io_mode == IoMode::kUring, !uring->Caps().io_fell_back);
  EXPECT_NE(uring->Uri().find("io=uring"), std::string::npos) << uring->Uri();
}

TEST(PosixStoreTest, BytesReadCountsWhatMovedFromStorage) {
  ScratchDir dir;
  auto store = MustOpen("file://" + dir.path() + "?io=direct");
  ASSERT_NE(store, nullptr);
  if (store->Caps().io_mode != IoMode::kDirect) GTEST_SKIP() << "O_DIRECT unavailable here";
  ASSERT_TRUE(WriteObject(store.get(), "b", Pattern(1, 3 * 4096)).ok());
  auto r = store->Open("b");
  ASSERT_TRUE(r.ok());
  std::vector<uint8_t> one(1);
  ASSERT_TRUE((*r)->ReadAt(5000, one).ok());
  EXPECT_EQ((*r)->BytesRead(), 4096u) << "one byte costs its whole block under O_DIRECT";
  AlignedBuffer aligned(8192);
  ASSERT_TRUE((*r)->ReadAt(4096, aligned.span()).ok());
  EXPECT_EQ((*r)->BytesRead(), 4096u + 8192u);
}

// Reading an object's unaligned end (a container's footer) is a short read at end of file, not a
// reason to leave O_DIRECT: the reads after it still cost whole blocks (through the page cache a
// one-byte read would move one byte).
TEST(PosixStoreTest, TheFileEndKeepsODirectOn) {
  for (const char* io : {"direct", "direct&engine=threads", "uring"}) {
    SCOPED_TRACE(io);
    ScratchDir dir;
    auto store = MustOpen("file://" + dir.path() + "?io=" + io);
    ASSERT_NE(store, nullptr);
    if (store->Caps().io_mode == IoMode::kBuffered) GTEST_SKIP() << "O_DIRECT unavailable here";
    const auto data = Pattern(4, 3 * 4096 + 100);
    ASSERT_TRUE(WriteObject(store.get(), "t", data).ok());
    auto r = store->Open("t");
    ASSERT_TRUE(r.ok());
    std::vector<uint8_t> tail(50);
    ASSERT_TRUE((*r)->ReadAt(3 * 4096 + 50, tail).ok());
    EXPECT_TRUE(std::equal(tail.begin(), tail.end(), data.begin() + 3 * 4096 + 50));
    EXPECT_EQ((*r)->BytesRead(), 100u) << "the last block holds 100 bytes";
    std::vector<uint8_t> one(1);
    ASSERT_TRUE((*r)->ReadAt(5000, one).ok());
    EXPECT_EQ(one[0], data[5000]);
    EXPECT_EQ((*r)->BytesRead(), 100u + 4096u) << "still O_DIRECT after the file's end";
    // A batch that ends at the file's end: the same.
    AlignedBuffer big(3 * 4096 + 4096);
    const ReadRequest req{0, std::span<uint8_t>(big.data(), data.size())};
    ASSERT_TRUE((*r)->ReadBatch(std::span<const ReadRequest>(&req, 1)).ok());
    EXPECT_EQ(0, std::memcmp(big.data(), data.data(), data.size()));
    ASSERT_TRUE((*r)->ReadAt(9000, one).ok());
    EXPECT_EQ((*r)->BytesRead(), 100u + 4096u + data.size() + 4096u);
    const ReadPathBytes p = (*r)->PathBytes();
    EXPECT_EQ(p.page_cache, 0u);
    EXPECT_EQ(p.direct, (*r)->BytesRead());
    if (std::string_view(io) == "direct&engine=threads") {
      EXPECT_EQ(p.uring, 0u);
    }
  }
}

TEST(PosixStoreTest, CreateFalseNeedsAnExistingDirectory) {
  ScratchDir dir;
  auto missing = OpenStore("file://" + dir.path() + "/nope?create=0");
  EXPECT_TRUE(missing.status().IsNotFound()) << missing.status().ToString();
  auto made = OpenStore("file://" + dir.path() + "/deep/er/dir");
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  struct stat st {};
  EXPECT_EQ(::stat((dir.path() + "/deep/er/dir").c_str(), &st), 0);
  { std::ofstream(dir.path() + "/file") << "x"; }
  EXPECT_EQ(OpenStore(dir.path() + "/file").status().code(), StatusCode::kInvalidArgument);
}

TEST(PosixStoreTest, RelativePathsBecomeAbsolute) {
  ScratchDir dir;
  char cwd[4096];
  ASSERT_NE(::getcwd(cwd, sizeof(cwd)), nullptr);
  ASSERT_EQ(::chdir(dir.path().c_str()), 0);
  auto store = OpenStore("rel/dir");
  ASSERT_EQ(::chdir(cwd), 0);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_EQ((*store)->Uri().rfind("file://" + dir.path() + "/rel/dir?", 0), 0u) << (*store)->Uri();
}

TEST(PosixStoreTest, UriOptionsAreChecked) {
  ScratchDir dir;
  const std::string base = "file://" + dir.path();
  EXPECT_NE(MustOpen(base + "?io=direct&qd=4&chunk=64k&create=1"), nullptr);
  EXPECT_NE(MustOpen(base + "/?io=buffered"), nullptr);
  EXPECT_NE(MustOpen("file://localhost" + dir.path()), nullptr);
  EXPECT_NE(MustOpen(dir.path() + "?io=direct"), nullptr);
  EXPECT_NE(MustOpen(base + "?io=direct&engine=threads"), nullptr);
  EXPECT_NE(MustOpen(base + "?io=direct&engine=uring"), nullptr);
  EXPECT_NE(MustOpen(base + "?io=direct&engine=threads")->Uri().find("engine=threads"),
            std::string::npos);
  const std::string bad[] = {
      base + "?io=direct&engine=fast",
      base + "?io=fast",      base + "?bogus=1",     base + "?qd=0",      base + "?qd=1000",
      base + "?chunk=1000",   base + "?chunk=128m",  base + "?create=2",  base + "?io=direct&io=uring",
      base + "?io",           "file://otherhost/x",  "file://",           "nosuch://x",
      "",                     base + "?chunk=4kb",   base + "?qd=-1",     base + "?io=%zz",
  };
  for (const std::string& uri : bad) {
    auto s = OpenStore(uri);
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument) << uri << ": "
                                                               << s.status().ToString();
  }
  // qd is a count, not a byte size (issue 49, item 15).
  auto qd = OpenStore(base + "?qd=1k");
  EXPECT_NE(qd.status().message().find("expected a count"), std::string::npos)
      << qd.status().ToString();
  EXPECT_EQ(qd.status().message().find("byte size"), std::string::npos) << qd.status().ToString();
}

// A real ENOSPC: a 1 MiB tmpfs (needs CAP_SYS_ADMIN; skipped otherwise).
TEST(PosixStoreTest, RealNoSpaceFailsCleanlyAndTheKeyStaysUsable) {
  ScratchDir dir;
  const std::string mnt = dir.path() + "/small";
  ASSERT_EQ(::mkdir(mnt.c_str(), 0755), 0);
  if (::mount("tqkv-test", mnt.c_str(), "tmpfs", 0, "size=1m") != 0) {
    GTEST_SKIP() << "cannot mount a small tmpfs here: " << std::strerror(errno);
  }
  struct Unmount {
    std::string path;
    ~Unmount() { ::umount2(path.c_str(), MNT_DETACH); }
  } unmount{mnt};
  for (const char* io : {"buffered", "direct"}) {
    SCOPED_TRACE(io);
    auto store = MustOpen("file://" + mnt + "?io=" + io);
    ASSERT_NE(store, nullptr);
    auto w = store->Create("ckpt");
    ASSERT_TRUE(w.ok());
    const auto data = Pattern(1, 3u << 20);
    Status s;
    for (size_t off = 0; off < data.size() && s.ok(); off += 100000) {
      s = (*w)->Append(std::span<const uint8_t>(data).subspan(
          off, std::min<size_t>(100000, data.size() - off)));
    }
    if (s.ok()) s = (*w)->Commit();
    EXPECT_TRUE(s.IsNoSpace()) << s.ToString();
    EXPECT_NE(s.message().find("ckpt"), std::string::npos) << s.ToString();
    w->reset();
    EXPECT_TRUE(store->Open("ckpt").status().IsNotFound());
    size_t files = 0;
    for (const auto& e : std::filesystem::directory_iterator(mnt)) {
      (void)e;
      ++files;
    }
    EXPECT_EQ(files, 0u) << "the failed writer's temp file is gone";
    const auto small = Pattern(2, 100000);
    ASSERT_TRUE(WriteObject(store.get(), "ckpt", small).ok());
    auto back = ReadObject(store.get(), "ckpt");
    ASSERT_TRUE(back.ok());
    EXPECT_TRUE(*back == small);
    ASSERT_TRUE(store->Remove("ckpt").ok());
  }
}

TEST(PosixStoreTest, UriRoundTripsOddDirectoryNames) {
  ScratchDir dir;
  PosixStoreOptions o;
  o.dir = dir.path() + "/a b?c%d&e";
  auto store = OpenPosixStore(o);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  ASSERT_TRUE(WriteObject(store->get(), "k", Pattern(1, 10)).ok());
  auto again = OpenStore((*store)->Uri());
  ASSERT_TRUE(again.ok()) << (*store)->Uri() << ": " << again.status().ToString();
  auto back = ReadObject(again->get(), "k");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(*back == Pattern(1, 10));
}

class UringConfigTest : public ::testing::TestWithParam<const char*> {};

TEST_P(UringConfigTest, ReadBatchRunsOnTheRing) {
  ScratchDir dir;
  auto store = MustOpen("file://" + dir.path() + "?io=uring&" + GetParam());
  ASSERT_NE(store, nullptr);
  if (store->Caps().io_mode != IoMode::kUring) {
    GTEST_SKIP() << "io_uring unavailable here: store runs as io="
                 << IoModeName(store->Caps().io_mode);
  }
  const auto data = Pattern(7, (2u << 20) + 100);
  ASSERT_TRUE(WriteObject(store.get(), "u", data).ok());
  auto r = store->Open("u");
  ASSERT_TRUE(r.ok());
  AlignedBuffer buf(data.size() + 4096);
  // One big aligned request (32 pieces of 64 KiB, 4 in flight) and a batch of odd ones.
  ASSERT_TRUE((*r)->ReadAt(0, std::span<uint8_t>(buf.data(), data.size())).ok());
  EXPECT_EQ(0, std::memcmp(buf.data(), data.data(), data.size()));
  std::vector<ReadRequest> reqs;
  for (uint64_t i = 0; i < 20; ++i) {
    reqs.push_back({i * 100003, std::span<uint8_t>(buf.data() + 1 + i * 70001, 70000)});
  }
  ASSERT_TRUE((*r)->ReadBatch(reqs).ok());
  for (const auto& q : reqs) {
    ASSERT_EQ(0, std::memcmp(q.dst.data(), data.data() + q.offset, q.dst.size())) << q.offset;
  }
  EXPECT_EQ(store->Caps().io_mode, IoMode::kUring) << "no silent fallback while reading";
  EXPECT_GE((*r)->BytesRead(), data.size() + 20 * 70000);
}

INSTANTIATE_TEST_SUITE_P(Configs, UringConfigTest,
                         ::testing::Values("qd=1&chunk=4k", "qd=4&chunk=64k", "qd=64&chunk=1m",
                                           "qd=256&chunk=4k"));

TEST(StoreUriTest, Parse) {
  auto u = ParseStoreUri("FILE:///mnt/fb%20a/ckpt?io=direct&qd=8");
  ASSERT_TRUE(u.ok()) << u.status().ToString();
  EXPECT_EQ(u->scheme, "file");
  EXPECT_EQ(u->authority, "");
  EXPECT_EQ(u->path, "/mnt/fb a/ckpt");
  ASSERT_EQ(u->options.size(), 2u);
  EXPECT_EQ(u->options[0], (std::pair<std::string, std::string>("io", "direct")));
  EXPECT_EQ(u->options[1], (std::pair<std::string, std::string>("qd", "8")));

  u = ParseStoreUri("redis://host:6379/prefix?db=2");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->scheme, "redis");
  EXPECT_EQ(u->authority, "host:6379");
  EXPECT_EQ(u->path, "/prefix");

  u = ParseStoreUri("relative/dir");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->scheme, "file");
  EXPECT_EQ(u->path, "relative/dir");

  u = ParseStoreUri("memory://");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->scheme, "memory");
  EXPECT_TRUE(u->path.empty());

  EXPECT_FALSE(ParseStoreUri("file:///x?a=1&a=2").ok());
  EXPECT_FALSE(ParseStoreUri("file:///x%00y").ok());
  EXPECT_FALSE(ParseStoreUri("file:///x%4").ok());
  EXPECT_FALSE(ParseStoreUri(std::string("file:///x\0y", 11)).ok());
}

TEST(StoreUriTest, MemoryScheme) {
  auto m = OpenStore("memory://");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ((*m)->Name(), "memory");
  EXPECT_EQ(OpenStore("memory://host").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(OpenStore("memory://?x=1").status().code(), StatusCode::kInvalidArgument);
  // Each memory:// store is its own.
  auto m2 = OpenStore("memory://");
  ASSERT_TRUE(m2.ok());
  ASSERT_TRUE(WriteObject(m->get(), "k", Pattern(1, 1)).ok());
  EXPECT_TRUE((*m2)->Open("k").status().IsNotFound());
}

TEST(StoreUriTest, RegisterScheme) {
  std::string seen_path;
  ASSERT_TRUE(RegisterStoreScheme("tqkvtest", [&seen_path](const StoreUri& uri)
                                      -> Result<std::unique_ptr<Store>> {
                seen_path = uri.path;
                return std::unique_ptr<Store>(std::make_unique<MemoryStore>());
              }).ok());
  auto s = OpenStore("tqkvtest://h/some/path");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(seen_path, "/some/path");
  EXPECT_EQ(RegisterStoreScheme("tqkvtest", [](const StoreUri&) -> Result<std::unique_ptr<Store>> {
              return Status::Internal("unused");
            }).code(),
            StatusCode::kAlreadyExists);
  EXPECT_EQ(RegisterStoreScheme("file", [](const StoreUri&) -> Result<std::unique_ptr<Store>> {
              return Status::Internal("unused");
            }).code(),
            StatusCode::kAlreadyExists);
  EXPECT_EQ(RegisterStoreScheme("bad scheme", nullptr).code(), StatusCode::kInvalidArgument);
}

TEST(KeyTest, ValidateKey) {
  for (const char* good : {"a", "a/b/c", "A-Z_0.9", ".x", "a/..b", "a.tqkv", "x/y.tqkv",
                           "..."}) {
    EXPECT_TRUE(ValidateKey(good).ok()) << good;
  }
  const std::string bad[] = {"",     "/a",   "a/",   "a//b",   "./a",  "a/.",
                             "..",   "a/..", "a b",  "a\\b",   "a:b",  "é",
                             "x.tqkv/y", std::string("a\0", 2), std::string(201, 'a')};
  for (const std::string& key : bad) {
    Status s = ValidateKey(key);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << key;
  }
  EXPECT_TRUE(ValidateKey(std::string(200, 'a')).ok());
}

TEST(KeyTest, IoModeNames) {
  for (IoMode m : {IoMode::kBuffered, IoMode::kDirect, IoMode::kUring}) {
    auto parsed = ParseIoMode(IoModeName(m));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, m);
  }
  EXPECT_FALSE(ParseIoMode("Direct").ok());
}

// A FIFO under an object's name used to block Open in open(2) forever (issue 13, defect 6).
TEST(PosixStoreTest, OpenRefusesAFifoWithoutBlocking) {
  ScratchDir dir;
  for (const char* io : {"buffered", "direct"}) {
    SCOPED_TRACE(io);
    auto store = MustOpen("file://" + dir.path() + "?io=" + io);
    ASSERT_NE(store, nullptr);
    const std::string fifo = dir.path() + "/f.tqkv";
    (void)::unlink(fifo.c_str());
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
    auto opened = std::async(std::launch::async, [&] { return store->Open("f").status(); });
    if (opened.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
      // Unblock the open so the test ends, then fail.
      const int w = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
      ADD_FAILURE() << "Open of a FIFO blocked";
      opened.wait();
      if (w >= 0) ::close(w);
      continue;
    }
    const Status st = opened.get();
    EXPECT_TRUE(st.IsNotFound()) << st.ToString();
    EXPECT_NE(st.ToString().find("not a regular file"), std::string::npos) << st.ToString();
    // Not an object either: List skips it.
    auto l = store->List();
    ASSERT_TRUE(l.ok());
    EXPECT_TRUE(l->empty());
  }
}

// A regular object opens as before (O_NONBLOCK is cleared after the check).
TEST(PosixStoreTest, OpenClearsNonBlockForRegularFiles) {
  ScratchDir dir;
  auto store = MustOpen(dir.path());
  ASSERT_NE(store, nullptr);
  const auto data = Pattern(9, 70000);
  ASSERT_TRUE(WriteObject(store.get(), "r", data).ok());
  auto back = ReadObject(store.get(), "r");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(*back == data);
}

TEST(PosixStoreTest, LocalPathNamesTheObjectFileWithoutReparsingTheUri) {
  ScratchDir dir;
  // A directory name that the URI must percent-encode.
  const std::string root = dir.path() + "/a b";
  ASSERT_EQ(::mkdir(root.c_str(), 0755), 0);
  auto store = MustOpen(root);
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->LocalRoot(), root);
  EXPECT_EQ(store->LocalPath("s/k"), root + "/s/k.tqkv");
  EXPECT_EQ(store->LocalPath(".tqkv-probe.1"), std::nullopt) << "a reserved key has no file";
  ASSERT_TRUE(WriteObject(store.get(), "s/k", Pattern(1, 10)).ok());
  EXPECT_TRUE(FileBytes(*store->LocalPath("s/k")) == Pattern(1, 10));
  // Decorators have none: reading the file directly would bypass them.
  FaultInjectionStore fault(std::move(store));
  EXPECT_EQ(fault.LocalPath("s/k"), std::nullopt);
}

TEST(PosixStoreTest, OpenExistingStoreNeverCreatesTheDirectory) {
  ScratchDir dir;
  const std::string missing = dir.path() + "/no/such";
  for (const std::string& uri : {missing, "file://" + missing, "file://" + missing + "?create=1",
                                 "file://" + missing + "?io=direct&create=1&chunk=64k"}) {
    SCOPED_TRACE(uri);
    auto s = OpenExistingStore(uri);
    ASSERT_FALSE(s.ok());
    EXPECT_TRUE(s.status().IsNotFound()) << s.status().ToString();
    EXPECT_NE(::access((dir.path() + "/no").c_str(), F_OK), 0) << "it created a directory";
  }
  EXPECT_EQ(OpenExistingStore("file://" + missing + "?bogus=1").status().code(),
            StatusCode::kInvalidArgument);
  ASSERT_TRUE(OpenStore(missing).ok()) << "OpenStore still creates it";
  auto s = OpenExistingStore("file://" + missing + "?io=direct");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ((*s)->Caps().io_alignment, 4096u);
  EXPECT_TRUE(OpenExistingStore("memory://").ok());
}

// OpenStoreOptions::io is the URI's io= as a value: the same store (Uri, Caps), and it wins over
// an io= the URI already has; a scheme without io refuses it as it refuses ?io=.
TEST(PosixStoreTest, TheIoOptionEqualsTheUriOption) {
  ScratchDir dir;
  const std::string base = "file://" + dir.path();
  for (IoMode mode : {IoMode::kBuffered, IoMode::kDirect, IoMode::kUring}) {
    SCOPED_TRACE(std::string(IoModeName(mode)));
    const std::string text = base + "?io=" + std::string(IoModeName(mode));
    auto by_uri = OpenStore(text);
    auto by_value = OpenStore(base, {.io = mode});
    auto over = OpenStore(base + "?io=buffered&qd=4", {.io = mode});
    auto existing = OpenExistingStore(base + "?io=direct", {.io = mode});
    ASSERT_TRUE(by_uri.ok() && by_value.ok() && over.ok() && existing.ok());
    EXPECT_EQ((*by_value)->Uri(), (*by_uri)->Uri());
    EXPECT_EQ((*existing)->Uri(), (*by_uri)->Uri());
    auto over_by_uri = OpenStore(text + "&qd=4");
    ASSERT_TRUE(over_by_uri.ok());
    EXPECT_EQ((*over)->Uri(), (*over_by_uri)->Uri());
    EXPECT_EQ((*by_value)->Caps().io_mode, (*by_uri)->Caps().io_mode);
    EXPECT_EQ((*by_value)->Caps().io_fell_back, (*by_uri)->Caps().io_fell_back);
  }
  EXPECT_EQ(OpenStore("memory://", {.io = IoMode::kDirect}).status().code(),
            OpenStore("memory://?io=direct").status().code());
  EXPECT_EQ(OpenStore("memory://?io=direct").status().code(), StatusCode::kInvalidArgument);
  const std::string missing = dir.path() + "/no/such";
  EXPECT_TRUE(OpenExistingStore(missing, {.io = IoMode::kDirect}).status().IsNotFound());
  EXPECT_NE(::access((dir.path() + "/no").c_str(), F_OK), 0) << "it created a directory";
}

}  // namespace
}  // namespace tqkv
