// The tqkv command line: contracts later checks read (inspect/restore/capacity JSON), exit
// statuses, clear errors.
#include <gtest/gtest.h>

#include "tools/cli_util.h"

#include <cmath>
#include <fstream>
#include <random>
#include <nlohmann/json.hpp>
#include <string>

#include "store/store_test_util.h"
#include "tqkv/kv_cache.h"
#include "tqkv/safetensors.h"
#include "tqkv/simd.h"

namespace {

using tqkv::testing_util::CmdResult;
using tqkv::testing_util::Json;
using tqkv::testing_util::Tqkv;

TEST(Cli, CheckpointInspectVerifyRestore) {
  tqkv::testing_util::ScratchDir dir;
  ASSERT_TRUE(dir.ok());
  CmdResult c = Tqkv("checkpoint --model smollm2-135m --tokens 300 --codec tq3 --store " + dir.path() +
               " --session s1");
  ASSERT_EQ(c.status, 0) << c.out;
  CmdResult i = Tqkv("inspect --json " + dir.path() + "/s1.tqkv");
  ASSERT_EQ(i.status, 0) << i.out;
  auto j = Json(i.out);
  ASSERT_FALSE(j.is_discarded()) << i.out;
  for (const char* k : {"file_bytes", "fp16_bytes", "ratio", "tokens", "codec", "model"}) {
    EXPECT_TRUE(j.contains(k)) << k;
  }
  EXPECT_EQ(j["tokens"], 300);
  EXPECT_EQ(j["codec"], "tq3");
  EXPECT_EQ(j["model"], "smollm2-135m");
  EXPECT_EQ(j["fp16_bytes"], 2ull * 30 * 300 * 3 * 64 * 2);
  const double ratio = j["fp16_bytes"].get<double>() / j["file_bytes"].get<double>();
  EXPECT_NEAR(j["ratio"].get<double>(), ratio, 1e-9);
  EXPECT_EQ(Tqkv("verify " + dir.path() + "/s1.tqkv").status, 0);
  for (const char* io : {"buffered", "direct", "uring"}) {
    CmdResult r = Tqkv("restore --json --store file://" + dir.path() + " --session s1 --io " + io);
    ASSERT_EQ(r.status, 0) << r.out;
    auto rj = Json(r.out);
    for (const char* k : {"restore_s", "bytes_read", "gbps", "io"}) EXPECT_TRUE(rj.contains(k)) << k;
    EXPECT_EQ(rj["io"], io);
    EXPECT_EQ(rj["simd"], std::string(tqkv::SimdLevelName(tqkv::ActiveSimdLevel())));
    EXPECT_GE(rj["bytes_read"].get<uint64_t>(), j["file_bytes"].get<uint64_t>() - 4096);
    const uint64_t direct = rj["bytes_direct"], page_cache = rj["bytes_page_cache"];
    EXPECT_EQ(direct + page_cache, rj["bytes_read"].get<uint64_t>());
    if (std::string_view(io) == "buffered") {
      EXPECT_EQ(direct, 0u);
    }
    // Where the filesystem takes O_DIRECT, all of it (a file falling back midway, as every
    // direct restore once did after its footer's short read, shows here).
    if (direct > 0) {
      EXPECT_EQ(page_cache, 0u) << r.out;
    }
    EXPECT_TRUE(rj["memory_warmed"].get<bool>());
    EXPECT_GT(rj["cpu_s"].get<double>(), 0.0);  // the restore call's process CPU time
  }
  // A read-ahead larger than the kept pool: not warmed, and the restore still runs.
  CmdResult big = Tqkv("restore --json --store file://" + dir.path() + " --session s1 --read-ahead 3GiB");
  ASSERT_EQ(big.status, 0) << big.out;
  EXPECT_FALSE(Json(big.out)["memory_warmed"].get<bool>());
}

// The tools' default: a lossy session keeps its last 4 tokens exact, an fp16 one none, and
// --exact-tokens 0,0 turns it off.
TEST(Cli, LossySessionsKeepTheLastTokensExactByDefault) {
  tqkv::testing_util::ScratchDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string base = "checkpoint --model smollm2-135m --tokens 300 --store " + dir.path();
  const struct {
    const char* session;
    const char* args;
    int last;
  } cases[] = {{"tq3", " --codec tq3", 4},
               {"kv", " --codec k4v2", 4},
               {"layer", " --codec fp16 --layer-codec 3:tq4", 4},
               {"fp16", " --codec fp16", 0},
               {"off", " --codec tq3 --exact-tokens 0,0", 0}};
  for (const auto& c : cases) {
    CmdResult w = Tqkv(base + c.args + " --session " + c.session);
    ASSERT_EQ(w.status, 0) << c.session << ": " << w.out;
    CmdResult i = Tqkv("inspect --json " + dir.path() + "/" + c.session + ".tqkv");
    ASSERT_EQ(i.status, 0) << i.out;
    auto j = Json(i.out);
    EXPECT_EQ(j["exact_tokens"]["first"], 0) << c.session;
    EXPECT_EQ(j["exact_tokens"]["last"], c.last) << c.session;
  }
}

TEST(Cli, CheckpointExactTokensShowInInspect) {
  tqkv::testing_util::ScratchDir dir;
  ASSERT_TRUE(dir.ok());
  CmdResult c = Tqkv("checkpoint --model smollm2-135m --tokens 300 --codec tq3 --exact-tokens 4,100"
                     " --store " + dir.path() + " --session e");
  ASSERT_EQ(c.status, 0) << c.out;
  CmdResult i = Tqkv("inspect --json --chunks " + dir.path() + "/e.tqkv");
  ASSERT_EQ(i.status, 0) << i.out;
  auto j = Json(i.out);
  ASSERT_FALSE(j.is_discarded()) << i.out;
  EXPECT_EQ(j["exact_tokens"]["first"], 4);
  EXPECT_EQ(j["exact_tokens"]["last"], 100);
  size_t exact_chunks = 0;
  for (const auto& ch : j["chunks"]) {
    if (ch["type"] == "exact") {
      ++exact_chunks;
      EXPECT_EQ(ch["size"], 2ull * 104 * 3 * 64 * 2);  // K and V, 104 rows, 3 heads, fp16
    }
  }
  EXPECT_EQ(exact_chunks, 30u);
  CmdResult text = Tqkv("inspect " + dir.path() + "/e.tqkv");
  EXPECT_NE(text.out.find("exact rows  first 4 and last 100 tokens"), std::string::npos) << text.out;
  EXPECT_EQ(Tqkv("verify " + dir.path() + "/e.tqkv").status, 0);
  CmdResult r = Tqkv("restore --json --store file://" + dir.path() + " --session e");
  EXPECT_EQ(r.status, 0) << r.out;
  CmdResult bad = Tqkv("checkpoint --model smollm2-135m --tokens 30 --exact-tokens 4:100 --store " +
                       dir.path() + " --session f");
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.out.find("FIRST,LAST"), std::string::npos) << bad.out;
}

