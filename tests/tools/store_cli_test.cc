// The store side of the command line: read-only commands never create a store, reserved keys are
// refused, and a non-regular file under an object's name neither hangs nor is read.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <utime.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "store/store_test_util.h"
#include "tools/cli_util.h"
#include "test_paths.h"

namespace {

using tqkv::testing_util::CmdResult;
using tqkv::testing_util::Json;
using tqkv::testing_util::ScratchDir;
using tqkv::testing_util::Tqkv;

// Tqkv under `timeout`: a hang becomes exit status 124 instead of a stuck test.
CmdResult TqkvWithTimeout(const std::string& args) {
  const std::string cmd = "timeout 20 " + tqkv::test::BinaryDir() + "/tqkv " + args + " 2>&1";
  CmdResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

// A mistyped store path must be NotFound, not a fresh empty store (issue 13, minor).
TEST(StoreCli, ReadOnlyCommandsNeverCreateTheStoreDirectory) {
  ScratchDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string missing = dir.path() + "/typo/store";
  for (const std::string& args :
       {"ls --store " + missing, "rm --store " + missing + " --session s",
        "pin --store " + missing + " --session s", "gc --store " + missing + " --dry-run",
        "restore --store " + missing + " --session s",
        "restore --store file://" + missing + "?create=1 --session s"}) {
    SCOPED_TRACE(args);
    CmdResult r = Tqkv(args);
    EXPECT_NE(r.status, 0) << r.out;
    EXPECT_NE(r.out.find("Not found"), std::string::npos) << r.out;
    EXPECT_FALSE(std::filesystem::exists(dir.path() + "/typo")) << "a read-only command created it";
  }
  // Writing commands still create the directory they are given.
  CmdResult c = Tqkv("checkpoint --model smollm2-135m --tokens 20 --store " + missing +
                     " --session s");
  EXPECT_EQ(c.status, 0) << c.out;
  EXPECT_EQ(Tqkv("ls --store " + missing).status, 0);
}

// Keys with ".tqkv" inside are the store's own names: `gc` used to delete the session
// ".tqkv-probe.x" as a stale probe and the pin of "a.tqkv.tmp.x" as a stale temp (issue 13,
// defects 3 and 4). They are refused before anything is written.
TEST(StoreCli, ReservedSessionKeysAreRefusedAndLeaveNothing) {
  ScratchDir dir;
  ASSERT_TRUE(dir.ok());
  for (const char* key : {".tqkv-probe.x", "a.tqkv.tmp.x", "a.tqkv.pin", "d.tqkv/x"}) {
    SCOPED_TRACE(key);
    CmdResult r = Tqkv("checkpoint --model smollm2-135m --tokens 20 --store " + dir.path() +
                       " --session " + key);
    EXPECT_NE(r.status, 0) << r.out;
    EXPECT_NE(r.out.find("reserved"), std::string::npos) << r.out;
  }
  EXPECT_TRUE(dir.Files().empty());
}

// `verify` and `restore` of an object whose file is a FIFO used to block in open() forever
// (issue 13, defect 6).
TEST(StoreCli, FifoUnderAnObjectNameNeitherHangsNorIsRead) {
  ScratchDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string fifo = dir.path() + "/f.tqkv";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  for (const std::string& args :
       {"verify " + fifo, "inspect " + fifo, "restore --store " + dir.path() + " --session f"}) {
    SCOPED_TRACE(args);
    const auto t0 = std::chrono::steady_clock::now();
    CmdResult r = TqkvWithTimeout(args);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(s, 5.0) << r.out;
    EXPECT_NE(r.status, 0) << r.out;
    EXPECT_NE(r.out.find("not a regular file"), std::string::npos) << r.out;
  }
}

// A command's .tqkv path is a local file, not a store key: "x^y.tqkv" was refused as an object
// key with "a byte outside [A-Za-z0-9._-/]" (issue 49, item 10). The store's own names stay
// reserved.
TEST(StoreCli, FilePathsAreFileNamesNotStoreKeys) {
  ScratchDir dir;
  ASSERT_TRUE(dir.ok());
  ASSERT_EQ(Tqkv("checkpoint --model smollm2-135m --tokens 20 --codec fp16 --store " + dir.path() +
                 " --session raw").status, 0);
  const std::string st = dir.path() + "/s.safetensors";
  ASSERT_EQ(Tqkv("decompress " + dir.path() + "/raw.tqkv " + st).status, 0);
  const std::string odd = "'" + dir.path() + "/x^y z.tqkv'";
  CmdResult c = Tqkv("compress --codec tq3 " + st + " " + odd);
  ASSERT_EQ(c.status, 0) << c.out;
  EXPECT_TRUE(std::filesystem::exists(dir.path() + "/x^y z.tqkv"));
  for (const std::string& cmd : {"verify " + odd, "inspect " + odd,
                                 "decompress " + odd + " " + dir.path() + "/back.safetensors"}) {
    SCOPED_TRACE(cmd);
    CmdResult r = Tqkv(cmd);
    EXPECT_EQ(r.status, 0) << r.out;
  }
  CmdResult reserved = Tqkv("compress --codec tq3 " + st + " " + dir.path() + "/a.tqkv.pin.tqkv");
  EXPECT_NE(reserved.status, 0) << reserved.out;
  EXPECT_NE(reserved.out.find("reserved"), std::string::npos) << reserved.out;
}

// gc --dry-run reports the stale temps the run removes; it always said 0 (issue 49, item 12).
TEST(StoreCli, GcDryRunCountsTheStaleTempsGcRemoves) {
  ScratchDir dir;
  ASSERT_TRUE(dir.ok());
  ASSERT_EQ(Tqkv("checkpoint --model smollm2-135m --tokens 20 --store " + dir.path() +
                 " --session s").status, 0);
  // What a writer killed before Commit leaves (store/file_layout.h's temp name), an hour old.
  const std::string temp = dir.path() + "/.dead.tqkv.tmp.0123abcd";
  std::ofstream(temp) << "partial";
  const utimbuf old{::time(nullptr) - 7200, ::time(nullptr) - 7200};
  ASSERT_EQ(::utime(temp.c_str(), &old), 0);
  CmdResult dry = Tqkv("gc --store " + dir.path() + " --dry-run --json");
  ASSERT_EQ(dry.status, 0) << dry.out;
  EXPECT_EQ(Json(dry.out)["temps_removed"], 1) << dry.out;
  EXPECT_TRUE(std::filesystem::exists(temp)) << "a dry run removed it";
  CmdResult text = Tqkv("gc --store " + dir.path() + " --dry-run");
  EXPECT_NE(text.out.find("1 stale temps would be removed"), std::string::npos) << text.out;
  CmdResult run = Tqkv("gc --store " + dir.path() + " --json");
  ASSERT_EQ(run.status, 0) << run.out;
  EXPECT_EQ(Json(run.out)["temps_removed"], 1) << run.out;
  EXPECT_FALSE(std::filesystem::exists(temp));
  EXPECT_TRUE(std::filesystem::exists(dir.path() + "/s.tqkv"));
}

}  // namespace
