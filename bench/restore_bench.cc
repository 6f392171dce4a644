// `tqkv-bench restore`: W concurrent workers checkpoint and restore their own sessions, for each
// context length x codec x I/O path x target (host memory, or GPU memory through the GDS ladder);
// per-cell statistics, bounds, quality, table/JSON/CSV/SVG.

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "bench/restore_bench_gpu.h"
#include "bench/restore_bench_phases.h"
#include "bench/restore_bench_report.h"
#include "bench/restore_bench_rows.h"
#include "bench/restore_bench_util.h"
#include "bench/svg_chart.h"
#include "cli/cli_common.h"
#include "cli/cli_files.h"
#include "tqkv/checkpoint.h"
#include "tqkv/settings.h"
#include "tqkv/simd.h"
#include "tqkv/container.h"
#include "store/testing/store_testing.h"
#include "tqkv/synthetic_source.h"
#include "tqkv/thread_pool.h"
#include "tqkv/units.h"

namespace tqkv::tools {
namespace {

using json = nlohmann::json;
using bench::Cell;
using bench::Clock;
using bench::Since;

struct Options {
  size_t workers = 8;
  std::vector<uint64_t> tokens{10000, 30000, 50000};
  std::vector<std::string> codecs;
  std::vector<std::string> ios;
  std::vector<std::string> configs;  // CODEC:IO[:TARGET]; replace the codec x io x target product
  std::vector<std::string> targets;  // host, gpu (default host)
  std::string store = "out/bench-store";
  std::string model = "qwen2.5-7b";
  std::vector<double> links{0};  // per-worker link rates; 0 = the raw store
  uint64_t max_memory = 0;
  std::string json_path, csv_path, chart_path;
  bool breakdown = true;       // stages of TurboQuant rows
  bool breakdown_all = false;  // stages of every row (fp16 too)
  bool quality = true;
  uint64_t quality_tokens = 4096;
  uint64_t seed = 1;
  bool keep = false;
  bool warm_memory = true;  // WarmRestoreMemory before each host row's stages and restore
  uint32_t read_lanes = RestoreOptions{}.read_lanes;  // every host restore and read stage
  std::string read_ahead;                             // byte size; empty: RestoreOptions' default
  uint64_t inflight_bytes = RestoreOptions{}.inflight_bytes;
};

// The reader settings every host restore and read stage of a run shares.
RestoreOptions ReaderOptions(const Options& o) {
  RestoreOptions ro;
  ro.read_lanes = o.read_lanes;
  ro.inflight_bytes = o.inflight_bytes;
  return ro;
}

bool IsGpu(const Cell& c) { return c.target == bench::Target::kGpu; }

std::string Key(const Cell& c, size_t w) {
  char link[32] = "";
  if (c.link_gbps > 0) std::snprintf(link, sizeof(link), "-link%g", c.link_gbps);
  std::string codec = c.codec;  // specs hold ':' ',' '=' '/' (kl:2.5, k:tq4/v:tq2): not in keys
  for (char& ch : codec) {
    if (ch == ':' || ch == ',' || ch == '=' || ch == '/' || ch == '@') ch = '_';
  }
  return "bench/" + codec + "-" + c.io + "-" + std::to_string(c.tokens) + link + "-w" +
         std::to_string(w) + (IsGpu(c) ? "-gpu" : "");
}

// The store's host I/O mode for a cell: its io, or for GPU rows the GPU restore's rule for its
// rung (gds reads its header and index through O_DIRECT).
Result<IoMode> StoreIo(const Cell& c) {
  return IsGpu(c) ? bench::GpuStoreIo(c.io) : ParseIoMode(c.io);
}

Result<std::unique_ptr<Store>> OpenCellStore(const Options& o, const Cell& c) {
  TQKV_ASSIGN_OR_RETURN(IoMode io, StoreIo(c));
  return OpenStore(o.store, {.io = io});
}

Result<std::unique_ptr<Store>> OpenWorkerStore(const Options& o, const Cell& c) {
  TQKV_ASSIGN_OR_RETURN(auto store, OpenCellStore(o, c));
  if (c.link_gbps <= 0) return store;
  ThrottleOptions t;
  t.read_bytes_per_sec = t.write_bytes_per_sec = c.link_gbps * 1e9;
  t.per_object = true;
  return std::unique_ptr<Store>(new ThrottledStore(std::move(store), t));
}

// Runs fn(w) on W threads started together; returns the wall time of the slowest.
template <typename Fn>
Status RunWorkers(size_t n, Fn fn) {
  std::vector<Status> st(n);
  std::vector<std::thread> threads;
  for (size_t w = 0; w < n; ++w) threads.emplace_back([&, w] { st[w] = fn(w); });
  for (auto& t : threads) t.join();
  for (auto& s : st) TQKV_RETURN_IF_ERROR(s);
  return Status::Ok();
}

// Phases 2 and 3 of a host row: bounds (read-only, decode-only), then the timed restore.
Status RunHostRestores(const Options& o, const ModelGeometry& g, const CodecSpec& spec,
                       size_t pool_threads, Cell& c, bench::Progress& progress) {
  const size_t W = c.workers;
  const uint64_t fp16_session = c.fp16_bytes;
  // Restore target: whole sessions when W of them fit, else streamed layer by layer.
  const uint64_t target = W * fp16_session;
  c.streamed = target > o.max_memory;
  std::vector<std::unique_ptr<KvCacheBuffer>> dst(W);
  if (!c.streamed) {
    for (size_t w = 0; w < W; ++w) {
      TQKV_ASSIGN_OR_RETURN(dst[w], KvCacheBuffer::Allocate(o.model, g, DType::kF16, c.tokens));
      bench::Touch(dst[w]->cache());  // an inference server's KV memory is already mapped
    }
  }
  // Like a server that has restored before (or warmed at start-up): the restores' read-ahead
  // memory is kept and touched, so no stage pays first-touch page faults (2.5b). More workers
  // than the pool keeps: the first restores warm it instead.
  c.memory_warmed = o.warm_memory && WarmRestoreMemory(W, ReaderOptions(o)).ok();
  auto restore_one = [&](Store& store, size_t w, bool drop, RestoreStats* st) -> Status {
    ThreadPool pool(pool_threads);
    RestoreOptions ro = ReaderOptions(o);
    ro.dtype = DType::kF16;
    ro.pool = pool_threads > 1 ? &pool : nullptr;
    ro.drop_cache = drop;
    ro.expect_geometry = &g;
    if (!c.streamed) return RestoreInto(store, Key(c, w), dst[w]->cache(), ro, st);
    return RestoreStreaming(store, Key(c, w), ro, bench::CheckLayer, st);
  };

  // Phase 2 (TurboQuant codecs): the stages one by one, each through the restore's own reader
  // on the same objects: raw reads, reads with checksums, decode only (from memory).
  if (o.breakdown && (spec.kind == CodecKind::kTurboQuant || o.breakdown_all)) {
    // W workers at once; wall = first read of any worker to the last end, as for the restore.
    auto stage = [&](const char* name, auto fn) -> Result<std::pair<double, uint64_t>> {
      progress.Set(name);
      std::vector<double> start(W), end(W);
      std::vector<uint64_t> bytes(W);
      const auto t = Clock::now();
      TQKV_RETURN_IF_ERROR(RunWorkers(W, [&](size_t w) -> Status {
        TQKV_ASSIGN_OR_RETURN(bench::PhaseRun r, fn(w));
        end[w] = Since(t);
        start[w] = end[w] - r.seconds;
        bytes[w] = r.bytes;
        progress.Tick();
        return Status::Ok();
      }));
      return std::pair<double, uint64_t>{
          *std::max_element(end.begin(), end.end()) - *std::min_element(start.begin(), start.end()),
          std::accumulate(bytes.begin(), bytes.end(), uint64_t{0})};
    };
    auto read_stage = [&](bool verify) {
      return [&, verify](size_t w) -> Result<bench::PhaseRun> {
        TQKV_ASSIGN_OR_RETURN(auto store, OpenWorkerStore(o, c));
        return bench::ReadLikeRestore(*store, Key(c, w), verify, ReaderOptions(o));
      };
    };
    TQKV_ASSIGN_OR_RETURN(auto raw, stage("raw read", read_stage(false)));
    c.raw_read_s = raw.first;
    c.raw_read_gbps = raw.second / raw.first / 1e9;
    TQKV_ASSIGN_OR_RETURN(auto verified, stage("read+checksum", read_stage(true)));
    c.read_only_s = verified.first;
    c.read_only_gbps = verified.second / verified.first / 1e9;

    // Decode only, from in-memory copies of the objects, when they fit beside the targets (large
    // fp16 rows may not: their bound is then the reads alone).
    if ((c.streamed ? 0 : target) + W * c.file_bytes <= o.max_memory) {
      MemoryStore mem;
      for (size_t w = 0; w < W; ++w) {
        TQKV_ASSIGN_OR_RETURN(auto store, OpenCellStore(o, c));
        TQKV_RETURN_IF_ERROR(bench::CopyObject(*store, mem, Key(c, w)));
      }
      // Once untimed, all workers together: the restores' working memory (slots, a streamed
      // restore's layer buffers) then comes from the pool (src/checkpoint/restore_memory.h) in
      // the timed stage, as in the timed restore after it, not from fresh pages.
      progress.Set("decode warm-up");
      TQKV_RETURN_IF_ERROR(RunWorkers(W, [&](size_t w) -> Status {
        RestoreStats st;
        return restore_one(mem, w, false, &st);
      }));
      TQKV_ASSIGN_OR_RETURN(auto decode, stage("decode only", [&](size_t w) -> Result<bench::PhaseRun> {
        RestoreStats st;
        TQKV_RETURN_IF_ERROR(restore_one(mem, w, false, &st));
        bench::PhaseRun r;
        r.bytes = st.bytes_read;
        r.seconds = st.seconds;
        return r;
      }));
      // The memory store copies each chunk into its slot, CPU work that an O_DIRECT restore's
      // DMA does not cost (~5 % of a CPU-bound tq3 restore here, 2.5b): timed alone, all
      // workers together, and taken out, so the restore cannot beat its bound by that copy. (A
      // buffered restore pays the like of it, the kernel's copy out of the page cache.)
      c.decode_only_s = decode.first;
      if (c.io != "buffered") {  // a host row: its io is the store's
        TQKV_ASSIGN_OR_RETURN(auto copy, stage("memory copy", [&](size_t w) {
          return bench::ReadLikeRestore(mem, Key(c, w), false, ReaderOptions(o));
        }));
        c.memory_copy_s = copy.first;
        if (decode.first > copy.first) c.decode_only_s = decode.first - copy.first;
      }
      c.decode_capacity_fp16_gbps = W * fp16_session / c.decode_only_s / 1e9;
    }
    c.bound_fp16_gbps = std::isnan(c.decode_capacity_fp16_gbps)
                            ? c.ratio() * c.read_only_gbps
                            : std::min(c.ratio() * c.read_only_gbps, c.decode_capacity_fp16_gbps);
  }

  // Phase 3: the timed concurrent restore, from storage (page cache dropped per object).
  progress.Set("restore");
  const auto t0 = Clock::now();
  TQKV_RETURN_IF_ERROR(RunWorkers(W, [&](size_t w) -> Status {
    TQKV_ASSIGN_OR_RETURN(auto store, OpenWorkerStore(o, c));
    RestoreStats st;
    TQKV_RETURN_IF_ERROR(restore_one(*store, w, true, &st));
    c.w[w].end = Since(t0);
    c.w[w].start = c.w[w].end - st.seconds;  // the first read (after open and cache drop)
    c.w[w].restore_s = st.seconds;
    c.w[w].bytes_read = st.bytes_read;
    c.w[w].drop_ok = st.drop_cache_ok;
    c.w[w].drop_error = st.drop_cache_error;
    c.w[w].bytes_direct = st.read_path.direct;
    c.w[w].bytes_page_cache = st.read_path.page_cache;
    progress.Tick();
    return Status::Ok();
  }));
  return Status::Ok();
}

// The timed restore of a GPU row: W workers each restore their session into device memory.
// No bounds phase (GPU decode time comes from RestoreToGpu's events) and no link emulation:
// cuFile reads the file itself, past any store decorator.
Status RunGpuRestores(const Options& o, uint64_t fp16_session, Cell& c, bench::Progress& progress) {
  const size_t W = c.workers;
  const std::string forced = bench::ForcedGpuIo({c.codec, c.io, c.target});
  // f16 outputs plus each restore's 64 MiB of device slots (GpuRestoreOptions::inflight_bytes).
  TQKV_RETURN_IF_ERROR(bench::PrepareGpu(W * (fp16_session + (64u << 20))));
  c.gpu.assign(W, {});
  progress.Set("restore to GPU");
  const auto t0 = Clock::now();
  TQKV_RETURN_IF_ERROR(RunWorkers(W, [&](size_t w) -> Status {
    TQKV_ASSIGN_OR_RETURN(auto store, OpenCellStore(o, c));
    TQKV_ASSIGN_OR_RETURN(bench::GpuRestoreResult r,
                          bench::RestoreOnGpu(*store, Key(c, w), forced));
    c.w[w].end = Since(t0);
    c.w[w].start = c.w[w].end - r.seconds;
    c.w[w].restore_s = r.seconds;
    c.w[w].bytes_read = r.bytes_read;
    c.w[w].drop_ok = r.drop_ok;
    c.w[w].drop_error = r.drop_error;
    c.gpu[w] = r.gpu;
    progress.Tick();
    return Status::Ok();
  }));
  return Status::Ok();
}

Status RunCell(const Options& o, const ModelGeometry& g, Cell& c, bench::Progress& progress) {
  const size_t W = c.workers;
  c.w.assign(W, {});
  const uint64_t fp16_session = g.SessionBytes(c.tokens, DType::kF16);
  c.fp16_bytes = fp16_session;
  const size_t cores = std::max(1u, std::thread::hardware_concurrency());
  const size_t pool_threads = W < cores ? cores / W : 1;
  TQKV_ASSIGN_OR_RETURN(const KvCodecSpec spec, ParseKvCodecSpec(c.codec));

  // Phase 1: concurrent checkpoints.
  progress.Set("checkpoint");
  TQKV_RETURN_IF_ERROR(RunWorkers(W, [&](size_t w) -> Status {
    TQKV_ASSIGN_OR_RETURN(auto store, OpenWorkerStore(o, c));
    auto source = MakeSyntheticSource(o.model, g, DType::kF16, c.tokens, o.seed + w);
    ThreadPool pool(pool_threads);
    CheckpointOptions opts;
    SetCodec(opts, spec);
    opts.pool = pool_threads > 1 ? &pool : nullptr;
    TQKV_ASSIGN_OR_RETURN(CheckpointStats st, Checkpoint(*source, opts, *store, Key(c, w)));
    c.w[w].write_s = st.seconds - st.source_seconds;
    c.w[w].bytes_written = st.bytes_written;
    progress.Tick();
    return Status::Ok();
  }));
  c.file_bytes = c.w[0].bytes_written;

  if (IsGpu(c)) {
    TQKV_RETURN_IF_ERROR(RunGpuRestores(o, fp16_session, c, progress));
  } else {
    TQKV_RETURN_IF_ERROR(RunHostRestores(o, g, spec.k, pool_threads, c, progress));
  }
  double first = 1e300, last = 0;
  uint64_t bytes = 0;
  std::vector<double> rs, ws;
  for (const auto& w : c.w) {
    first = std::min(first, w.start);
    last = std::max(last, w.end);
    bytes += w.bytes_read;
    c.bytes_direct += w.bytes_direct;
    c.bytes_page_cache += w.bytes_page_cache;
    rs.push_back(w.restore_s);
    ws.push_back(w.write_s);
    if (!w.drop_ok) {
      c.drop_ok = false;
      c.drop_error = w.drop_error;
    }
  }
  c.wall_s = last - first;
  c.read_gbps_aggregate = bytes / c.wall_s / 1e9;
  c.fp16_gbps_aggregate = W * fp16_session / c.wall_s / 1e9;
  c.restore = bench::Summarize(rs);
  c.write = bench::Summarize(ws);
  c.per_worker_gbps = (bytes / static_cast<double>(W)) / c.restore.mean / 1e9;

  // Quality of what was restored (worker 0, untimed). GPU rows: the host decoder reads the same
  // object; the GPU decode is bit-identical to it (tests/gpu).
  if (o.quality) {
    progress.Set("quality");
    TQKV_ASSIGN_OR_RETURN(auto store, OpenCellStore(o, c));
    auto q = bench::MeasureQuality(*store, Key(c, 0), o.model, g, c.tokens, o.seed,
                                   std::min(c.tokens, o.quality_tokens));
    if (!q.ok()) return q.status();
    c.nmse = q->nmse;
    c.cosine_mean = q->cosine_mean;
  }
  if (!o.keep) {
    TQKV_ASSIGN_OR_RETURN(auto store, OpenCellStore(o, c));
    for (size_t w = 0; w < W; ++w) (void)store->Remove(Key(c, w));
  }
  return Status::Ok();
}

void PrintTable(const std::vector<Cell>& cells, const Options& o) {
  std::printf("\n%-8s %-9s %7s %3s %-6s | %8s %8s %8s %8s | %8s | %9s %9s | %7s | %9s %9s %8s\n",
              "codec", "io", "tokens", "W", "link", "rest_mean", "p50", "p99", "max", "write", "read_GB/s",
              "fp16eq", "speedup", "nmse", "cosine", "bound%");
  for (const auto& c : cells) {
    char link[16] = "raw";
    if (c.link_gbps > 0) std::snprintf(link, sizeof(link), "%g", c.link_gbps);
    std::printf("%-8s %-9s %7llu %3zu %-6s | %8.3f %8.3f %8.3f %8.3f | %8.3f | %9.3f %9.3f | %7.2f | "
                "%9.5f %9.5f %8s\n",
                c.codec.c_str(), c.io.c_str(), static_cast<unsigned long long>(c.tokens), c.workers,
                link,
                c.restore.mean, c.restore.p50, c.restore.p99, c.restore.max, c.write.mean,
                c.read_gbps_aggregate, c.fp16_gbps_aggregate, c.speedup, c.nmse, c.cosine_mean,
                std::isnan(c.bound_fp16_gbps)
                    ? "-"
                    : (std::to_string(std::lround(100 * c.fp16_gbps_aggregate / c.bound_fp16_gbps)) + "%").c_str());
  }
  std::printf("\nrestore times in seconds (per worker: first read to session decoded and verified); "
              "read_GB/s = bytes read by all workers / wall time of the concurrent phase;\n"
              "fp16eq = FP16 bytes restored / wall; bound%% = fp16eq / min(ratio x checksummed-read "
              "GB/s, decode-only capacity), both measured in this run (stages below).\n");
  for (double link : o.links) {
    if (link > 0) {
      std::printf("LINK EMULATED (link %g): every worker's reads and writes go through a %.3f GB/s "
                  "token bucket.\n", link, link);
    } else {
      std::printf("link raw: no link emulation, raw local storage.\n");
    }
  }
  for (const auto& c : cells) {
    if (c.streamed) {
      std::printf("note: %s %s %llu tokens: %zu sessions do not fit in --max-memory; restored "
                  "layer by layer (each layer checked and released).\n",
                  c.codec.c_str(), c.io.c_str(), static_cast<unsigned long long>(c.tokens), c.workers);
    }
    if (!c.drop_ok) {
      std::printf("WARNING: %s %s %llu: page cache could not be dropped (%s): reads may be cached.\n",
                  c.codec.c_str(), c.io.c_str(), static_cast<unsigned long long>(c.tokens),
                  c.drop_error.c_str());
    }
    const Result<IoMode> store_io = StoreIo(c);
    if (store_io.ok() && *store_io != IoMode::kBuffered && c.bytes_page_cache > 0) {
      std::printf("WARNING: %s %s %llu: %.1f MB of the restores' reads went through the page "
                  "cache, not O_DIRECT (a file fell back).\n",
                  c.codec.c_str(), c.io.c_str(), static_cast<unsigned long long>(c.tokens),
                  c.bytes_page_cache / 1e6);
    }
  }
  bench::PrintBreakdown(cells);
  bench::PrintSummary(cells);
}

// GPU rows: restore into device memory; io_used is the rung the ladder ended on.
void PrintGpuTable(const std::vector<Cell>& cells) {
  std::printf("\nGPU rows (restore into GPU memory, f16):\n");
  std::printf("%-8s %-9s %-9s %7s %3s | %8s %8s %8s | %8s %8s %8s %8s | %9s %9s | %7s\n", "codec",
              "io", "io_used", "tokens", "W", "rest_mean", "p50", "p99", "layer0", "setup",
              "decode", "copy", "read_GB/s", "fp16eq", "speedup");
  for (const auto& c : cells) {
    const json g = bench::GpuRowJson(c.gpu, c.gpu_device);
    std::printf("%-8s %-9s %-9s %7llu %3zu | %8.3f %8.3f %8.3f | %8.3f %8.3f %8.3f %8.3f | %9.3f "
                "%9.3f | %7.2f\n",
                c.codec.c_str(), c.io.c_str(), g["io_used"].get<std::string>().c_str(),
                static_cast<unsigned long long>(c.tokens), c.workers, c.restore.mean,
                c.restore.p50, c.restore.p99, g["first_layer_s_mean"].get<double>(),
                g["setup_s_mean"].get<double>(), g["decode_gpu_s_mean"].get<double>(),
                g["copy_gpu_s_mean"].get<double>(), c.read_gbps_aggregate, c.fp16_gbps_aggregate,
                c.speedup);
    for (const auto& sk : g["io_skipped"]) {
      std::printf("  %s %s %llu: ladder skipped %s\n", c.codec.c_str(), c.io.c_str(),
                  static_cast<unsigned long long>(c.tokens), sk.get<std::string>().c_str());
    }
    if (!c.drop_ok) {
      std::printf("WARNING: %s %s %llu gpu: page cache could not be dropped (%s).\n",
                  c.codec.c_str(), c.io.c_str(), static_cast<unsigned long long>(c.tokens),
                  c.drop_error.c_str());
    }
  }
  std::printf("GPU times in seconds, means over workers: rest = RestoreToGpu's wall time (open to "
              "every layer decoded, setup included); layer0 = open to layer 0 decoded; setup = "
              "probe + device/pinned allocations; decode, copy = GPU time of the decode kernels "
              "and H2D copies (events); speedup vs fp16 + buffered into the GPU; no link "
              "emulation.\n");
  if (!cells.empty()) std::printf("device: %s\n", cells.front().gpu_device.c_str());
}

json CellJson(const Cell& c) {
  auto num = [](double v) { return std::isnan(v) ? json(nullptr) : json(v); };
  json j = {{"codec", c.codec}, {"io", c.io}, {"tokens", c.tokens}, {"workers", c.workers},
            {"restore_s_mean", c.restore.mean}, {"restore_s_p50", c.restore.p50},
            {"restore_s_p99", c.restore.p99}, {"restore_s_min", c.restore.min},
            {"restore_s_max", c.restore.max}, {"restore_s_std", c.restore.std},
            {"write_s_mean", c.write.mean}, {"write_s_p50", c.write.p50},
            {"write_s_p99", c.write.p99}, {"write_s_min", c.write.min},
            {"write_s_max", c.write.max}, {"write_s_std", c.write.std},
            {"restore_wall_s", c.wall_s}, {"read_gbps_aggregate", c.read_gbps_aggregate},
            {"fp16_gbps_aggregate", c.fp16_gbps_aggregate}, {"per_worker_gbps", c.per_worker_gbps},
            {"file_bytes", c.file_bytes}, {"fp16_bytes", c.fp16_bytes},
            {"speedup_vs_fp16_buffered", num(c.speedup)}, {"nmse", num(c.nmse)},
            {"cosine_mean", num(c.cosine_mean)}, {"streamed", c.streamed},
            {"page_cache_dropped", c.drop_ok}, {"restore_memory_warmed", c.memory_warmed},
            {"bytes_direct", c.bytes_direct},
            {"bytes_page_cache", c.bytes_page_cache},
            {"read_only_s", num(c.read_only_s)}, {"decode_only_s", num(c.decode_only_s)},
            {"memory_copy_s", num(c.memory_copy_s)},
            {"read_only_gbps", num(c.read_only_gbps)},
            {"decode_capacity_fp16_gbps", num(c.decode_capacity_fp16_gbps)},
            {"bound_fp16_gbps", num(c.bound_fp16_gbps)},
            {"raw_read_s", num(c.raw_read_s)}, {"raw_read_gbps", num(c.raw_read_gbps)},
            {"overlap", c.has_breakdown() ? json(c.overlap()) : json(nullptr)},
            {"bottleneck", c.has_breakdown() ? json(c.bottleneck()) : json(nullptr)},
            {"link_gbps", c.link_gbps > 0 ? json(c.link_gbps) : json(nullptr)}};
  j["target"] = std::string(bench::TargetName(c.target));
  if (IsGpu(c)) {
    j.update(bench::GpuRowJson(c.gpu, c.gpu_device));
    j["link_emulated"] = false;  // GPU rows read the storage itself
  }
  json per = json::array();
  for (size_t i = 0; i < c.w.size(); ++i) {
    const auto& w = c.w[i];
    per.push_back({{"write_s", w.write_s}, {"restore_s", w.restore_s}, {"bytes_read", w.bytes_read},
                   {"bytes_written", w.bytes_written}});
    if (i < c.gpu.size()) per.back().update(bench::GpuWorkerJson(c.gpu[i]));
  }
  j["per_worker"] = per;
  return j;
}

Status Run(Options o) {
  TQKV_ASSIGN_OR_RETURN(ModelPreset preset, FindModelPreset(o.model));
  const ModelGeometry g = preset.geometry;
  if (o.codecs.empty()) o.codecs = {"fp16", "tq3"};
  if (o.ios.empty()) o.ios = {"buffered", "direct"};
  if (o.workers == 0) return Status::InvalidArgument("--workers must be at least 1");
  if (!o.read_ahead.empty()) {
    TQKV_ASSIGN_OR_RETURN(o.inflight_bytes, ParseByteSize(o.read_ahead, 1, 4ull << 30));
  }
  if (o.links.empty()) o.links = {0};
  for (double l : o.links) {
    if (!(l >= 0) || !std::isfinite(l)) {
      return Status::InvalidArgument("--link-gbps must be 0 (raw store) or a positive rate");
    }
  }
  TQKV_ASSIGN_OR_RETURN(std::vector<bench::RowConfig> rows,
                        bench::ExpandRowConfigs(o.configs, o.codecs, o.ios, o.targets));
  if (o.max_memory == 0) o.max_memory = bench::AvailableMemory() * 6 / 10;
  {
    // Opening the store creates its directory; the largest cell's sessions must fit there (they
    // are removed after each cell).
    TQKV_ASSIGN_OR_RETURN(auto store, OpenStore(o.store));
    uint64_t need = 0;
    for (uint64_t t : o.tokens) need = std::max(need, o.workers * g.SessionBytes(t, DType::kF16));
    TQKV_RETURN_IF_ERROR(bench::CheckDiskSpace(*store, need * 11 / 10));
  }

  // GPU rows: probed once here; without a usable device they are skipped with the reason.
  bench::GpuAvailability gpu;
  std::string gpu_note;
  const bool any_gpu = std::any_of(rows.begin(), rows.end(), [](const bench::RowConfig& r) {
    return r.target == bench::Target::kGpu;
  });
  if (any_gpu) {
    TQKV_ASSIGN_OR_RETURN(auto store, OpenStore(o.store, {.io = IoMode::kBuffered}));
    gpu = bench::ProbeGpuForBench(*store);
    TQKV_ASSIGN_OR_RETURN(rows, bench::DropGpuRows(std::move(rows), gpu.unavailable, &gpu_note));
    if (!gpu_note.empty()) std::fprintf(stderr, "tqkv-bench restore: %s\n", gpu_note.c_str());
  }
  std::vector<Cell> cells;
  for (double link : o.links) {
    for (uint64_t t : o.tokens) {
      for (const auto& r : rows) {
        if (r.target == bench::Target::kGpu && link > 0) continue;  // cuFile bypasses the link
        Cell c;
        c.codec = r.codec;
        c.io = r.io;
        c.target = r.target;
        c.gpu_device = gpu.device;
        c.tokens = t;
        c.workers = o.workers;
        c.link_gbps = link;
        cells.push_back(c);
      }
    }
  }
  std::string links;
  for (double l : o.links) links += (links.empty() ? "" : ", ") + bench::LinkLabel(l);
  std::fprintf(stderr, "tqkv-bench restore: %s, %zu workers, %zu cells, store %s, %s\n",
               o.model.c_str(), o.workers, cells.size(), o.store.c_str(), links.c_str());
  bench::Progress progress(cells.size(), o.workers);
  for (size_t i = 0; i < cells.size(); ++i) {
    char link[32] = "";
    if (cells[i].link_gbps > 0) std::snprintf(link, sizeof(link), " link %g", cells[i].link_gbps);
    progress.Cell(i, cells[i].codec + " " + cells[i].io + (IsGpu(cells[i]) ? " gpu " : " ") +
                         std::to_string(cells[i].tokens) + link);
    TQKV_RETURN_IF_ERROR(RunCell(o, g, cells[i], progress));
  }
  progress.Done();
  // Speedups against fp16 + buffered at the same context length and target.
  for (auto& c : cells) {
    for (const auto& base : cells) {
      if (base.codec == "fp16" && base.io == "buffered" && base.tokens == c.tokens &&
          base.target == c.target && base.link_gbps == c.link_gbps) {
        c.speedup = base.restore.mean / c.restore.mean;
      }
    }
  }
  std::vector<Cell> host_cells, gpu_cells;
  for (const auto& c : cells) (IsGpu(c) ? gpu_cells : host_cells).push_back(c);
  if (!host_cells.empty()) PrintTable(host_cells, o);
  if (!gpu_cells.empty()) PrintGpuTable(gpu_cells);
  if (!gpu_note.empty()) std::printf("%s\n", gpu_note.c_str());
  json out;
  // One link: a number (null = raw store), as before; several: the list.
  if (o.links.size() == 1) {
    out["link_gbps"] = o.links[0] > 0 ? json(o.links[0]) : json(nullptr);
  } else {
    out["link_gbps"] = o.links;
  }
  out["model"] = o.model;
  out["store"] = o.store;
  out["max_memory"] = o.max_memory;
  out["read_lanes"] = o.read_lanes;
  out["read_ahead_bytes"] = o.inflight_bytes;
  out["machine"] = bench::MachineDescription();
  out["simd"] = std::string(SimdLevelName(ActiveSimdLevel()));
  if (any_gpu) {
    out["gpu"] = {{"probe", gpu.probe}, {"device", gpu.device},
                  {"skipped_rows", gpu_note.empty() ? json(nullptr) : json(gpu_note)}};
  }
  json results = json::array();
  for (const auto& c : cells) results.push_back(CellJson(c));
  out["results"] = results;
  if (!o.json_path.empty()) {
    TQKV_RETURN_IF_ERROR(tools::WriteOutputFile(o.json_path, out.dump(2) + "\n"));
    std::printf("json: %s\n", o.json_path.c_str());
  }
  if (!o.csv_path.empty()) {
    std::ostringstream f;
    // GPU columns only when there are GPU rows: host-only files keep their columns.
    f << "codec,io,tokens,workers,restore_s_mean,restore_s_p50,restore_s_p99,write_s_mean,"
         "read_gbps_aggregate,speedup_vs_fp16_buffered,nmse,cosine_mean"
      << (gpu_cells.empty() ? "" : ",target,io_used,first_layer_s_mean,decode_gpu_s_mean")
      << (o.links.size() > 1 ? ",link_gbps" : "") << "\n";
    for (const auto& c : cells) {
      f << c.codec << "," << c.io << "," << c.tokens << "," << c.workers << "," << c.restore.mean
        << "," << c.restore.p50 << "," << c.restore.p99 << "," << c.write.mean << ","
        << c.read_gbps_aggregate << "," << c.speedup << "," << c.nmse << "," << c.cosine_mean;
      if (!gpu_cells.empty()) {
        const json g = IsGpu(c) ? bench::GpuRowJson(c.gpu, c.gpu_device) : json::object();
        f << "," << bench::TargetName(c.target) << ","
          << (IsGpu(c) ? g["io_used"].get<std::string>() : "") << ","
          << (IsGpu(c) ? std::to_string(g["first_layer_s_mean"].get<double>()) : "") << ","
          << (IsGpu(c) ? std::to_string(g["decode_gpu_s_mean"].get<double>()) : "");
      }
      if (o.links.size() > 1) f << "," << c.link_gbps;
      f << "\n";
    }
    TQKV_RETURN_IF_ERROR(tools::WriteOutputFile(o.csv_path, f.str()));
    std::printf("csv: %s\n", o.csv_path.c_str());
  }
  if (!o.chart_path.empty()) {
    std::map<std::string, bench::Series> times, bw, speedup;
    for (const auto& c : cells) {
      const std::string name = c.codec + " + " + c.io + (IsGpu(c) ? " -> GPU" : "") +
                               (o.links.size() > 1 ? ", " + bench::LinkLabel(c.link_gbps) : "");
      times[name].name = bw[name].name = name;
      times[name].x.push_back(c.tokens);
      times[name].y.push_back(c.restore.mean);
      bw[name].x.push_back(c.tokens);
      bw[name].y.push_back(c.read_gbps_aggregate);
      if (c.codec != "fp16" && !std::isnan(c.speedup)) {
        speedup[name].name = name;
        speedup[name].x.push_back(c.tokens);
        speedup[name].y.push_back(c.speedup);
      }
    }
    bench::Panel p1{"Restore time vs context length (" + o.model + ", " +
                        std::to_string(o.workers) + " workers)",
                    "context length (tokens)", "mean restore time per session (s)", {}, false};
    bench::Panel p2{"Aggregate read bandwidth", "context length (tokens)", "GB/s read (all workers)",
                    {}, true};
    for (auto& [k, s] : times) p1.series.push_back(s);
    for (auto& [k, s] : bw) p2.series.push_back(s);
    // The headline: how many times faster than fp16 + buffered, raw disk and link side by side.
    bench::Panel p3{"Speedup over fp16 + buffered (same link)", "context length (tokens)",
                    "x faster restore", {}, true};
    for (auto& [k, s] : speedup) p3.series.push_back(s);
    std::vector<bench::Panel> panels{p1, p2};
    if (!p3.series.empty()) panels.push_back(p3);
    std::string note;
    for (double l : o.links) {
      note += (l > 0 ? "link emulated: " + bench::LinkLabel(l) : std::string("raw local storage")) + "; ";
    }
    note += bench::MachineDescription();
    TQKV_RETURN_IF_ERROR(tools::WriteOutputFile(o.chart_path, bench::RenderSvg(panels, note)));
    std::printf("chart: %s\n", o.chart_path.c_str());
  }
  return Status::Ok();
}

}  // namespace

void RegisterBenchRestore(CLI::App& app) {
  auto* cmd = app.add_subcommand("restore", "Concurrent checkpoint/restore benchmark");
  auto o = std::make_shared<Options>();
  cmd->add_option("--workers", o->workers, "Concurrent workers, each with its own session")->capture_default_str();
  cmd->add_option("--tokens", o->tokens, "Context lengths")->delimiter(',')->capture_default_str();
  OneValuePerUse(cmd->add_option("--codec", o->codecs, "Codec specs (repeatable; default fp16 and tq3)"));
  OneValuePerUse(cmd->add_option("--io", o->ios, "I/O paths: buffered, direct, uring (repeatable; default buffered and direct)"));
  OneValuePerUse(cmd->add_option("--config", o->configs,
                  "CODEC:IO or CODEC:IO:TARGET rows to run instead of every codec x io x target "
                  "(repeatable; e.g. fp16:buffered:gpu, tq3:gds:gpu)"));
  OneValuePerUse(cmd->add_option("--target", o->targets,
                  "Restore into host memory or GPU memory: host, gpu (repeatable; default host). "
                  "GPU rows take io gds (the GDS -> direct -> buffered ladder), direct, uring or buffered"));
  cmd->add_option("--store", o->store, kStoreUriHelp)->capture_default_str();
  cmd->add_option("--model", o->model, "Model preset")->capture_default_str();
  cmd->add_option("--link-gbps", o->links,
                  "Emulate a per-worker storage link of X GB/s; a list (0,0.05) runs every row at "
                  "each rate, 0 = the raw store")
      ->delimiter(',');
  cmd->add_option("--max-memory", o->max_memory, "Bytes of restore targets held at once (default 60% of available)");
  cmd->add_option("--json", o->json_path, "Write results as JSON");
  cmd->add_option("--csv", o->csv_path, "Write results as CSV");
  cmd->add_option("--chart", o->chart_path, "Write an SVG chart");
  cmd->add_option("--seed", o->seed, "Seed of worker 0's session (worker w uses seed + w)");
  cmd->add_option("--quality-tokens", o->quality_tokens, "Tokens per layer compared for nmse/cosine")->capture_default_str();
  cmd->add_flag("--breakdown", o->breakdown_all,
                "Measure the stages (raw read, read+checksum, decode only) of every row, fp16 too "
                "(default: TurboQuant rows only)");
  cmd->add_flag("!--no-breakdown", o->breakdown, "Skip the stages (raw read, read+checksum, decode only)");
  cmd->add_flag("!--no-quality", o->quality, "Skip the quality measurement");
  cmd->add_flag("--keep", o->keep, "Keep the session objects");
  cmd->add_flag("!--cold-memory", o->warm_memory,
                "Do not warm the restores' read-ahead memory first (a server's first restores)");
  cmd->add_option("--read-lanes", o->read_lanes, "Batches each restore reads at once (as tqkv restore)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  cmd->add_option("--read-ahead", o->read_ahead,
                  "Bytes of chunks each restore reads ahead of its decoder (default 64MiB)");
  cmd->callback([o] { Report("restore", Run(*o)); });
}

}  // namespace tqkv::tools
