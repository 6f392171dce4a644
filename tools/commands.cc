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
  ExactTokens et = DefaultExactTokens(opts);  // "": the default for the codecs set
  if (!text.empty()) {
    TQKV_ASSIGN_OR_RETURN(et, ParseExactTokens(text));
  }
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

void PrintGuardReport(const CheckpointStats& st, const CheckpointOptions& options) {
  const double threshold = options.guard_threshold;
  if (!st.allocated.empty()) {
    std::printf("allocated for %g bits/value:", options.allocate_bits);
    for (size_t l = 0; l < st.allocated.size(); ++l) {
      std::printf(" %zu:%s", l, JoinKvLabels(st.allocated[l][0], st.allocated[l][1]).c_str());
    }
    std::printf("\n");
  }
  if (st.guard_stride == 0) return;
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < st.codec_error.size(); ++i) {
    const double r = RelativeError(st.codec_error[i]);
    if (!(r <= worst)) worst = r, at = i;
  }
  std::printf("guard: codec error / varying energy at most %s (layer %zu %s; every %u%s token, "
              "%.3f s), threshold %s: %s\n",
              FormatGuardFigure(worst).c_str(), at / 2, at % 2 ? "V" : "K", st.guard_stride,
              st.guard_stride == 1 ? "" : "th", st.guard_seconds,
              FormatGuardFigure(threshold).c_str(),
              st.guard_exceeded.empty() ? "ok" : "EXCEEDED");
  for (uint32_t i : st.guard_exceeded) {
    std::fprintf(stderr,
                 "warning: guard: layer %u %s: the codec's error is %s of the part of the vectors "
                 "that varies (threshold %s): this layer will decode to noise; use the default "
                 "key means, more bits, or --layer-codec %u:SPEC (--strict refuses)\n",
                 i / 2, i % 2 ? "V" : "K", FormatGuardFigure(RelativeError(st.codec_error[i])).c_str(),
                 FormatGuardFigure(threshold).c_str(), i / 2);
  }
}

void PrintGuardTable(const ContainerHeader& h) {
  if (h.guard_stride == 0) {
    std::printf("guard       not recorded (format version %u; recorded from version 6)\n",
                ContainerVersionFor(h));
    return;
  }
  const auto exceeded = GuardExceeded(h.codec_error, kGuardThreshold);
  std::printf("guard       codec error / varying energy per layer, every %u%s token; threshold %s: "
              "%s\n",
              h.guard_stride, h.guard_stride == 1 ? "" : "th",
              FormatGuardFigure(kGuardThreshold).c_str(),
              exceeded.empty() ? "ok"
                               : ("EXCEEDED in " + DescribeGuardExceeded(h.codec_error, exceeded,
                                                                         kGuardThreshold))
                                     .c_str());
  std::printf("            %-6s %-10s %-9s %-10s %-9s\n", "layer", "K err/var", "K shared",
              "V err/var", "V shared");
  for (size_t l = 0; l < h.codec_error.size() / 2; ++l) {
    const TensorCodecError& k = h.codec_error[2 * l];
    const TensorCodecError& v = h.codec_error[2 * l + 1];
    std::printf("            %-6zu %-10s %-9.4f %-10s %-9.4f\n", l,
                FormatGuardFigure(RelativeError(k)).c_str(), SharedFraction(k),
                FormatGuardFigure(RelativeError(v)).c_str(), SharedFraction(v));
  }
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
