// Session commands: checkpoint, restore, compress, decompress, inspect, verify.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/cli_files.h"
#include "tools/commands.h"
#include "tools/file_object.h"
#include "tools/gpu_command.h"
#include "tqkv/checkpoint.h"
#include "tqkv/container.h"
#include "tqkv/describe.h"
#include "tqkv/safetensors.h"
#include "tqkv/simd.h"
#include "tqkv/synthetic_source.h"
#include "tqkv/thread_pool.h"
#include "tqkv/units.h"

namespace tqkv::tools {
namespace {

using json = nlohmann::json;

// --io as the store's I/O mode (none when not given: the URI's io= holds).
Result<OpenStoreOptions> IoOption(const std::string& io) {
  OpenStoreOptions o;
  if (!io.empty()) {
    TQKV_ASSIGN_OR_RETURN(o.io, ParseIoMode(io));
  }
  return o;
}

Status EmitJson(const json& j, const std::string& path) {
  const std::string text = j.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
  if (path.empty() || path == "-") {
    std::cout << text;
    return Status::Ok();
  }
  return WriteOutputFile(path, text);
}

struct GeometryFlags {
  std::string model = "qwen2.5-7b";
  uint32_t layers = 0, kv_heads = 0, head_dim = 0;
  void Add(CLI::App* cmd) {
    cmd->add_option("--model", model, "Model preset (qwen2.5-7b, llama-3.1-8b, qwen2.5-0.5b, "
                    "smollm2-135m) or a name for custom geometry")->capture_default_str();
    cmd->add_option("--layers", layers, "Custom geometry: layers")->check(CountIn(1, kMaxLayers));
    cmd->add_option("--kv-heads", kv_heads, "Custom geometry: KV heads")
        ->check(CountIn(1, kMaxKvHeads));
    cmd->add_option("--head-dim", head_dim, "Custom geometry: head dimension")
        ->check(CountIn(1, kMaxHeadDim));
  }
  Result<ModelGeometry> Resolve() const {
    ModelGeometry g;
    auto preset = FindModelPreset(model);
    if (preset.ok()) g = preset->geometry;
    if (layers) g.layers = layers;
    if (kv_heads) g.kv_heads = kv_heads;
    if (head_dim) g.head_dim = head_dim;
    if (g.layers == 0 || g.kv_heads == 0 || g.head_dim == 0) {
      return preset.ok() ? Status::InvalidArgument("empty geometry")
                         : preset.status().WithContext("give --layers, --kv-heads and --head-dim");
    }
    return g;
  }
};

void RegisterCheckpoint(CLI::App& app) {
  auto* cmd = app.add_subcommand("checkpoint", "Checkpoint a synthetic session of a model preset");
  struct Opts {
    GeometryFlags geo;
    uint64_t tokens = 10000, seed = 1;
    std::string store, session, json_path, dtype = "f16";
    SettingsFlags settings;
    size_t threads = 0;
  };
  auto o = std::make_shared<Opts>();
  o->geo.Add(cmd);
  o->settings.Add(cmd);
  cmd->add_option("--tokens", o->tokens, "Context length")
      ->check(CountIn(0, UINT64_MAX))
      ->capture_default_str();
  cmd->add_option("--seed", o->seed, "Seed of the synthetic session")
      ->check(CountIn(0, UINT64_MAX))
      ->capture_default_str();
  cmd->add_option("--dtype", o->dtype, "Element type of the session (f16, bf16, f32)")->capture_default_str();
  cmd->add_option("--store", o->store, kStoreUriHelp)->required();
  cmd->add_option("--session", o->session, "Session id (the object key)")->required();
  cmd->add_option("--threads", o->threads, "Encode threads (0: all cores)")
      ->check(CountIn(0, ThreadPool::kMaxThreads));
  cmd->add_option("--json", o->json_path, "Write figures as JSON to FILE ('-' for stdout)");
  cmd->callback([o] {
    Status s = [&]() -> Status {
      TQKV_ASSIGN_OR_RETURN(ModelGeometry g, o->geo.Resolve());
      if (!o->json_path.empty() && o->json_path != "-") {
        TQKV_RETURN_IF_ERROR(CheckOutputPath(o->json_path));
      }
      auto dtype = ParseDType(o->dtype);
      if (!dtype) return Status::InvalidArgument("unknown dtype " + o->dtype);
      TQKV_ASSIGN_OR_RETURN(CheckpointOptions opts, o->settings.Resolve());
      ThreadPool pool(o->threads);
      opts.pool = &pool;
      TQKV_ASSIGN_OR_RETURN(auto store, OpenStore(o->store));
      auto source = MakeSyntheticSource(o->geo.model, g, *dtype, o->tokens, o->seed);
      TQKV_ASSIGN_OR_RETURN(CheckpointStats st, Checkpoint(*source, opts, *store, o->session));
      std::printf("checkpoint %s: %llu tokens, %s, %.1f MB (fp16 %.1f MB, %.2fx) in %.3f s "
                  "(encode %.3f s, write %.3f s)\n",
                  o->session.c_str(), static_cast<unsigned long long>(o->tokens), o->settings.codec().c_str(),
                  st.bytes_written / 1e6, st.fp16_bytes / 1e6,
                  static_cast<double>(st.fp16_bytes) / st.bytes_written, st.seconds,
                  st.encode_seconds, st.write_seconds);
      PrintGuardReport(st, opts);
      if (!o->json_path.empty()) {
        return EmitJson({{"session", o->session}, {"codec", o->settings.codec()}, {"tokens", o->tokens},
                         {"settings", o->settings.Json(opts)},
                  {"bytes_written", st.bytes_written}, {"fp16_bytes", st.fp16_bytes},
                  {"write_s", st.seconds}, {"encode_s", st.encode_seconds},
                  {"source_s", st.source_seconds}, {"write_busy_s", st.write_seconds}},
                 o->json_path);
      }
      return Status::Ok();
    }();
    Report("checkpoint", s);
  });
}

void RegisterRestore(CLI::App& app) {
  auto* cmd = app.add_subcommand("restore", "Restore a session into host memory; prints time and bandwidth");
  struct Opts {
    std::string store, session, io, out, dtype = "f16", json_path, target = "host", read_ahead;
    size_t threads = 0;
    uint32_t read_lanes = RestoreOptions{}.read_lanes;
    bool drop_cache = false, json = false;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("--store", o->store, kStoreUriHelp)->required();
  cmd->add_option("--session", o->session, "Session id")->required();
  cmd->add_option("--read-ahead", o->read_ahead,
                  std::string("Bytes of chunks read ahead of the decoder (default 64MiB). ") +
                      kByteSizeHelp);
  cmd->add_option("--read-lanes", o->read_lanes, "Batches read at once")
      ->check(CountIn(1, 64))
      ->capture_default_str();
  cmd->add_option("--io", o->io, "buffered | direct | uring (overrides the URI's io option); "
                  "--target gpu: gds | direct | uring | buffered (default: the probed ladder)");
  cmd->add_option("--target", o->target, "host | gpu (GPU memory, decoded on the GPU)")
      ->capture_default_str();
  cmd->add_option("--dtype", o->dtype, "Restored element type (f16, bf16, f32)")->capture_default_str();
  cmd->add_option("--out", o->out, "Also write the restored cache as safetensors");
  cmd->add_option("--threads", o->threads, "Decode threads (0: all cores)")
      ->check(CountIn(0, ThreadPool::kMaxThreads));
  cmd->add_flag("--drop-cache", o->drop_cache, "Evict the object from the page cache first");
  cmd->add_flag("--json", o->json, "Print figures as JSON");
  cmd->callback([o] {
    Status s = [&]() -> Status {
      if (o->target == "gpu") return RestoreToGpuCommand(o->store, o->session, o->io, o->dtype, o->json);
      if (o->target != "host") return Status::InvalidArgument("--target must be host or gpu");
      auto dtype = ParseDType(o->dtype);
      if (!dtype) return Status::InvalidArgument("unknown dtype " + o->dtype);
      if (!o->out.empty()) TQKV_RETURN_IF_ERROR(CheckOutputPath(o->out));
      TQKV_ASSIGN_OR_RETURN(OpenStoreOptions store_opts, IoOption(o->io));
      TQKV_ASSIGN_OR_RETURN(auto store, OpenExistingStore(o->store, store_opts));
      ThreadPool pool(o->threads);
      RestoreOptions opts;
      opts.dtype = *dtype;
      opts.pool = &pool;
      opts.drop_cache = o->drop_cache;
      opts.read_lanes = o->read_lanes;
      if (!o->read_ahead.empty()) {
        TQKV_ASSIGN_OR_RETURN(opts.inflight_bytes, ParseByteSize(o->read_ahead, 1, 4ull << 30));
      }
      // Like an inference server, restore into KV memory that is already allocated and mapped:
      // first-touch page faults of fresh memory (~1 GB/s here) are not part of a restore.
      opts.prefault = true;
      // And with its read-ahead memory already touched, as after a server's first restore (a
      // read-ahead past what the pool keeps is not warmed: the restore touches it itself).
      const auto warm_t0 = std::chrono::steady_clock::now();
      const bool warmed = WarmRestoreMemory(1, opts).ok();
      const double warm_s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - warm_t0).count();
      RestoreStats st;
      // CPU seconds of the restore alone (every thread of this process), without the start-up
      // and the warming above: what a server that restores into mapped memory spends.
      const double cpu0 = ProcessCpuSeconds();
      TQKV_ASSIGN_OR_RETURN(auto cache, Restore(*store, o->session, opts, &st));
      const double cpu_s = ProcessCpuSeconds() - cpu0;
      const double alloc_s = st.alloc_seconds;
      const double gbps = st.seconds > 0 ? st.bytes_read / st.seconds / 1e9 : 0;
      const std::string io = o->io.empty() ? "uri" : o->io;
      if (o->json) {
        TQKV_RETURN_IF_ERROR(EmitJson({{"session", o->session}, {"restore_s", st.seconds}, {"bytes_read", st.bytes_read},
                  {"gbps", gbps}, {"fp16_gbps", st.seconds > 0 ? st.fp16_bytes / st.seconds / 1e9 : 0},
                  {"io", io}, {"tokens", st.tokens}, {"model", st.model},
                  {"first_layer_s", st.first_layer_seconds}, {"drop_cache_ok", st.drop_cache_ok},
                  {"read_busy_s", st.read_busy_seconds}, {"decode_busy_s", st.decode_busy_seconds},
                  {"alloc_s", alloc_s}, {"cpu_s", cpu_s}, {"warm_memory_s", warm_s}, {"memory_warmed", warmed}, {"bytes_direct", st.read_path.direct},
                  {"bytes_uring", st.read_path.uring},
                  {"bytes_page_cache", st.read_path.page_cache},
                  {"simd", std::string(SimdLevelName(ActiveSimdLevel()))}},
                 "-"));
      } else {
        std::printf("restore %s: %llu tokens of %s, %.1f MB read in %.3f s = %.3f GB/s "
                    "(%.3f GB/s fp16-equivalent), layer 0 ready after %.3f s, io=%s "
                    "(destination allocated and touched beforehand in %.3f s)\n",
                    o->session.c_str(), static_cast<unsigned long long>(st.tokens), st.model.c_str(),
                    st.bytes_read / 1e6, st.seconds, gbps,
                    st.seconds > 0 ? st.fp16_bytes / st.seconds / 1e9 : 0.0,
                    st.first_layer_seconds, io.c_str(), alloc_s);
      }
      if (!st.drop_cache_ok) std::fprintf(stderr, "warning: page cache not dropped: %s\n",
                                          st.drop_cache_error.c_str());
      // The store reads with O_DIRECT, yet some bytes came through the page cache: a file fell
      // back (a short read, EINVAL), and the figure above is not the disk's.
      if (store->Caps().io_mode != IoMode::kBuffered && st.read_path.page_cache > 0) {
        std::fprintf(stderr, "warning: %.1f MB of %.1f MB read through the page cache, not O_DIRECT\n",
                     st.read_path.page_cache / 1e6, st.bytes_read / 1e6);
      }
      if (!o->out.empty()) TQKV_RETURN_IF_ERROR(WriteSafetensors(cache->cache(), o->out));
      return Status::Ok();
    }();
    Report("restore", s);
  });
}

void RegisterCompress(CLI::App& app) {
  auto* cmd = app.add_subcommand("compress", "Compress a safetensors KV cache into a .tqkv file");
  struct Opts {
    std::string in, out;
    SettingsFlags settings;
    size_t threads = 0;
  };
  auto o = std::make_shared<Opts>();
  o->settings.Add(cmd);
  cmd->add_option("IN", o->in, "Input .safetensors (tensors layers.<i>.k / .v)")->required();
  cmd->add_option("OUT", o->out, "Output .tqkv")->required();
  cmd->add_option("--threads", o->threads, "Encode threads (0: all cores)")
      ->check(CountIn(0, ThreadPool::kMaxThreads));
  cmd->callback([o] {
    Status s = [&]() -> Status {
      TQKV_ASSIGN_OR_RETURN(auto cache, ReadSafetensors(o->in));
      TQKV_ASSIGN_OR_RETURN(CheckpointOptions opts, o->settings.Resolve());
      ThreadPool pool(o->threads);
      opts.pool = &pool;
      TQKV_ASSIGN_OR_RETURN(StoreAndKey sk, OpenFilePath(o->out, true));
      TQKV_ASSIGN_OR_RETURN(CheckpointStats st, Checkpoint(cache->cache(), opts, *sk.store, sk.key));
      std::printf("%s: %.1f MB -> %.1f MB (%.2fx) in %.3f s\n", o->out.c_str(), st.fp16_bytes / 1e6,
                  st.bytes_written / 1e6, static_cast<double>(st.fp16_bytes) / st.bytes_written,
                  st.seconds);
      PrintGuardReport(st, opts);
      return Status::Ok();
    }();
    Report("compress", s);
  });
}

void RegisterDecompress(CLI::App& app) {
  auto* cmd = app.add_subcommand("decompress", "Decode a .tqkv file into safetensors");
  struct Opts {
    std::string in, out, dtype = "f16";
    size_t threads = 0;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("IN", o->in, "Input .tqkv")->required();
  cmd->add_option("OUT", o->out, "Output .safetensors")->required();
  cmd->add_option("--dtype", o->dtype, "Output element type (f16, bf16, f32)")->capture_default_str();
  cmd->add_option("--threads", o->threads, "Decode threads (0: all cores)")
      ->check(CountIn(0, ThreadPool::kMaxThreads));
  cmd->callback([o] {
    Status s = [&]() -> Status {
      auto dtype = ParseDType(o->dtype);
      if (!dtype) return Status::InvalidArgument("unknown dtype " + o->dtype);
      TQKV_ASSIGN_OR_RETURN(StoreAndKey sk, OpenFilePath(o->in));
      TQKV_RETURN_IF_ERROR(CheckOutputPath(o->out, {o->in}));
      ThreadPool pool(o->threads);
      RestoreOptions opts;
      opts.dtype = *dtype;
      opts.pool = &pool;
      TQKV_ASSIGN_OR_RETURN(auto cache, Restore(*sk.store, sk.key, opts));
      return WriteSafetensors(cache->cache(), o->out);
    }();
    Report("decompress", s);
  });
}

void RegisterInspect(CLI::App& app) {
  auto* cmd = app.add_subcommand("inspect", "Show a .tqkv file's geometry, codec, sizes and chunks");
  struct Opts {
    std::string file;
    bool json = false, chunks = false;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("FILE", o->file, "A .tqkv file")->required();
  cmd->add_flag("--json", o->json, "Print as JSON");
  cmd->add_flag("--chunks", o->chunks, "Also print the chunk table");
  cmd->callback([o] {
    Status s = [&]() -> Status {
      TQKV_ASSIGN_OR_RETURN(StoreAndKey sk, OpenFilePath(o->file));
      TQKV_ASSIGN_OR_RETURN(auto object, sk.store->Open(sk.key));
      TQKV_ASSIGN_OR_RETURN(auto reader, ContainerReader::Open(object.get(), o->file));
      const ContainerDescription d = DescribeContainer(*reader);
      if (o->json) {
        std::cout << ContainerDescriptionJson(d, o->chunks) << "\n";
        return Status::Ok();
      }
      const ContainerHeader& h = d.header;
      std::printf("file        %s\nmodel       %s\ngeometry    %u layers x %u KV heads x %u dims\n"
                  "tokens      %llu (token block %u)\ncodec       %s\nfile bytes  %llu\n"
                  "fp16 bytes  %llu\nratio       %.3fx (%.3f bits per value)\nchunks      %zu\n",
                  o->file.c_str(), h.model.c_str(), h.geometry.layers, h.geometry.kv_heads,
                  h.geometry.head_dim, static_cast<unsigned long long>(h.tokens), h.token_block,
                  d.codec.c_str(), static_cast<unsigned long long>(d.file_bytes),
                  static_cast<unsigned long long>(d.fp16_bytes), d.ratio, d.bits_per_value,
                  d.chunks.size());
      if (h.exact_head + h.exact_tail > 0) {
        std::printf("exact rows  first %u and last %u tokens\n", h.exact_head, h.exact_tail);
      }
      if (h.key_mean_block > 0) {
        uint64_t mean_bytes = 0;
        for (const ChunkEntry& e : d.chunks) mean_bytes += e.type == ChunkType::kKeyMeans ? e.size : 0;
        std::printf("key means   per %u-token block, %s (%llu bytes, counted above)\n",
                    h.key_mean_block, std::string(DTypeName(h.key_mean_dtype)).c_str(),
                    static_cast<unsigned long long>(mean_bytes));
      }
      if (IsRagged(h)) {  // version 7: runs of layers holding the same count
        std::string runs;
        for (uint32_t l = 0; l < h.geometry.layers;) {
          uint32_t e = l;
          while (e + 1 < h.geometry.layers && h.layer_tokens[e + 1] == h.layer_tokens[l]) ++e;
          runs += (runs.empty() ? "" : ", ") + std::to_string(l) +
                  (e > l ? "-" + std::to_string(e) : "") + ": " +
                  std::to_string(h.layer_tokens[l]);
          l = e + 1;
        }
        std::printf("layer tokens %s\n", runs.c_str());
      }
      std::printf("format      version %u\n", ContainerVersionFor(h));
      if (h.payload_alignment != kContainerAlignment) {
        std::printf("alignment   payloads at multiples of %u bytes\n", h.payload_alignment);
      }
      if (h.allocated_bits > 0) {
        std::printf("allocated   codecs chosen per layer and tensor for %g bits/value\n",
                    h.allocated_bits);
      }
      PrintGuardTable(h);
      if (d.codecs.size() > 1) {
        std::printf("per layer   ");
        for (size_t l = 0; l < d.layer_codecs.size(); ++l) {
          std::printf("%zu:%s ", l, d.layer_codecs[l].c_str());
        }
        std::printf("\n");
      }
      if (o->chunks) {
        std::printf("%-5s %-6s %-3s %-10s %-8s %-12s %-10s %s\n", "#", "layer", "kv", "tokens",
                    "count", "offset", "size", "xxh3");
        size_t i = 0;
        for (const ChunkEntry& c : d.chunks) {
          std::printf("%-5zu %-6u %-3s %-10llu %-8llu %-12llu %-10llu %016llx\n", i++, c.layer,
                      std::string(ChunkTypeLabel(c)).c_str(),
                      static_cast<unsigned long long>(c.token_begin),
                      static_cast<unsigned long long>(c.token_count),
                      static_cast<unsigned long long>(c.offset),
                      static_cast<unsigned long long>(c.size),
                      static_cast<unsigned long long>(c.checksum));
        }
      }
      return Status::Ok();
    }();
    Report("inspect", s);
  });
}

void RegisterVerify(CLI::App& app) {
  auto* cmd = app.add_subcommand("verify", "Run every check a restore runs on a .tqkv file (exit status says)");
  auto file = std::make_shared<std::string>();
  cmd->add_option("FILE", *file, "A .tqkv file")->required();
  cmd->callback([file] {
    Status s = [&]() -> Status {
      TQKV_ASSIGN_OR_RETURN(StoreAndKey sk, OpenFilePath(*file));
      TQKV_RETURN_IF_ERROR(VerifyObject(*sk.store, sk.key));
      std::printf("%s: OK\n", file->c_str());
      return Status::Ok();
    }();
    Report("verify", s);
  });
}

}  // namespace

void RegisterSessionCommands(CLI::App& app) {
  RegisterCheckpoint(app);
  RegisterRestore(app);
  RegisterCompress(app);
  RegisterDecompress(app);
  RegisterInspect(app);
  RegisterVerify(app);
  RegisterGpuCommands(app);  // tools/gpu_command.cc
}

}  // namespace tqkv::tools
