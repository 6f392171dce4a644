// Hostile and out-of-range input on the command line (issue 13, defects 1, 2, 5 and 7): every
// command exits 1 or with CLI11's usage status, never on a signal, within 5 s and bounded memory,
// says what was wrong, and leaves nothing in the store.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <chrono>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "format/container_test_util.h"
#include "store/store_test_util.h"
#include "tools/cli_util.h"
#include "tqkv/store.h"

namespace {

using tqkv::testing_util::CmdResult;
using tqkv::testing_util::ScratchDir;
using tqkv::testing_util::Tqkv;

// Largest resident set of any command run so far (the children's high-water mark), in MiB.
long MaxChildRssMiB() {
  rusage u{};
  getrusage(RUSAGE_CHILDREN, &u);
  return u.ru_maxrss / 1024;
}

constexpr long kRssBoundMiB = 256;

// Runs `args` and checks the refusal: a normal non-zero exit, fast, with `needle` in its output.
CmdResult ExpectRefused(const std::string& args, const std::string& needle) {
  const auto t0 = std::chrono::steady_clock::now();
  CmdResult r = Tqkv(args);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(r.status, -1) << "killed by a signal: " << args << "\n" << r.out;
  EXPECT_NE(r.status, 0) << args << "\n" << r.out;
  EXPECT_LT(s, 5.0) << args;
  EXPECT_NE(r.out.find(needle), std::string::npos) << args << "\n" << r.out;
  EXPECT_EQ(r.out.find("terminate"), std::string::npos) << r.out;
  EXPECT_LE(MaxChildRssMiB(), kRssBoundMiB) << args;
  return r;
}

std::string Checkpoint(const ScratchDir& dir, const std::string& extra) {
  return "checkpoint --model smollm2-135m --store " + dir.path() + " --session t " + extra;
}

// Defect 1: token counts whose session size wraps 64 bits used to overflow a heap buffer.
TEST(HostileCli, HugeTokenCountsAreRefusedAndLeaveNothing) {
  ScratchDir dir;
  ASSERT_TRUE(dir.ok());
  for (const auto& [args, why] : std::vector<std::pair<std::string, std::string>>{
           {"--tokens 48038396025285291", "do not fit in memory"},
           {"--tokens 18446744073709551615", "do not fit in memory"},
           {"--tokens -1", "not a count"},
           {"--tokens 1e9", "not a count"}}) {
    ExpectRefused(Checkpoint(dir, args), why);
  }
  EXPECT_TRUE(dir.Files().empty()) << dir.Files().front();
}

// Defect 7: resource arguments too large for the machine fail cleanly, before the store is touched.
TEST(HostileCli, LargeResourceArgumentsFailCleanly) {
  ScratchDir dir;
  ASSERT_TRUE(dir.ok());
  for (const auto& [args, why] : std::vector<std::pair<std::string, std::string>>{
           {"--tokens 100 --threads -1", "not a count"},
           {"--tokens 100 --threads 100000", "out of range [0, 1024]"},
           // 10^12 tokens x 384 bytes: more memory than any machine gives.
           {"--tokens 1000000000000", "Resource exhausted"},
           {"--tokens 100 --kv-heads 1000000000", "out of range [1, 65536]"},
           {"--tokens 100 --layers 1000000000", "out of range [1, 65536]"},
           {"--tokens 100 --head-dim 70000", "out of range [1, 65535]"},
           // Within the CLI's ranges, still more than memory: the library says so.
           {"--tokens 100000000 --kv-heads 65536", "Resource exhausted"}}) {
    ExpectRefused(Checkpoint(dir, args), why);
  }
  EXPECT_TRUE(dir.Files().empty()) << dir.Files().front();
  ExpectRefused("restore --store " + dir.path() + " --session t --threads 100000",
                "out of range [0, 1024]");
  ExpectRefused("decompress --threads -1 " + dir.path() + "/t.tqkv " + dir.path() + "/t.st",
                "not a count");
}

// Defect 5: durations and sizes that are not finite numbers in range are refused, never read as 0.
TEST(HostileCli, GcRefusesBogusDurationsAndSizes) {
  ScratchDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string gc = "gc --store " + dir.path() + " ";
  for (const char* age : {"inf", "nan", "1e300h", "-1s", "1 h", "5y"}) {
    ExpectRefused(gc + "--temp-age '" + age + "'", "--temp-age");
  }
  for (const char* ttl : {"nan", "inf", "0", "1e3"}) ExpectRefused(gc + "--ttl " + ttl, "--ttl");
  for (const char* cap : {"nan", "1e30", "-5GB", "100000000PB", "12XB"}) {
    ExpectRefused(gc + "--max-bytes " + cap, "--max-bytes");
  }
  // 0 used to mean "no cap" without a word; now it is refused and the message says how.
  ExpectRefused(gc + "--max-bytes 0", "omit it for no cap");
  ExpectRefused("pin --store " + dir.path() + " --session s --ttl nan", "--ttl");
  ExpectRefused("capacity --capacity 1e30", "--capacity");
  ExpectRefused("capacity --capacity 10TB --per-gpu nan", "--per-gpu");
  // The one unit rule: what is accepted, in both families.
  for (const char* cap : {"50GB", "64M", "512MiB", "1.5GiB", "1048576"}) {
    CmdResult r = Tqkv(gc + "--dry-run --max-bytes " + cap + " --ttl 24h --temp-age 90s");
    EXPECT_EQ(r.status, 0) << cap << "\n" << r.out;
  }
}

// Defect 5: a bogus --temp-age is refused before gc runs, so a live writer's temp survives and
// its commit succeeds (it used to be swept as if its age limit were 0).
TEST(HostileCli, LiveWritersTempSurvivesGcWithBogusTempAge) {
  ScratchDir dir;
  ASSERT_TRUE(dir.ok());
  auto store = tqkv::OpenStore(dir.path());
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  auto writer = (*store)->Create("live");
  ASSERT_TRUE(writer.ok()) << writer.status().ToString();
  const std::vector<uint8_t> bytes(8192, 7);
  ASSERT_TRUE((*writer)->Append(bytes).ok());
  ASSERT_FALSE(dir.Files().empty());  // the writer's temp
  for (const char* age : {"inf", "nan", "1e300h"}) {
    ExpectRefused("gc --store " + dir.path() + " --temp-age " + age, "not a duration");
  }
  CmdResult ok = Tqkv("gc --store " + dir.path() + " --temp-age 1h");
  EXPECT_EQ(ok.status, 0) << ok.out;
  tqkv::Status committed = (*writer)->Commit();
  EXPECT_TRUE(committed.ok()) << committed.ToString();
  auto obj = (*store)->Open("live");
  ASSERT_TRUE(obj.ok()) << obj.status().ToString();
  EXPECT_EQ((*obj)->Size(), bytes.size());
}

// Defect 2: a Hadamard container whose rotation was rewritten to Haar with head_dim 8192 or 32768
// (header checksum recomputed) used to pass verify and then hang or abort in decompress.
TEST(HostileCli, LargeHaarContainerIsRefusedFast) {
  using namespace tqkv::testing_format;
  ScratchDir dir;
  ASSERT_TRUE(dir.ok());
  for (uint32_t d : {8192u, 32768u}) {
    tqkv::ContainerHeader h = MakeHeader({1, 1, d}, 1, 16, {TqParams(d, 1)}, {0});
    WrittenContainer w = WriteContainer(h);
    ASSERT_TRUE(w.status.ok()) << w.status.ToString();
    tqkv::ContainerHeader haar = h;
    haar.codecs[0].subsets[0].rotation = tqkv::RotationKind::kHaar;
    const std::vector<uint8_t> body = tqkv::format::EncodeHeaderBody(haar);
    ASSERT_EQ(body.size(), tqkv::format::EncodeHeaderBody(h).size());
    std::copy(body.begin(), body.end(), w.file.begin() + tqkv::format::kPreambleBytes);
    Resign(w.file);
    const std::string path = dir.path() + "/haar" + std::to_string(d) + ".tqkv";
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(w.file.data()), static_cast<std::streamsize>(w.file.size()));
    const std::string why = "haar rotation on " + std::to_string(d) + " channels (at most 256)";
    ExpectRefused("verify " + path, why);
    ExpectRefused("decompress " + path + " " + dir.path() + "/out.safetensors", why);
    ExpectRefused("restore --store " + dir.path() + " --session haar" + std::to_string(d), why);
  }
}

