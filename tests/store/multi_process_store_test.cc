// Many processes against one store (posix, nfs, redis, redis cluster, s3): 8 forked processes
// checkpoint and restore the same and different keys concurrently and never see a torn or mixed
// object; a writer killed with SIGKILL at random points leaves nothing readable but whole objects,
// and the next checkpoint works. Children open their own store (own connections) and report by
// exit code.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "store/shared_store_servers.h"
#include "store/store_test_util.h"
#include "tqkv/store.h"

namespace tqkv {
namespace {

using testing_util::Pattern;
using testing_util::ScratchDir;

// Content: [writer u32][round u32][size u64] Pattern(...) [fnv64 of everything before].
uint64_t Fnv(const uint8_t* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

std::vector<uint8_t> Content(uint32_t writer, uint32_t round, size_t size) {
  auto v = Pattern(writer * 7919 + round, size);
  const uint64_t sz = size;
  std::memcpy(v.data(), &writer, 4);
  std::memcpy(v.data() + 4, &round, 4);
  std::memcpy(v.data() + 8, &sz, 8);
  const uint64_t h = Fnv(v.data(), size - 8);
  std::memcpy(v.data() + size - 8, &h, 8);
  return v;
}

// Empty when `got` is exactly one writer's whole object; else what is wrong.
std::string CheckContent(const std::vector<uint8_t>& got) {
  if (got.size() < 24) return "object of " + std::to_string(got.size()) + " bytes is too short";
  uint32_t writer, round;
  uint64_t size, h;
  std::memcpy(&writer, got.data(), 4);
  std::memcpy(&round, got.data() + 4, 4);
  std::memcpy(&size, got.data() + 8, 8);
  std::memcpy(&h, got.data() + got.size() - 8, 8);
  if (size != got.size()) return "size field " + std::to_string(size) + " != " + std::to_string(got.size());
  if (h != Fnv(got.data(), got.size() - 8)) return "checksum mismatch (torn or mixed object)";
  if (got != Content(writer, round, got.size())) return "content is not writer's";
  return "";
}

// ReadObject; on s3, whose objects are replaced in place, a read that lost the race with a
// newer version (NotFound after a successful Open) opens again (docs/store.md).
Result<std::vector<uint8_t>> ReadWhole(Store* store, const std::string& key) {
  for (int tries = 0;; ++tries) {
    const bool existed = store->Name() == "s3" && store->Open(key).ok();
    auto r = testing_util::ReadObject(store, key);
    if (r.ok() || !existed || !r.status().IsNotFound() || tries >= 50) return r;
  }
}

size_t SizeFor(uint32_t writer, uint32_t round) { return 150000 + writer * 10007 + round * 4099; }

using Param = testing_util::ServerStoreParam;

class MultiProcessStoreTest : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    ASSERT_TRUE(dir_.ok());
    const std::string why = GetParam().why(), base = GetParam().uri();
    if (base.empty() && !why.empty()) GTEST_SKIP() << why;
    ASSERT_FALSE(base.empty()) << "test server did not start: "
                               << testing_util::TestServers().start_error;
    uri_ = base == "posix" ? "file://" + dir_.path() : base;
    auto s = OpenStore(uri_);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(s).value();
  }
  void TearDown() override {
    if (store_ != nullptr) testing_util::ClearStore(store_.get());
  }

  // Runs fn in a forked child with its own store; returns the child pid.
  pid_t Spawn(const std::function<int(Store*)>& fn) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      auto s = OpenStore(uri_);
      int rc = 100;
      if (s.ok()) {
        rc = fn(s->get());
      } else {
        std::fprintf(stderr, "child: %s\n", s.status().ToString().c_str());
      }
      std::fflush(stderr);
      ::_exit(rc);
    }
    return pid;
  }
  static int Wait(pid_t pid) {
    int st = 0;
    if (::waitpid(pid, &st, 0) != pid) return -1;
    if (WIFSIGNALED(st)) return 200 + WTERMSIG(st);
    return WEXITSTATUS(st);
  }

  ScratchDir dir_;
  std::string uri_;
  std::unique_ptr<Store> store_;
};