TEST(Cli, CorruptFileFailsVerifyAndRestore) {
  tqkv::testing_util::ScratchDir dir;
  ASSERT_EQ(Tqkv("checkpoint --model smollm2-135m --tokens 64 --codec tq4 --store " + dir.path() +
                 " --session bad").status, 0);
  const std::string path = dir.path() + "/bad.tqkv";
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(5000);
    char c;
    f.read(&c, 1);
    f.seekp(5000);
    c = static_cast<char>(c ^ 0x5A);
    f.write(&c, 1);
  }
  CmdResult v = Tqkv("verify " + path);
  EXPECT_NE(v.status, 0);
  EXPECT_NE(v.out.find("Corruption"), std::string::npos) << v.out;
  CmdResult r = Tqkv("restore --store " + dir.path() + " --session bad");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("Corruption"), std::string::npos) << r.out;
}

TEST(Cli, SafetensorsRoundTripThroughCompress) {
  tqkv::testing_util::ScratchDir dir;
  ASSERT_EQ(Tqkv("checkpoint --model qwen2.5-0.5b --tokens 40 --codec fp16 --store " + dir.path() +
                 " --session raw").status, 0);
  const std::string st1 = dir.path() + "/a.safetensors", st2 = dir.path() + "/b.safetensors";
  ASSERT_EQ(Tqkv("decompress " + dir.path() + "/raw.tqkv " + st1).status, 0);
  CmdResult c = Tqkv("compress " + st1 + " " + dir.path() + "/c.tqkv --codec fp16");
  ASSERT_EQ(c.status, 0) << c.out;
  ASSERT_EQ(Tqkv("decompress " + dir.path() + "/c.tqkv " + st2).status, 0);
  std::ifstream a(st1, std::ios::binary), b(st2, std::ios::binary);
  std::string sa((std::istreambuf_iterator<char>(a)), {}), sb((std::istreambuf_iterator<char>(b)), {});
  EXPECT_EQ(sa, sb);  // fp16 is lossless end to end
  EXPECT_GT(sa.size(), 2u * 24 * 40 * 2 * 64 * 2);
}

// A repeatable option takes one value per use: "compress --layer-codec 0:fp16 IN OUT --codec tq3"
// swallowed IN and OUT (CLI11 stops taking values only when the arguments left are the required
// positionals) and failed with "IN is required" (issue 49, item 9).
TEST(Cli, RepeatableOptionsLeaveThePositionalsAfterThem) {
  tqkv::testing_util::ScratchDir dir;
  ASSERT_TRUE(dir.ok());
  ASSERT_EQ(Tqkv("checkpoint --model smollm2-135m --tokens 20 --codec fp16 --store " + dir.path() +
                 " --session raw").status, 0);
  const std::string st = dir.path() + "/s.safetensors";
  ASSERT_EQ(Tqkv("decompress " + dir.path() + "/raw.tqkv " + st).status, 0);
  const std::string out = dir.path() + "/c.tqkv";
  CmdResult c = Tqkv("compress --layer-codec 0:fp16 --layer-codec 1:tq4 " + st + " " + out +
                     " --codec tq3");
  ASSERT_EQ(c.status, 0) << c.out;
  CmdResult i = Tqkv("inspect " + out);
  ASSERT_EQ(i.status, 0) << i.out;
  EXPECT_NE(i.out.find("0:fp16 1:tq4 2:tq3"), std::string::npos) << i.out;
  // The option's value is still required, and a third positional is still an error.
  EXPECT_NE(Tqkv("compress " + st + " " + out + " --layer-codec").status, 0);
  EXPECT_NE(Tqkv("compress --layer-codec 0:fp16 " + st + " " + out + " extra").status, 0);
}