// A checksum-valid container whose model name is not UTF-8 used to abort inspect --json and
// decompress (the JSON library throws on invalid UTF-8): the bytes are shown as U+FFFD instead.
TEST(HostileCli, NonUtf8ModelNameIsShownNotFatal) {
  using namespace tqkv::testing_format;
  ScratchDir dir;
  ASSERT_TRUE(dir.ok());
  tqkv::ContainerHeader h = MakeHeader({1, 1, 64}, 20, 16, {TqParams(64, 3)}, {0});
  h.model = "\xff\xfe-model";
  WrittenContainer w = WriteContainer(h);
  ASSERT_TRUE(w.status.ok()) << w.status.ToString();
  const std::string path = dir.path() + "/bytes.tqkv";
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(w.file.data()), static_cast<std::streamsize>(w.file.size()));
  for (const std::string& args : {"inspect --json " + path, "inspect " + path,
                                  "decompress " + path + " " + dir.path() + "/out.safetensors"}) {
    CmdResult r = Tqkv(args);
    EXPECT_EQ(r.status, 0) << args << "\n" << r.out;
  }
  CmdResult j = Tqkv("inspect --json " + path);
  EXPECT_NE(j.out.find("\xEF\xBF\xBD\xEF\xBF\xBD-model"), std::string::npos) << j.out;
  std::ifstream st(dir.path() + "/out.safetensors", std::ios::binary);
  const std::string st_bytes((std::istreambuf_iterator<char>(st)), std::istreambuf_iterator<char>());
  EXPECT_NE(st_bytes.find("\xEF\xBF\xBD\xEF\xBF\xBD-model"), std::string::npos);
}

}  // namespace
