// The migration experiment (`tqkv-bench migrate`): does a KV cache that went through a codec, a store
// and a fresh process continue a real transformer as the uncompressed original does?
//
//   1. The reference engine prefills the first `tokens` prompt tokens (batched), then
//      teacher-forces the next `steps` prompt tokens one by one: step i feeds prompt token N+i and
//      records the logits predicting token N+i+1. Every step's distribution depends on the cache.
//   2. For each codec (and each TurboQuant codec with the per-layer overrides, and with the exact
//      tokens, as rows of their own): the prefill's fp16 cache is checkpointed to the store; a
//      separate process (fork + exec of `worker_command`, nothing shared in memory) loads the
//      model itself, restores the session with RestoreInto into an fp16 KvCache, imports it into
//      a fresh engine, feeds the same tokens and writes its logits to a file (RunMigrateWorker).
//   3. The parent compares the logits (top-1 agreement, KL(ref || restored), max |logit diff|)
//      and computes per-layer K/V cosine by restoring the same object in-process (fp16, exactly
//      what the worker imported) against the original cache.
// The prompt must hold at least tokens + steps tokens, else InvalidArgument (no text is
// repeated). Activations "f32" run both engines with fp32 activations against the quantized
// weights (dequantized in registers); "q8" quantizes activations to q8 blocks before each matmul
// like llama.cpp, which makes logits a step function of the cache (docs/lab/accuracy-log.md).
// An experiment (CMake target tqkv_migrate, over the reference engine tqkv_model): never part of
// the installed library.
#ifndef TQKV_BENCH_MIGRATE_MIGRATE_H_
#define TQKV_BENCH_MIGRATE_MIGRATE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "tqkv/status.h"

namespace tqkv {

struct MigrateOptions {
  std::string model;        // GGUF or llama2.c .bin
  std::string tokenizer;    // llama2.c tok512.bin; empty: the model's own
  std::string prompt_file;  // text; its first lines are tokenized
  std::string store;        // store URI (OpenStore) the checkpoints go through
  std::vector<std::string> codecs;        // codec specs, one row each
  std::vector<std::string> layer_codecs;  // "L:SPEC": extra rows, one per TurboQuant codec
  std::string exact_tokens;               // "FIRST,LAST": extra rows, one per TurboQuant row
  // Key-mean settings (ParseKeyMeans: "off", "128", "session"...): every row once per setting,
  // labelled "+km<setting>"; empty: the checkpoint default only.
  std::vector<std::string> key_means;
  uint64_t tokens = 2000;   // prefix tokens in the checkpointed cache
  uint32_t steps = 50;      // teacher-forced steps after the prefix
  size_t threads = 0;       // 0: all cores
  std::string activations = "f32";  // "f32" or "q8"
  bool keep = false;        // keep the checkpoints in the store
  std::string only;         // analysis: "k" or "v", the codec touches only K (or only V)
  uint32_t center_keys = 0; // analysis: mean-removed keys over blocks of this many tokens
  // The worker process: argv before the worker options (see MigrateWorkerOptions); empty:
  // {this executable, "migrate-worker"}, tqkv-bench's hidden subcommand.
  std::vector<std::string> worker_command;
  // Progress text (the stderr lines of `tqkv-bench migrate`); null: quiet.
  std::function<void(std::string_view)> progress;
};

struct MigrateRow {
  std::string codec;  // the row's label, e.g. "tq3", "tq3+0:tq4", "tq4+exact4,128"
  uint32_t top1 = 0;  // steps whose argmax equals the reference's
  double kl_mean = 0, kl_max = 0, max_logit_diff = 0;
  double k_cosine_mean = 0, v_cosine_mean = 0;
  double bits_per_value = 0;
  uint64_t checkpoint_bytes = 0;
  uint64_t exact_head = 0, exact_tail = 0;  // clamped to the prefix (JSON exact_first/_last)
  std::vector<double> k_cosine_per_layer, v_cosine_per_layer, kl_per_step;
  std::vector<uint32_t> disagree_steps;
  std::vector<double> disagree_ref_margins;  // the reference's top-1 - top-2 at those steps
  uint32_t center_keys_block = 0;            // when keys were centered, else 0
  double key_residual_energy = 0;
  // The guard's figures of the checkpoint (docs/codec.md §9): RelativeError per layer, K then V.
  std::vector<double> guard_rel_err;
  std::vector<std::string> allocated;  // auto:B rows: the codec chosen per layer ("k4v2")
};

struct MigrateReport {
  std::string model, model_file, prompt_source, activations;
  uint64_t prompt_tokens = 0, prompt_chars_tokenized = 0;
  uint32_t steps = 0, head_dim = 0, layers = 0, kv_heads = 0;
  // How often the reference predicts the prompt's next token, over how many steps.
  uint32_t reference_top1_vs_prompt = 0, reference_top1_vs_prompt_steps = 0;
  std::vector<double> reference_margin_per_step;  // top-1 - top-2 logit of the reference
  std::vector<MigrateRow> results;
};

Result<MigrateReport> RunMigrate(const MigrateOptions& options);

// The report as JSON text (2-space indented, keys sorted): what `tqkv-bench migrate --json` writes.
std::string MigrateReportJson(const MigrateReport& report);

// The restore side, in its own process: the options RunMigrate passes on the worker's command
// line as --model, --tokenizer, --store, --session, --tokens, --feed, --logits-out, --threads
// and --activations.
struct MigrateWorkerOptions {
  std::string model, tokenizer, store, session;
  std::string feed;        // token ids, comma-separated
  std::string logits_out;  // file for feed.size() x vocab f32 logits
  uint64_t tokens = 0;
  size_t threads = 0;
  std::string activations = "f32";
};
Status RunMigrateWorker(const MigrateWorkerOptions& options);

}  // namespace tqkv

#endif  // TQKV_BENCH_MIGRATE_MIGRATE_H_
