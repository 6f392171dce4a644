// Never lose, clobber or misstate a session (issue 34): the command line's own files (outputs
// never onto a session or the command's input, written through temp + rename with errno in the
// error; inputs regular files only), the guard on lossless sessions, verify = restore, and
// norm=f16's range.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "store/store_test_util.h"
#include "tools/cli_util.h"
#include "tqkv/llama_state.h"
#include "tqkv/types.h"
#include "test_paths.h"

namespace {

// gcc defines __SANITIZE_ADDRESS__; clang 14 answers only __has_feature.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kUnderAsan = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kUnderAsan = true;
#else
constexpr bool kUnderAsan = false;
#endif
#else
constexpr bool kUnderAsan = false;
#endif

using tqkv::testing_util::CmdResult;
using tqkv::testing_util::ScratchDir;
using tqkv::testing_util::Tqkv;

// Runs a shell command line (stdout and stderr together).
CmdResult Shell(const std::string& line) {
  CmdResult r;
  FILE* p = popen(("bash -c '" + line + "' 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

std::vector<uint8_t> ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void WriteAll(const std::string& path, const std::vector<uint8_t>& b) {
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), b.size());
}

std::string Checkpoint(const std::string& dir, const std::string& session,
                       const std::string& extra = "") {
  return "checkpoint --model smollm2-135m --tokens 40 --store " + dir + " --session " + session +
         " " + extra;
}

// A llama.cpp sequence state (llama_kv_cache::state_write): one stream of `cells` cells, 2
// layers of 16 f16 K and V values per cell (one head of 16).
std::vector<uint8_t> SmallState(uint32_t cells) {
  std::vector<uint8_t> b;
  auto u32 = [&](uint32_t v) { b.insert(b.end(), reinterpret_cast<uint8_t*>(&v), reinterpret_cast<uint8_t*>(&v) + 4); };
  auto u64 = [&](uint64_t v) { b.insert(b.end(), reinterpret_cast<uint8_t*>(&v), reinterpret_cast<uint8_t*>(&v) + 8); };
  u32(1);
  u32(cells);
  for (uint32_t c = 0; c < cells; ++c) {
    u32(c);
    u32(1);
    u32(0);
  }
  u32(0);  // v_trans
  u32(2);  // layers
  for (int kv = 0; kv < 2; ++kv) {
    for (uint32_t l = 0; l < 2; ++l) {
      u32(static_cast<uint32_t>(tqkv::llama::kGgmlF16));
      u64(32);
      for (uint32_t i = 0; i < cells * 16; ++i) {
        const uint16_t h = tqkv::FloatToHalf(static_cast<float>((i * 37 + l * 11 + kv) % 97) / 16 - 3);
        b.push_back(static_cast<uint8_t>(h));
        b.push_back(static_cast<uint8_t>(h >> 8));
      }
    }
  }
  return b;
}

// Defect 3: no output option writes over a published session, with its exit status saying so.
TEST(SessionSafety, OutputsNeverOverwriteASession) {
  ScratchDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string d = dir.path();
  ASSERT_EQ(Tqkv(Checkpoint(d, "a")).status, 0);
  ASSERT_EQ(Tqkv(Checkpoint(d, "b")).status, 0);
  WriteAll(d + "/l.state", SmallState(5));
  ASSERT_EQ(Tqkv("llama import " + d + "/l.state " + d + "/l.tqkv --head-dim 16 --codec fp16").status, 0);
  const auto a = ReadAll(d + "/a.tqkv"), b = ReadAll(d + "/b.tqkv"), l = ReadAll(d + "/l.tqkv");
  for (const std::string& args : {
           "decompress " + d + "/a.tqkv " + d + "/a.tqkv",
           "decompress " + d + "/a.tqkv " + d + "/b.tqkv",
           "restore --store " + d + " --session b --out " + d + "/b.tqkv",
           "restore --store " + d + " --session b --out " + d + "/a.tqkv",
           "llama export " + d + "/l.tqkv --out " + d + "/l.tqkv",
           "llama export --store " + d + " --session l --out " + d + "/a.tqkv",
           Checkpoint(d, "c", "--json " + d + "/a.tqkv"),
       }) {
    CmdResult r = Tqkv(args);
    EXPECT_EQ(r.status, 1) << args << "\n" << r.out;
    EXPECT_NE(r.out.find("refusing to write"), std::string::npos) << args << "\n" << r.out;
  }
  EXPECT_EQ(ReadAll(d + "/a.tqkv"), a);
  EXPECT_EQ(ReadAll(d + "/b.tqkv"), b);
  EXPECT_EQ(ReadAll(d + "/l.tqkv"), l);
  EXPECT_EQ(Tqkv("verify " + d + "/a.tqkv").status, 0);
  // A copy of a session under another name is a session too; a checkpoint's --json naming its
  // own object is refused before anything is checkpointed.
  std::filesystem::copy_file(d + "/a.tqkv", d + "/copy.safetensors");
  EXPECT_EQ(Tqkv("decompress " + d + "/b.tqkv " + d + "/copy.safetensors").status, 1);
  EXPECT_EQ(ReadAll(d + "/copy.safetensors"), a);
  EXPECT_EQ(Tqkv(Checkpoint(d, "c", "--json " + d + "/c.tqkv")).status, 1);
  EXPECT_FALSE(std::filesystem::exists(d + "/c.tqkv"));
  // Other names are written as before.
  EXPECT_EQ(Tqkv("decompress " + d + "/a.tqkv " + d + "/a.safetensors").status, 0);
  EXPECT_EQ(Tqkv("llama export " + d + "/l.tqkv --out " + d + "/l.out").status, 0);
  EXPECT_EQ(ReadAll(d + "/l.out"), ReadAll(d + "/l.state"));
}

// Defect 4: llama export writes a new file beside the old one and renames it; a failing write
// (here the file size limit: EFBIG) leaves the previous file whole and names errno.
TEST(SessionSafety, ExportFailureLeavesThePreviousFileAndNamesTheCause) {
  ScratchDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string d = dir.path();
  WriteAll(d + "/big.state", SmallState(2000));  // 256 KB of K and V
  ASSERT_EQ(Tqkv("llama import " + d + "/big.state " + d + "/big.tqkv --head-dim 16 --codec fp16").status, 0);
  const std::vector<uint8_t> previous(1000, 0x5A);
  WriteAll(d + "/slot.bin", previous);
  // 64 KiB: the old file fits, the new one does not.
  const CmdResult r = Shell("trap \"\" XFSZ; ulimit -f 64; exec " + tqkv::test::BinaryDir() +
                            "/tqkv llama export " + d + "/big.tqkv --out " + d + "/slot.bin");
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("File too large"), std::string::npos) << r.out;
  EXPECT_EQ(ReadAll(d + "/slot.bin"), previous);
  for (const auto& e : std::filesystem::directory_iterator(d)) {
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
  }
}

// Defect 6: --json FILE reports a write it could not make.
TEST(SessionSafety, JsonFileWriteErrorsFailTheCommand) {
  ScratchDir dir;
  ASSERT_TRUE(dir.ok());
  CmdResult r = Tqkv(Checkpoint(dir.path(), "s", "--json " + dir.path() + "/no/such/dir/s.json"));
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("No such file or directory"), std::string::npos) << r.out;
  r = Tqkv(Checkpoint(dir.path(), "s", "--json " + dir.path() + "/s.json"));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(ReadAll(dir.path() + "/s.json").size(), 0u);
}

