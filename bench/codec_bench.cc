// `tqkv-bench codec`: codec speed and quality on synthetic head vectors.
//
// Method: the bench builds `vectors` fp16 vectors of `dim` channels as `groups` groups (default 8:
// 4 KV heads x {K, V}, vectors/groups tokens each; for --data kv every group has its own channel
// statistics). Per thread count it runs `reps` repetitions; each runs, for every codec and every
// --simd level in turn (interleaved, so a disturbed minute disturbs all alike),
//   encode: per group SelectGroupMeta + Encode (fp16 in), and
//   decode: per group Decode (fp16 out),
// and reports the best repetition as encode_gbps / decode_gbps (median also in the JSON), in
// fp16-equivalent bytes: 2 * dim bytes per vector per second of wall time (--clock cpu: of the
// process's CPU time). memcpy_gbps copies the
// same fp16 buffer with the same thread count, best of the same repetitions. Quality (nmse,
// cosine) compares the decoded fp16 vectors with the fp16 input.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/cli_common.h"
#include "cli/cli_files.h"
#include "tqkv/codec.h"
#include "tqkv/simd.h"
#include "tqkv/synthetic.h"
#include "tqkv/thread_pool.h"

namespace tqkv::tools {
namespace {

struct CodecBenchOptions {
  std::vector<std::string> codecs = {"fp16", "tq2", "tq2.5", "tq3", "tq3.5", "tq4"};
  uint32_t dim = 128;
  size_t vectors = 262144;
  std::string data = "gaussian";
  std::vector<size_t> threads = {1};
  size_t groups = 8;
  int reps = 5;
  uint64_t seed = 1;
  std::string json;
  std::string clock = "wall";
  std::vector<std::string> simd;  // levels to time, interleaved; empty: the active one
};

using Clock = std::chrono::steady_clock;

struct Timing {
  double best = 0, median = 0;
};

// Seconds on the chosen clock: wall time, or the CPU time of the whole process (every thread),
// which other jobs on a shared machine disturb much less than wall time.
double Now(bool cpu) {
  if (!cpu) return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
  return ProcessCpuSeconds();
}

template <typename Fn>
Result<double> TimeOnce(bool cpu, Fn&& fn) {
  const double a = Now(cpu);
  TQKV_RETURN_IF_ERROR(fn());
  return Now(cpu) - a;
}

Timing Summarize(std::vector<double> t) {
  std::sort(t.begin(), t.end());
  return Timing{t.front(), t[t.size() / 2]};
}

// The SIMD levels to time: --simd's, each refused if this CPU lacks it; none: the active level.
Result<std::vector<SimdLevel>> Levels(const std::vector<std::string>& names) {
  std::vector<SimdLevel> levels;
  for (const std::string& name : names) {
    const std::optional<SimdLevel> level = ParseSimdLevel(name);
    if (!level || !SimdLevelSupported(*level)) {
      return Status::InvalidArgument("--simd " + name + ": this CPU runs " +
                                     SupportedSimdLevelNames());
    }
    levels.push_back(*level);
  }
  if (levels.empty()) levels.push_back(ActiveSimdLevel());
  return levels;
}

// One codec under test: its codes, metadata and decoded output, and a timing per level.
struct Case {
  std::string spec;
  std::unique_ptr<Codec> codec;
  std::vector<uint8_t> codes, meta;
  std::vector<uint16_t> output;
  std::vector<std::vector<double>> enc, dec;  // [level]: one sample per repetition
};

Status Run(const CodecBenchOptions& o) {
  const auto kind = ParseSyntheticKind(o.data);
  if (!kind) return Status::InvalidArgument("--data must be gaussian or kv");
  if (o.groups == 0 || o.vectors < o.groups)
    return Status::InvalidArgument("need vectors >= groups >= 1");
  if (o.reps < 1) return Status::InvalidArgument("--reps must be >= 1");
  TQKV_ASSIGN_OR_RETURN(const std::vector<SimdLevel> levels, Levels(o.simd));
  const bool cpu = o.clock == "cpu";
  const uint32_t d = o.dim;
  const size_t per_group = o.vectors / o.groups;
  const size_t n = per_group * o.groups;
  // Groups 2h and 2h + 1 are head h's K and V.
  const ModelGeometry geo{1, static_cast<uint32_t>((o.groups + 1) / 2), d};
  const SyntheticKv gen(*kind, geo, o.seed);
  std::vector<uint16_t> input(n * d), copy(n * d);
  for (size_t g = 0; g < o.groups; ++g) {
    TQKV_RETURN_IF_ERROR(gen.FillGroup(0, static_cast<int>(g % 2), static_cast<uint32_t>(g / 2), 0,
                                       per_group, DType::kF16, &input[g * per_group * d], d));
  }
  const double fp16_bytes = 2.0 * d * n;
  int w = 8;  // width of the codec column
  for (const auto& c : o.codecs) w = std::max(w, static_cast<int>(c.size()));
  std::string level_names;
  for (SimdLevel l : levels) {
    level_names += (level_names.empty() ? "" : ",") + std::string(SimdLevelName(l));
  }
  nlohmann::json results = nlohmann::json::array();
  double memcpy_gbps = 0;
  std::printf(
      "tqkv-bench codec: dim %u, %zu vectors in %zu groups, data %s, simd %s, best of %d "
      "interleaved, %s clock\n",
      d, n, o.groups, o.data.c_str(), level_names.c_str(), o.reps, o.clock.c_str());
  std::printf("%-*s %7s %7s %7s %8s %7s %10s %12s %12s\n", w, "codec", "simd", "threads",
              "bits/v", "ratio", "nmse", "cosine", "encode GB/s", "decode GB/s");
  for (size_t threads : o.threads) {
    std::unique_ptr<ThreadPool> pool =
        threads > 1 ? std::make_unique<ThreadPool>(threads) : nullptr;
    std::vector<Case> cases;
    for (const std::string& spec_text : o.codecs) {
      TQKV_ASSIGN_OR_RETURN(CodecSpec spec, ParseCodecSpec(spec_text));
      Case c;
      c.spec = spec_text;
      TQKV_ASSIGN_OR_RETURN(c.codec, Codec::Create(spec, d));
      c.codes.resize(n * c.codec->code_bytes());
      c.meta.resize(o.groups * c.codec->group_meta_bytes());
      c.output.resize(n * d);
      c.enc.resize(levels.size());
      c.dec.resize(levels.size());
      cases.push_back(std::move(c));
    }
    // Each repetition runs memcpy, then every codec at every level in turn: a slow minute on a
    // shared machine slows all of them alike, so ratios within a run hold.
    std::vector<double> copies;
    for (int r = 0; r < o.reps; ++r) {
      TQKV_ASSIGN_OR_RETURN(double t, TimeOnce(cpu, [&] {
                              ParallelFor(pool.get(), n, 4096, [&](size_t b, size_t e) {
                                std::memcpy(&copy[b * d], &input[b * d], (e - b) * d * 2);
                              });
                              return Status::Ok();
                            }));
      copies.push_back(t);
      for (Case& c : cases) {
        const size_t cb = c.codec->code_bytes(), mb = c.codec->group_meta_bytes();
        const auto meta_of = [&](size_t g) {  // data(): a codec without metadata has none
          return std::span<uint8_t>(c.meta.data() + g * mb, mb);
        };
        for (size_t l = 0; l < levels.size(); ++l) {
          TQKV_RETURN_IF_ERROR(ForceSimdLevel(levels[l]));
          TQKV_ASSIGN_OR_RETURN(double te, TimeOnce(cpu, [&]() -> Status {
            for (size_t g = 0; g < o.groups; ++g) {
              const uint16_t* x = &input[g * per_group * d];
              TQKV_RETURN_IF_ERROR(
                  c.codec->SelectGroupMeta(x, DType::kF16, per_group, d, meta_of(g)));
              TQKV_RETURN_IF_ERROR(
                  c.codec->Encode(x, DType::kF16, per_group, d, meta_of(g),
                                  {c.codes.data() + g * per_group * cb, per_group * cb}, pool.get()));
            }
            return Status::Ok();
          }));
          TQKV_ASSIGN_OR_RETURN(double td, TimeOnce(cpu, [&]() -> Status {
            for (size_t g = 0; g < o.groups; ++g) {
              TQKV_RETURN_IF_ERROR(c.codec->Decode(
                  {c.codes.data() + g * per_group * cb, per_group * cb}, per_group, meta_of(g),
                  &c.output[g * per_group * d], DType::kF16, d, pool.get()));
            }
            return Status::Ok();
          }));
          c.enc[l].push_back(te);
          c.dec[l].push_back(td);
        }
      }
    }
    ResetSimdLevel();
    const Timing mt = Summarize(copies);
    const double mg = fp16_bytes / mt.best / 1e9;
    memcpy_gbps = std::max(memcpy_gbps, mg);
    std::printf("%-*s %7s %7zu %48s %12.2f\n", w, "memcpy", "", threads, "", mg);
    for (const Case& c : cases) {
      // Every level gives the same bytes, so quality is the codec's (the last level's output).
      double err = 0, ref = 0, cos = 0;
      for (size_t i = 0; i < n; ++i) {
        double xy = 0, xx = 0, yy = 0;
        for (uint32_t j = 0; j < d; ++j) {
          const double a = HalfToFloat(input[i * d + j]), b = HalfToFloat(c.output[i * d + j]);
          err += (a - b) * (a - b);
          xy += a * b;
          xx += a * a;
          yy += b * b;
        }
        ref += xx;
        cos += (xx > 0 && yy > 0) ? xy / std::sqrt(xx * yy) : (xx == yy ? 1.0 : 0.0);
      }
      const double bpv = 8.0 *
                         (static_cast<double>(c.codes.size()) + static_cast<double>(c.meta.size())) /
                         (static_cast<double>(n) * d);
      const double nmse = err / ref, cosine = cos / n;
      double first_eg = 0, first_dg = 0;
      for (size_t l = 0; l < levels.size(); ++l) {
        const Timing enc = Summarize(c.enc[l]), dec = Summarize(c.dec[l]);
        const double eg = fp16_bytes / enc.best / 1e9, dg = fp16_bytes / dec.best / 1e9;
        if (l == 0) first_eg = eg, first_dg = dg;
        const std::string simd(SimdLevelName(levels[l]));
        std::printf("%-*s %7s %7zu %7.3f %7.2fx %8.5f %9.5f %12.2f %12.2f", w, c.spec.c_str(),
                    simd.c_str(), threads, bpv, 16.0 / bpv, nmse, cosine, eg, dg);
        nlohmann::json row = {{"codec", c.spec},
                              {"dim", d},
                              {"threads", threads},
                              {"data", o.data},
                              {"simd", simd},
                              {"vectors", n},
                              {"groups", o.groups},
                              {"bits_per_value", bpv},
                              {"ratio_vs_fp16", 16.0 / bpv},
                              {"nmse", nmse},
                              {"cosine_mean", cosine},
                              {"encode_gbps", eg},
                              {"decode_gbps", dg},
                              {"encode_gbps_median", fp16_bytes / enc.median / 1e9},
                              {"decode_gbps_median", fp16_bytes / dec.median / 1e9},
                              {"memcpy_gbps", mg},
                              {"reps", o.reps},
                              {"clock", o.clock}};
        if (l > 0) {  // against the first level, from the same interleaved repetitions
          const std::string base(SimdLevelName(levels[0]));
          std::printf("   %.2fx / %.2fx %s", eg / first_eg, dg / first_dg, base.c_str());
          row["versus"] = base;
          row["encode_ratio"] = eg / first_eg;
          row["decode_ratio"] = dg / first_dg;
        }
        std::printf("\n");
        results.push_back(std::move(row));
      }
    }
  }
  if (!o.json.empty()) {
    nlohmann::json doc = {
        {"memcpy_gbps", memcpy_gbps},
        {"timing", "best of interleaved reps; GB/s of fp16-equivalent bytes (2*dim per vector)"},
        {"clock", o.clock},
        {"results", results}};
    TQKV_RETURN_IF_ERROR(tools::WriteOutputFile(o.json, doc.dump(2) + "\n"));
  }
  return Status::Ok();
}

}  // namespace

void RegisterBenchCodec(CLI::App& app) {
  auto opts = std::make_shared<CodecBenchOptions>();
  CLI::App* cmd = app.add_subcommand("codec", "Codec speed and quality on synthetic vectors");
  cmd->add_option("--codec", opts->codecs, "Codec spec (repeatable)")->take_all();
  cmd->add_option("--dim", opts->dim, "Head dimension")->check(CLI::Range(1, 65535));
  cmd->add_option("--vectors", opts->vectors, "Vectors in all")->check(CLI::PositiveNumber);
  cmd->add_option("--data", opts->data, "gaussian or kv")->check(CLI::IsMember({"gaussian", "kv"}));
  cmd->add_option("--threads", opts->threads, "Thread counts (repeatable)")->take_all();
  cmd->add_option("--groups", opts->groups, "Groups the vectors are split into (K/V x heads)");
  cmd->add_option("--reps", opts->reps, "Repetitions per measurement (best is reported)");
  cmd->add_option("--seed", opts->seed, "Data seed");
  cmd->add_option("--clock", opts->clock,
                  "wall (default) or cpu: process CPU time, steadier on a shared machine")
      ->check(CLI::IsMember({"wall", "cpu"}));
  cmd->add_option("--simd", opts->simd,
                  "SIMD level to time (repeatable: levels interleaved in every repetition, "
                  "ratios against the first)")
      ->take_all();
  cmd->add_option("--json", opts->json, "Write results as JSON to this file");
  cmd->callback([opts] { Report("codec", Run(*opts)); });
}

}  // namespace tqkv::tools
