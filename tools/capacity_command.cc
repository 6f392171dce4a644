// `tqkv capacity`: session sizes at FP16 and with a codec (a real checkpoint, container overhead
// included), warm sessions per capacity, storage per GPU and per cluster.
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "tools/commands.h"
#include "tqkv/capacity.h"
#include "tqkv/thread_pool.h"
#include "tqkv/units.h"

namespace tqkv::tools {
namespace {

// A capacity option: at least 1 B, in the one unit rule of tqkv/units.h (10TB = 10^13 bytes).
Result<double> CapacityBytes(std::string_view option, const std::string& text) {
  auto v = ParseByteSize(text, 1);
  if (!v.ok()) return v.status().WithContext(std::string(option));
  return static_cast<double>(*v);
}

std::string Human(double bytes) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB", "PB", "EB"};
  int u = 0;
  while (bytes >= 1000 && u < 6) {
    bytes /= 1000;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g %s", bytes, units[u]);
  return buf;
}

}  // namespace

void RegisterCapacityCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand("capacity", "Capacity planning: sessions per capacity, storage per GPU");
  struct Opts {
    std::string model = "qwen2.5-7b", capacity = "10TB", per_gpu, json_path;
    SettingsFlags settings;
    uint64_t tokens = 10000, gpus = 0;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("--model", o->model, "Model preset")->capture_default_str();
  cmd->add_option("--tokens", o->tokens, "Tokens per session")
      ->check(CountIn(0, UINT64_MAX))
      ->capture_default_str();
  o->settings.Add(cmd, /*guard=*/false);
  cmd->add_option("--capacity", o->capacity,
                  std::string("Storage capacity (e.g. 10TB). ") + kByteSizeHelp)
      ->capture_default_str();
  cmd->add_option("--per-gpu", o->per_gpu, "FP16 KV storage a GPU needs today (e.g. 16TB)");
  cmd->add_option("--gpus", o->gpus, "GPUs in the cluster")->check(CountIn(0, UINT64_MAX));
  cmd->add_flag("--json", o->json, "Print JSON");
  cmd->callback([o] {
    Status s = [&]() -> Status {
      TQKV_ASSIGN_OR_RETURN(ModelPreset preset, FindModelPreset(o->model));
      CapacityOptions co;
      co.model = o->model;
      co.geometry = preset.geometry;
      co.tokens = o->tokens;
      TQKV_ASSIGN_OR_RETURN(co.capacity_bytes, CapacityBytes("--capacity", o->capacity));
      TQKV_ASSIGN_OR_RETURN(co.checkpoint, o->settings.Resolve());
      if (!o->per_gpu.empty()) {
        TQKV_ASSIGN_OR_RETURN(co.per_gpu_bytes, CapacityBytes("--per-gpu", o->per_gpu));
        co.gpus = o->gpus;
      }
      ThreadPool pool;
      co.checkpoint.pool = &pool;
      TQKV_ASSIGN_OR_RETURN(const CapacityPlan p, PlanCapacity(co));
      const double capacity = co.capacity_bytes, per_gpu = co.per_gpu_bytes;
      nlohmann::json j = {{"model", o->model}, {"tokens", o->tokens}, {"codec", o->settings.codec()},
                          {"exact_first", co.checkpoint.exact_head},
                          {"exact_last", co.checkpoint.exact_tail},
                          {"key_means", FormatKeyMeans({co.checkpoint.key_mean_block,
                                                        co.checkpoint.key_mean_dtype})},
                          {"capacity_bytes", capacity}, {"fp16_session_bytes", p.fp16_session_bytes},
                          {"codec_session_bytes", p.codec_session_bytes}, {"ratio", p.ratio},
                          {"sessions_fp16", p.sessions_fp16},
                          {"sessions_codec", p.sessions_codec}};
      if (!o->per_gpu.empty()) {
        j["per_gpu_bytes_fp16"] = per_gpu;
        j["per_gpu_bytes_codec"] = p.per_gpu_bytes_codec;
        if (o->gpus) {
          j["gpus"] = o->gpus;
          j["cluster_bytes_fp16"] = p.cluster_bytes_fp16;
          j["cluster_bytes_codec"] = p.cluster_bytes_codec;
        }
      }
      if (o->json) {
        std::cout << j.dump(2) << "\n";
        return Status::Ok();
      }
      std::printf("%s, %llu tokens per session, codec %s (a real checkpoint, container included)\n",
                  o->model.c_str(), static_cast<unsigned long long>(o->tokens), o->settings.codec().c_str());
      std::printf("  session size:  fp16 %s (%llu B)   %s %s (%llu B)   %.3fx smaller\n",
                  Human(static_cast<double>(p.fp16_session_bytes)).c_str(),
                  static_cast<unsigned long long>(p.fp16_session_bytes), o->settings.codec().c_str(),
                  Human(static_cast<double>(p.codec_session_bytes)).c_str(),
                  static_cast<unsigned long long>(p.codec_session_bytes), p.ratio);
      std::printf("  warm sessions in %s:  fp16 %.0f   %s %.0f\n", Human(capacity).c_str(),
                  p.sessions_fp16, o->settings.codec().c_str(), p.sessions_codec);
      if (!o->per_gpu.empty()) {
        std::printf("  storage per GPU:  %s at fp16 -> %s with %s\n", Human(per_gpu).c_str(),
                    Human(p.per_gpu_bytes_codec).c_str(), o->settings.codec().c_str());
        if (o->gpus) {
          std::printf("  cluster of %llu GPUs:  %s at fp16 -> %s with %s\n",
                      static_cast<unsigned long long>(o->gpus), Human(p.cluster_bytes_fp16).c_str(),
                      Human(p.cluster_bytes_codec).c_str(), o->settings.codec().c_str());
        }
      }
      return Status::Ok();
    }();
    Report("capacity", s);
  });
}

}  // namespace tqkv::tools
