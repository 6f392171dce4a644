// `tqkv-bench migrate`: the migration experiment (bench/migrate/migrate.h): options, the library
// call, the table and the JSON.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "bench/commands.h"
#include "cli/cli_common.h"

#ifdef TQKV_HAVE_MODEL
#include "bench/migrate/migrate.h"
#endif

namespace tqkv::tools {

#ifdef TQKV_HAVE_MODEL
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct MigrateFlags {
  MigrateOptions options;
  std::string json_path;
};

void PrintTable(const MigrateReport& r) {
  std::printf("%s, prompt %s: %llu prefix tokens, %u teacher-forced steps, %s activations "
              "(reference predicts the prompt's next token %u/%u)\n",
              r.model.c_str(), r.prompt_source.c_str(),
              static_cast<unsigned long long>(r.prompt_tokens), r.steps, r.activations.c_str(),
              r.reference_top1_vs_prompt, r.reference_top1_vs_prompt_steps);
  std::printf("%-40s %7s %11s %11s %10s %9s %9s %9s\n", "codec", "top1", "kl_mean", "kl_max",
              "max_dlogit", "k_cos", "v_cos", "bits/val");
  for (const MigrateRow& row : r.results) {
    char top[32];
    std::snprintf(top, sizeof top, "%u/%u", row.top1, r.steps);
    std::printf("%-40s %7s %11.3e %11.3e %10.4f %9.6f %9.6f %9.3f\n", row.codec.c_str(), top,
                row.kl_mean, row.kl_max, row.max_logit_diff, row.k_cosine_mean, row.v_cosine_mean,
                row.bits_per_value);
  }
}

Status Migrate(const MigrateFlags& f) {
  const double t_start = Now();
  MigrateOptions o = f.options;
  o.progress = [](std::string_view text) { std::fwrite(text.data(), 1, text.size(), stderr); };
  TQKV_ASSIGN_OR_RETURN(const MigrateReport report, RunMigrate(o));
  PrintTable(report);
  std::fprintf(stderr, "migrate: total %.1f s\n", Now() - t_start);
  if (f.json_path.empty()) return Status::Ok();
  const std::string json = MigrateReportJson(report);
  if (f.json_path == "-") {
    std::cout << json << "\n";
    return Status::Ok();
  }
  std::ofstream out(f.json_path, std::ios::trunc);
  out << json << "\n";
  out.close();
  if (!out) return Status::IoError("cannot write " + f.json_path);
  return Status::Ok();
}

}  // namespace

void RegisterMigrateCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "migrate",
      "Checkpoint a real model's KV cache with codecs, restore it in a fresh process and compare "
      "the teacher-forced next-token distributions with the uncompressed original");
  auto flags = std::make_shared<MigrateFlags>();
  MigrateOptions* o = &flags->options;
  cmd->add_option("--model", o->model, "Model file (GGUF or llama2.c .bin)")->required();
  cmd->add_option("--tokenizer", o->tokenizer, "Tokenizer file (llama2.c tok512.bin)");
  cmd->add_option("--prompt-file", o->prompt_file, "Prompt text (e.g. /usr/share/common-licenses/GPL-3)")
      ->required();
  cmd->add_option("--tokens", o->tokens, "Prefix tokens in the checkpointed cache")
      ->capture_default_str();
  cmd->add_option("--steps", o->steps, "Teacher-forced steps after the prefix")
      ->capture_default_str();
  OneValuePerUse(
      cmd->add_option("--codec", o->codecs, "Codec spec (repeatable: fp16, tq2, tq2.5, tq3, ...)"))
      ->required();
  OneValuePerUse(cmd->add_option("--layer-codec", o->layer_codecs,
                                 "Per-layer override L:SPEC (repeatable); measured as extra rows, "
                                 "one per TurboQuant --codec"));
  cmd->add_option("--store", o->store, kStoreUriHelp)->required();
  cmd->add_option("--threads", o->threads, "Threads (0: all cores)");
  cmd->add_option("--activations", o->activations,
                  "Activation precision of quantized matmuls: f32 (default; weights dequantized "
                  "in registers) or q8 (activations quantized to q8 blocks, like llama.cpp)");
  cmd->add_option("--json", flags->json_path, "Write the results as JSON to FILE ('-' for stdout)");
  cmd->add_flag("--keep", o->keep, "Keep the checkpoints in the store");
  cmd->add_option("--only", o->only,
                  "Analysis: apply the codec to K only (k) or V only (v); the other tensor stays "
                  "exact (the hybrid travels as a lossless fp16 checkpoint)");
  cmd->add_option("--center-keys", o->center_keys,
                  "Analysis: encode keys minus their per-head mean over blocks of N tokens "
                  "(scaled per vector), add it back on restore; the means and coefficients "
                  "count at 16 bits each (docs/lab/accuracy-log.md)");
  OneValuePerUse(cmd->add_option("--key-means", o->key_means,
                                 std::string(kKeyMeansHelp) + "; repeatable: every row once per setting"));
  cmd->add_option("--exact-tokens", o->exact_tokens,
                  std::string(kExactTokensHelp) + "; applies to the TurboQuant rows");
  cmd->callback([flags] { Report("migrate", Migrate(*flags)); });

  auto* worker = app.add_subcommand("migrate-worker", "Restore side of migrate (internal)");
  worker->group("");
  auto w = std::make_shared<MigrateWorkerOptions>();
  worker->add_option("--model", w->model)->required();
  worker->add_option("--tokenizer", w->tokenizer);
  worker->add_option("--store", w->store)->required();
  worker->add_option("--session", w->session)->required();
  worker->add_option("--tokens", w->tokens)->required();
  worker->add_option("--feed", w->feed)->required();
  worker->add_option("--logits-out", w->logits_out)->required();
  worker->add_option("--threads", w->threads);
  worker->add_option("--activations", w->activations);
  worker->callback([w] { Report("migrate-worker", RunMigrateWorker(*w)); });
}

#else  // !TQKV_HAVE_MODEL

void RegisterMigrateCommand(CLI::App&) {}

#endif  // TQKV_HAVE_MODEL

}  // namespace tqkv::tools