TEST_P(MultiProcessStoreTest, EightProcessesNeverSeeTornObjects) {
  constexpr uint32_t kProcs = 8;
  constexpr uint32_t kRounds = 8;
  ASSERT_TRUE(testing_util::WriteObject(store_.get(), "shared", Content(99, 0, SizeFor(99, 0))).ok());
  std::vector<pid_t> pids;
  for (uint32_t p = 0; p < kProcs; ++p) {
    pids.push_back(Spawn([p](Store* store) -> int {
      int bad = 0;
      auto check_read = [&](const std::string& key, bool must_exist) {
        auto r = ReadWhole(store, key);
        if (!r.ok()) {
          if (r.status().IsNotFound() && !must_exist) return;
          std::fprintf(stderr, "proc %u read %s: %s\n", p, key.c_str(), r.status().ToString().c_str());
          ++bad;
          return;
        }
        const std::string why = CheckContent(*r);
        if (!why.empty()) {
          std::fprintf(stderr, "proc %u read %s: %s\n", p, key.c_str(), why.c_str());
          ++bad;
        }
      };
      for (uint32_t round = 1; round <= kRounds; ++round) {
        // Same session from all processes; odd append sizes interleave writers mid-object.
        Status s = testing_util::WriteObject(store, "shared", Content(p, round, SizeFor(p, round)),
                                             7777 + p * 13);
        if (!s.ok()) {
          std::fprintf(stderr, "proc %u write shared: %s\n", p, s.ToString().c_str());
          ++bad;
        }
        check_read("shared", true);
        // Own session, and the neighbour's (written concurrently by another process).
        const std::string own = "sess/" + std::to_string(p);
        s = testing_util::WriteObject(store, own, Content(p, round, SizeFor(p, round) / 2), 65536);
        if (!s.ok()) ++bad;
        check_read(own, true);
        check_read("sess/" + std::to_string((p + 1) % kProcs), false);
      }
      return bad > 99 ? 99 : bad;
    }));
  }
  // The parent reads the shared session all along as well.
  int parent_bad = 0, parent_reads = 0;
  auto all_done = [&] {
    for (pid_t pid : pids) {
      siginfo_t info{};
      if (::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
          info.si_pid == 0) {
        return false;
      }
    }
    return true;
  };
  for (int i = 0; i < 100000 && !all_done(); ++i) {
    auto r = ReadWhole(store_.get(), "shared");
    ++parent_reads;
    if (!r.ok() || !CheckContent(*r).empty()) {
      ++parent_bad;
      ADD_FAILURE() << "parent read: " << (r.ok() ? CheckContent(*r) : r.status().ToString());
    }
  }
  for (size_t i = 0; i < pids.size(); ++i) {
    EXPECT_EQ(Wait(pids[i]), 0) << "process " << i << " saw failures (its stderr says which)";
  }
  EXPECT_EQ(parent_bad, 0);
  EXPECT_GT(parent_reads, 0);
  // The last complete writer won: a whole object from some process's last round.
  auto last = testing_util::ReadObject(store_.get(), "shared");
  ASSERT_TRUE(last.ok()) << last.status().ToString();
  EXPECT_EQ(CheckContent(*last), "");
  uint32_t writer, round;
  std::memcpy(&writer, last->data(), 4);
  std::memcpy(&round, last->data() + 4, 4);
  EXPECT_LT(writer, kProcs);
  EXPECT_EQ(round, kRounds);
  auto l = store_->List();
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->size(), kProcs + 1) << "shared + one session per process, no leftovers listed";
}

TEST_P(MultiProcessStoreTest, WriterKilledAtRandomPointsLeavesNoPartialObject) {
  std::mt19937 rng(static_cast<unsigned>(::getpid()));
  int committed_seen = 0, late_landings = 0;
  for (int attempt = 0; attempt < 6; ++attempt) {
    SCOPED_TRACE("attempt " + std::to_string(attempt));
    const pid_t pid = Spawn([attempt](Store* store) -> int {
      // Write bigger versions forever, in small appends, until killed.
      for (uint32_t round = 1; round < 100000; ++round) {
        const size_t size = 400000 + (round % 7) * 100003;
        (void)testing_util::WriteObject(store, "victim", Content(attempt, round, size), 4096 + 17);
      }
      return 0;
    });
    ASSERT_GT(pid, 0);
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 150000));
    ASSERT_EQ(::kill(pid, SIGKILL), 0);
    EXPECT_EQ(Wait(pid), 200 + SIGKILL);
    // Nothing partial is readable: either no object yet, or one writer's whole object.
    auto r = testing_util::ReadObject(store_.get(), "victim");
    if (r.ok()) {
      ++committed_seen;
      EXPECT_EQ(CheckContent(*r), "");
    } else {
      EXPECT_TRUE(r.status().IsNotFound()) << r.status().ToString();
    }
    auto l = store_->List();
    ASSERT_TRUE(l.ok());
    EXPECT_LE(l->size(), 1u) << "temps are never listed";
    // The next checkpoint of the same key works and wins. A remote server may still carry out a
    // request the killed writer had sent whole (s3: a PUT whose body had arrived), after its
    // death: that lands once, as the killed writer's whole object; the checkpoint after it wins.
    const auto next = Content(1000 + attempt, 1, 123457);
    for (int tries = 0;; ++tries) {
      ASSERT_TRUE(testing_util::WriteObject(store_.get(), "victim", next, 50000).ok());
      auto back = ReadWhole(store_.get(), "victim");
      ASSERT_TRUE(back.ok()) << back.status().ToString();
      if (*back == next) break;
      ASSERT_EQ(CheckContent(*back), "");
      uint32_t writer;
      std::memcpy(&writer, back->data(), 4);
      ASSERT_EQ(writer, static_cast<uint32_t>(attempt)) << "only the killed writer's request may land late";
      ASSERT_EQ(tries, 0) << "the killed writer's late request landed twice";
      ++late_landings;
    }
  }
  // The killed writers' litter is removable (and never was visible).
  auto removed = store_->RemoveStaleTemps(std::chrono::seconds(0));
  ASSERT_TRUE(removed.ok()) << removed.status().ToString();
  auto l = store_->List();
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->size(), 1u);
  std::printf("kill-9: %d of 6 kills found an earlier committed version, %d late requests of a "
              "killed writer landed; %llu temps (redis: also replaced chunks in their grace "
              "period) removed\n",
              committed_seen, late_landings, static_cast<unsigned long long>(*removed));
}

const std::vector<Param> kParams = testing_util::ServerStoreParams("mp", true, "?chunk=64k");

INSTANTIATE_TEST_SUITE_P(Stores, MultiProcessStoreTest, ::testing::ValuesIn(kParams),
                         [](const ::testing::TestParamInfo<Param>& info) { return info.param.name; });

}  // namespace
}  // namespace tqkv