// An f32 vector whose squared norm overflows f32 (x[13, 0, :4] = 1e20): compress refused its own
// output on the guard ("sums must be finite and not negative"), while --no-guard wrote it
// (issue 49, item 8). The codec stores it as NaN (docs/codec.md §5), the guard leaves it out of
// its sums (§9), and the rest of the session is unaffected.
TEST(Cli, CompressKeepsAVectorWhoseSquaredNormOverflowsF32) {
  tqkv::testing_util::ScratchDir dir;
  ASSERT_TRUE(dir.ok());
  const tqkv::ModelGeometry g{2, 2, 64};
  constexpr uint64_t kTokens = 32;
  auto buf = tqkv::KvCacheBuffer::Allocate("m", g, tqkv::DType::kF32, kTokens).value();
  std::mt19937 rng(3);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  for (uint32_t l = 0; l < g.layers; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      auto* x = static_cast<float*>(buf->cache().tensor(l, kv));
      for (size_t i = 0; i < kTokens * g.token_elems(); ++i) x[i] = n01(rng);
      if (l == 0) {
        for (size_t c = 0; c < 4; ++c) x[13 * g.token_elems() + c] = 1e20f;
      }
    }
  }
  const std::string src = dir.path() + "/src.safetensors", out = dir.path() + "/out.tqkv";
  ASSERT_TRUE(tqkv::WriteSafetensors(buf->cache(), src).ok());
  CmdResult c = Tqkv("compress " + src + " " + out + " --codec tq3");
  ASSERT_EQ(c.status, 0) << c.out;
  CmdResult v = Tqkv("verify " + out);
  EXPECT_EQ(v.status, 0) << v.out;
  CmdResult i = Tqkv("inspect --json " + out);
  EXPECT_TRUE(Json(i.out)["guard"]["recorded"].get<bool>()) << i.out;
  const std::string back = dir.path() + "/back.safetensors";
  ASSERT_EQ(Tqkv("decompress " + out + " " + back + " --dtype f32").status, 0);
  auto r = tqkv::ReadSafetensors(back);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  // V is not mean-centred: its overflowing vector is all NaN, every other vector finite.
  const auto* rv = static_cast<const float*>((*r)->cache().v(0));
  for (uint64_t t = 0; t < kTokens; ++t) {
    for (uint32_t h = 0; h < g.kv_heads; ++h) {
      const float* e = rv + t * g.token_elems() + h * g.head_dim;
      const bool overflow = t == 13 && h == 0;
      for (uint32_t k = 0; k < g.head_dim; ++k) {
        ASSERT_EQ(std::isnan(e[k]), overflow) << "token " << t << " head " << h << " elem " << k;
      }
    }
  }
}

TEST(Cli, ErrorsAreClearAndNonZero) {
  CmdResult a = Tqkv("checkpoint --model nope --tokens 10 --codec tq3 --store /tmp --session x");
  EXPECT_NE(a.status, 0);
  EXPECT_NE(a.out.find("unknown model preset"), std::string::npos) << a.out;
  CmdResult b = Tqkv("checkpoint --model qwen2.5-7b --tokens 10 --codec tq9.9 --store /tmp --session x");
  EXPECT_NE(b.status, 0);
  CmdResult c = Tqkv("restore --store /tmp --session ../etc/passwd");
  EXPECT_NE(c.status, 0);
  CmdResult d = Tqkv("inspect /nonexistent/x.tqkv");
  EXPECT_NE(d.status, 0);
  EXPECT_EQ(Tqkv("--help").status, 0);
}

// The product's command line has no benchmark or experiment: those are tqkv-bench's.
TEST(Cli, HelpListsNoBenchOrMigrate) {
  CmdResult h = Tqkv("--help");
  ASSERT_EQ(h.status, 0) << h.out;
  EXPECT_NE(h.out.find("checkpoint"), std::string::npos) << h.out;
  for (const char* name : {"bench", "migrate"}) {
    EXPECT_EQ(h.out.find(name), std::string::npos) << name << "\n" << h.out;
  }
  EXPECT_NE(Tqkv("bench codec").status, 0);
  EXPECT_NE(Tqkv("migrate --codec tq3").status, 0);
  CmdResult b = tqkv::testing_util::TqkvBench("--help");
  ASSERT_EQ(b.status, 0) << b.out;
  for (const char* name : {"codec", "restore", "migrate", "gpu"}) {
    EXPECT_NE(b.out.find(name), std::string::npos) << name << "\n" << b.out;
  }
  EXPECT_EQ(b.out.find("migrate-worker"), std::string::npos) << b.out;
}

}  // namespace