// Defect 2: llama import / inspect read regular files only (/dev/zero grew memory until killed).
TEST(SessionSafety, LlamaInputsMustBeRegularFiles) {
  ScratchDir dir;
  ASSERT_TRUE(dir.ok());
  for (const std::string& args :
       {"llama import /dev/zero " + dir.path() + "/z.tqkv --head-dim 16",
        std::string("llama inspect /dev/zero"), "llama import " + dir.path() + " " + dir.path() +
                                                     "/z.tqkv --head-dim 16"}) {
    // Bounded here so that a build without the rule fails rather than fills memory (by address
    // space, except under AddressSanitizer, which reserves terabytes of it; the children's peak
    // RSS is checked below either way).
    const std::string limit = kUnderAsan ? "" : "ulimit -v 4000000; ";
    CmdResult r = Shell(limit + "timeout 10 " + tqkv::test::BinaryDir() + "/tqkv " + args);
    EXPECT_EQ(r.status, 1) << args << "\n" << r.out;
    EXPECT_NE(r.out.find("not a regular file"), std::string::npos) << args << "\n" << r.out;
    EXPECT_EQ(r.out.find("internal error"), std::string::npos) << r.out;
  }
  rusage u{};
  getrusage(RUSAGE_CHILDREN, &u);
  EXPECT_LT(u.ru_maxrss / 1024, 256) << "MiB";
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/z.tqkv"));
}

