// `tqkv capacity`: session sizes at FP16 and with a codec (a real checkpoint, container overhead
// included), warm sessions per capacity, storage per GPU and per cluster.
#include <cmath>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "tools/commands.h"
#include "tqkv/checkpoint.h"
#include "tqkv/synthetic_source.h"
#include "tqkv/thread_pool.h"

namespace tqkv::tools {
namespace {

// A store that keeps nothing and counts the bytes of each committed object.
class CountingStore final : public Store {
 public:
  class Writer final : public WritableObject {
   public:
    explicit Writer(uint64_t* committed) : committed_(committed) {}
    Status Append(std::span<const uint8_t> src) override {
      bytes_ += src.size();
      return Status::Ok();
    }
    Status Commit() override {
      *committed_ = bytes_;
      return Status::Ok();
    }
    Status Abort() override { return Status::Ok(); }
    uint64_t BytesWritten() const override { return bytes_; }

   private:
    uint64_t* committed_;
    uint64_t bytes_ = 0;
  };
  std::string_view Name() const override { return "counting"; }
  std::string Uri() const override { return "counting://"; }
  StoreCaps Caps() const override { return {}; }
  Result<std::unique_ptr<WritableObject>> Create(std::string_view) override {
    return std::unique_ptr<WritableObject>(new Writer(&committed_));
  }
  Result<std::unique_ptr<ReadableObject>> Open(std::string_view key) override {
    return Status::NotFound(std::string(key));
  }
  Status Remove(std::string_view key) override { return Status::NotFound(std::string(key)); }
  Result<std::vector<ObjectInfo>> List(std::string_view) override {
    return std::vector<ObjectInfo>{};
  }
  uint64_t committed() const { return committed_; }

 private:
  uint64_t committed_ = 0;
};

// "10TB", "16 TB", "3.5PB", "500GB", "1e12": decimal units (capacity is sold in powers of 10).
Result<double> ParseBytes(std::string text) {
  std::string num, unit;
  for (char c : text) {
    if (c == ' ') continue;
    if ((c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-') {
      if (unit.empty()) {
        num += c;
        continue;
      }
    }
    unit += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  }
  char* end = nullptr;
  const double v = std::strtod(num.c_str(), &end);
  if (num.empty() || *end != '\0' || !(v > 0)) return Status::InvalidArgument("bad size '" + text + "'");
  const std::pair<const char*, double> units[] = {{"", 1},     {"B", 1},     {"KB", 1e3},
                                                  {"MB", 1e6}, {"GB", 1e9},  {"TB", 1e12},
                                                  {"PB", 1e15}, {"KIB", 1024.0},
                                                  {"MIB", 1048576.0}, {"GIB", 1073741824.0},
                                                  {"TIB", 1099511627776.0}};
  for (const auto& [u, m] : units) {
    if (unit == u) return v * m;
  }
  return Status::InvalidArgument("bad size unit in '" + text + "'");
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
    std::string model = "qwen2.5-7b", codec = "tq3", capacity = "10TB", per_gpu, json_path;
    std::string exact_tokens;
    uint64_t tokens = 10000, gpus = 0;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("--model", o->model, "Model preset")->capture_default_str();
  cmd->add_option("--tokens", o->tokens, "Tokens per session")->capture_default_str();
  cmd->add_option("--codec", o->codec, "Codec spec")->capture_default_str();
  cmd->add_option("--exact-tokens", o->exact_tokens, kExactTokensHelp);
  cmd->add_option("--capacity", o->capacity, "Storage capacity (e.g. 10TB)")->capture_default_str();
  cmd->add_option("--per-gpu", o->per_gpu, "FP16 KV storage a GPU needs today (e.g. 16TB)");
  cmd->add_option("--gpus", o->gpus, "GPUs in the cluster");
  cmd->add_flag("--json", o->json, "Print JSON");
  cmd->callback([o] {
    Status s = [&]() -> Status {
      TQKV_ASSIGN_OR_RETURN(ModelPreset preset, FindModelPreset(o->model));
      TQKV_ASSIGN_OR_RETURN(double capacity, ParseBytes(o->capacity));
      CheckpointOptions opts;
      TQKV_ASSIGN_OR_RETURN(opts.codec, ParseCodecSpec(o->codec));
      TQKV_RETURN_IF_ERROR(ApplyExactTokens(o->exact_tokens, opts));
      ThreadPool pool;
      opts.pool = &pool;
      CountingStore counter;
      auto source = MakeSyntheticSource(o->model, preset.geometry, DType::kF16, o->tokens, 1);
      TQKV_ASSIGN_OR_RETURN(CheckpointStats st, Checkpoint(*source, opts, counter, "capacity"));
      const double fp16 = static_cast<double>(st.fp16_bytes);
      const double codec = static_cast<double>(counter.committed());
      const double ratio = fp16 / codec;
      nlohmann::json j = {{"model", o->model}, {"tokens", o->tokens}, {"codec", o->codec},
                          {"exact_first", opts.exact_head}, {"exact_last", opts.exact_tail},
                          {"capacity_bytes", capacity}, {"fp16_session_bytes", st.fp16_bytes},
                          {"codec_session_bytes", counter.committed()}, {"ratio", ratio},
                          {"sessions_fp16", std::floor(capacity / fp16)},
                          {"sessions_codec", std::floor(capacity / codec)}};
      if (!o->per_gpu.empty()) {
        TQKV_ASSIGN_OR_RETURN(double per_gpu, ParseBytes(o->per_gpu));
        j["per_gpu_bytes_fp16"] = per_gpu;
        j["per_gpu_bytes_codec"] = per_gpu / ratio;
        if (o->gpus) {
          j["gpus"] = o->gpus;
          j["cluster_bytes_fp16"] = per_gpu * o->gpus;
          j["cluster_bytes_codec"] = per_gpu * o->gpus / ratio;
        }
      }
      if (o->json) {
        std::cout << j.dump(2) << "\n";
        return Status::Ok();
      }
      std::printf("%s, %llu tokens per session, codec %s (a real checkpoint, container included)\n",
                  o->model.c_str(), static_cast<unsigned long long>(o->tokens), o->codec.c_str());
      std::printf("  session size:  fp16 %s (%llu B)   %s %s (%llu B)   %.3fx smaller\n",
                  Human(fp16).c_str(), static_cast<unsigned long long>(st.fp16_bytes),
                  o->codec.c_str(), Human(codec).c_str(),
                  static_cast<unsigned long long>(counter.committed()), ratio);
      std::printf("  warm sessions in %s:  fp16 %.0f   %s %.0f\n", Human(capacity).c_str(),
                  j["sessions_fp16"].get<double>(), o->codec.c_str(), j["sessions_codec"].get<double>());
      if (j.contains("per_gpu_bytes_codec")) {
        std::printf("  storage per GPU:  %s at fp16 -> %s with %s\n",
                    Human(j["per_gpu_bytes_fp16"].get<double>()).c_str(),
                    Human(j["per_gpu_bytes_codec"].get<double>()).c_str(), o->codec.c_str());
      }
      if (j.contains("cluster_bytes_codec")) {
        std::printf("  cluster of %llu GPUs:  %s at fp16 -> %s with %s\n",
                    static_cast<unsigned long long>(o->gpus),
                    Human(j["cluster_bytes_fp16"].get<double>()).c_str(),
                    Human(j["cluster_bytes_codec"].get<double>()).c_str(), o->codec.c_str());
      }
      return Status::Ok();
    }();
    Report("capacity", s);
  });
}

}  // namespace tqkv::tools
