#include "tools/commands.h"

#include <cstdio>

#include "tqkv/units.h"

namespace tqkv::tools {

void SettingsFlags::Add(CLI::App* cmd, bool guard) {
  CheckpointSettings* s = &settings;
  cmd->add_option_function<std::string>(
      "--codec", [s](const std::string& v) { s->codec = v; },
      "Codec spec: fp16, tq2, tq3, tq4, tq2.5, tq3.5, kl:2.5, k4v2, auto:B[,from=kl|all], ... (default " +
          std::string(kDefaultCodec) + ")");
  OneValuePerUse(
      cmd->add_option("--layer-codec", s->layer_codecs, "Per-layer override L:SPEC (repeatable)"));
  cmd->add_option_function<std::string>(
      "--exact-tokens", [s](const std::string& v) { s->exact_tokens = v; }, kExactTokensHelp);
  cmd->add_option_function<std::string>(
      "--key-means", [s](const std::string& v) { s->key_means = v; }, kKeyMeansHelp);
  cmd->add_option_function<uint64_t>(
      "--align", [s](uint64_t v) { s->alignment = v; }, kAlignHelp);
  if (guard) {
    cmd->add_flag_callback("--strict", [s] { s->strict = true; }, kStrictHelp);
    cmd->add_flag_callback("--no-guard", [s] { s->guard = false; }, kNoGuardHelp);
  }
}

nlohmann::json SettingsFlags::Json(const CheckpointOptions& resolved) const {
  const ResolvedSettings r = DescribeSettings(settings, resolved);
  return {{"codec", r.codec},       {"layer_codecs", r.layer_codecs}, {"exact_tokens", r.exact_tokens},
          {"key_means", r.key_means}, {"strict", r.strict},             {"guard", r.guard},
          {"alignment", r.alignment}};
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
    const uint32_t version = ContainerVersionFor(h);
    if (version < 6) {
      std::printf("guard       not recorded (format version %u; recorded from version 6)\n",
                  version);
    } else {  // version 7 without figures: raw codecs, or --no-guard
      std::printf("guard       not recorded (raw codecs or --no-guard)\n");
    }
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

void RegisterCommands(CLI::App& app) {
  RegisterSessionCommands(app);
  RegisterCapacityCommand(app);
  RegisterStoreCommands(app);
  RegisterLlamaCommands(app);
}

}  // namespace tqkv::tools