// Defect 5: a session stored exactly (one token, kept in the exact rows) is not "noise".
TEST(SessionSafety, LosslessOneTokenSessionPassesTheGuard) {
  ScratchDir dir;
  ASSERT_TRUE(dir.ok());
  CmdResult r = Tqkv("checkpoint --model smollm2-135m --tokens 1 --strict --store " + dir.path() +
                     " --session one");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(r.out.find("warning"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("guard: codec error / varying energy at most 0 "), std::string::npos) << r.out;
}

// Defect 8: norm=f16 cannot hold a norm of 65520 or more: refused, naming the fix.
TEST(SessionSafety, F16NormOverflowIsRefusedNamingTheFix) {
  ScratchDir dir;
  ASSERT_TRUE(dir.ok());
  // Every K and V value 60000 (finite in f16): each 16-value head has norm 240,000.
  std::vector<uint8_t> s = SmallState(3);
  const size_t header = 4 + 4 + 3 * 12 + 4 + 4;
  size_t at = header;
  for (int t = 0; t < 4; ++t) {
    at += 4 + 8;
    for (uint32_t i = 0; i < 3 * 16; ++i, at += 2) {
      const uint16_t h = tqkv::FloatToHalf(60000.0f);
      s[at] = static_cast<uint8_t>(h);
      s[at + 1] = static_cast<uint8_t>(h >> 8);
    }
  }
  ASSERT_EQ(at, s.size());
  WriteAll(dir.path() + "/big.state", s);
  for (const char* guard : {"", " --no-guard"}) {
    CmdResult r = Tqkv("llama import " + dir.path() + "/big.state " + dir.path() +
                       "/n.tqkv --head-dim 16 --codec tq3,norm=f16 --exact-tokens 0,0" + guard);
    EXPECT_EQ(r.status, 1) << r.out;
    EXPECT_NE(r.out.find("use norm=f32"), std::string::npos) << r.out;
    EXPECT_FALSE(std::filesystem::exists(dir.path() + "/n.tqkv"));
  }
  CmdResult ok = Tqkv("llama import " + dir.path() + "/big.state " + dir.path() +
                      "/n.tqkv --head-dim 16 --codec tq3 --exact-tokens 0,0");
  EXPECT_EQ(ok.status, 0) << ok.out;
}

// Defect 10: auto:B at a head_dim where only the split presets cannot be built chooses among
// tq2, tq3 and tq4 (it failed with a message about a Kronecker factor).
TEST(SessionSafety, AutoBitsLeavesOutPresetsTheHeadDimCannotHave) {
  ScratchDir dir;
  ASSERT_TRUE(dir.ok());
  CmdResult r = Tqkv("checkpoint --model odd --layers 2 --kv-heads 1 --head-dim 1000 --tokens 200 "
                     "--codec auto:4 --store " + dir.path() + " --session a");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("allocated for 4 bits/value"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("tq2.5"), std::string::npos) << r.out;
  EXPECT_EQ(Tqkv("verify " + dir.path() + "/a.tqkv").status, 0);
}

}  // namespace
