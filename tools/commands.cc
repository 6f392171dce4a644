#include "tools/commands.h"

#include <cstdio>

#include "tqkv/units.h"

namespace tqkv::tools {
namespace {
int g_exit_code = 0;
}  // namespace

void SetExitCode(int code) { g_exit_code = code; }
int ExitCode() { return g_exit_code; }

CLI::Validator CountIn(uint64_t min, uint64_t max) {
  return CLI::Validator(
      [min, max](std::string& text) -> std::string {
        auto v = ParseCount(text, min, max);
        return v.ok() ? std::string() : v.status().message();
      },
      "COUNT in [" + std::to_string(min) + ", " + std::to_string(max) + "]");
}

Status ApplyCodecs(const std::string& codec, const std::vector<std::string>& layer_codecs,
                   CheckpointOptions& opts) {
  TQKV_ASSIGN_OR_RETURN(const KvCodecSpec spec, ParseKvCodecSpec(codec));
  SetCodec(opts, spec);
  opts.layer_overrides.clear();
  for (const auto& lc : layer_codecs) {
    TQKV_ASSIGN_OR_RETURN(LayerCodec l, ParseLayerCodec(lc));
    opts.layer_overrides.push_back(l);
  }
  return Status::Ok();
}

Status ApplyExactTokens(const std::string& text, CheckpointOptions& opts) {
  if (text.empty()) return Status::Ok();
  TQKV_ASSIGN_OR_RETURN(const ExactTokens et, ParseExactTokens(text));
  opts.exact_head = et.head;
  opts.exact_tail = et.tail;
  return Status::Ok();
}

Status ApplyKeyMeans(const std::string& text, CheckpointOptions& opts) {
  if (text.empty()) return Status::Ok();
  TQKV_ASSIGN_OR_RETURN(const KeyMeanSetting km, ParseKeyMeans(text));
  opts.key_mean_block = km.block;
  opts.key_mean_dtype = km.dtype;
  return Status::Ok();
}

void Report(const std::string& command, const Status& status) {
  if (status.ok()) return;
  std::fprintf(stderr, "tqkv %s: %s\n", command.c_str(), status.ToString().c_str());
  SetExitCode(1);
}

void RegisterCommands(CLI::App& app) {
  RegisterSessionCommands(app);
  RegisterCapacityCommand(app);
  RegisterMigrateCommand(app);
  RegisterStoreCommands(app);
  RegisterLlamaCommands(app);
  RegisterBenchCommands(app);
}

}  // namespace tqkv::tools
