// RunMigrate: the parent side of the migration experiment (bench/migrate/migrate.h says what it
// measures); src/model/migrate_worker.cc is the restore side.
#include "bench/migrate/migrate.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "model/key_centering.h"
#include "bench/migrate/compare.h"
#include "bench/migrate/migrate_internal.h"
#include "tqkv/checkpoint.h"
#include "tqkv/settings.h"
#include "tqkv/codec.h"
#include "tqkv/kv_cache.h"
#include "tqkv/store.h"
#include "tqkv/thread_pool.h"

namespace tqkv {
namespace {

using json = nlohmann::json;
using model::LlamaEngine;
using model::Model;

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// printf-style text to the progress callback.
__attribute__((format(printf, 2, 3))) void Say(const MigrateOptions& o, const char* fmt, ...) {
  if (!o.progress) return;
  va_list ap;
  va_start(ap, fmt);
  va_list ap2;
  va_copy(ap2, ap);
  const int n = std::vsnprintf(nullptr, 0, fmt, ap);
  va_end(ap);
  std::string s(n > 0 ? static_cast<size_t>(n) : 0, '\0');
  if (n > 0) std::vsnprintf(s.data(), s.size() + 1, fmt, ap2);
  va_end(ap2);
  o.progress(s);
}

Result<std::string> ReadText(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return Status::FromErrno("open prompt file", path, errno);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

Result<std::vector<float>> ReadFloats(const std::string& path, size_t count) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return Status::FromErrno("open", path, errno);
  std::vector<float> v(count);
  f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(count * 4));
  if (static_cast<size_t>(f.gcount()) != count * 4 || f.peek() != EOF) {
    return Status::Corruption(path + ": expected " + std::to_string(count * 4) +
                              " bytes of logits from the worker");
  }
  return v;
}

std::string JoinIds(std::span<const int32_t> ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(ids[i]);
  }
  return s;
}

// ---- the rows ----

struct Row {
  std::string label;
  CheckpointOptions options;
};

Status CheckOptions(const MigrateOptions& o) {
  if (o.steps == 0) return Status::InvalidArgument("--steps must be at least 1");
  if (o.tokens == 0) return Status::InvalidArgument("--tokens must be at least 1");
  TQKV_RETURN_IF_ERROR(model::ParseActivations(o.activations).status());
  if (!o.only.empty() && o.only != "k" && o.only != "v") {
    return Status::InvalidArgument("--only takes k or v");
  }
  if (o.center_keys > 0 && !o.only.empty()) {
    return Status::InvalidArgument("--center-keys and --only do not combine");
  }
  if (o.center_keys > 0 && !o.key_means.empty()) {
    return Status::InvalidArgument("--center-keys (analysis) and --key-means do not combine");
  }
  return Status::Ok();
}

// Every codec as given; then every TurboQuant codec with the per-layer overrides; then every
// TurboQuant row so far with the exact tokens.
Result<std::vector<Row>> BuildRows(const MigrateOptions& o, std::vector<LayerCodec>& overrides) {
  std::vector<Row> rows;
  std::string override_label;
  for (const auto& text : o.layer_codecs) {
    TQKV_ASSIGN_OR_RETURN(LayerCodec lc, ParseLayerCodec(text));
    overrides.push_back(lc);
    override_label += (override_label.empty() ? "" : ",") + text;
  }
  for (const auto& text : o.codecs) {
    Row r;
    r.label = text;
    CheckpointSettings settings;  // the codec as a user of the CLI gets it, defaults included
    settings.codec = text;
    TQKV_ASSIGN_OR_RETURN(r.options, ResolveCheckpointOptions(settings));
    rows.push_back(r);
  }
  if (!overrides.empty()) {
    const size_t n = rows.size();
    for (size_t i = 0; i < n; ++i) {
      // Raw rows need no overrides; auto:B rows pick every layer themselves.
      if (!AnyLossyCodec(rows[i].options) || rows[i].options.allocate_bits > 0) {
        continue;
      }
      Row r = rows[i];
      r.label += "+" + override_label;
      r.options.layer_overrides = overrides;
      rows.push_back(r);
    }
  }
  if (!o.exact_tokens.empty()) {
    TQKV_ASSIGN_OR_RETURN(const ExactTokens et, ParseExactTokens(o.exact_tokens));
    const size_t n = rows.size();
    for (size_t i = 0; i < n; ++i) {
      if (!AnyLossyCodec(rows[i].options)) continue;
      Row r = rows[i];
      r.label += "+exact" + std::to_string(et.head) + "," + std::to_string(et.tail);
      r.options.exact_head = et.head;
      r.options.exact_tail = et.tail;
      rows.push_back(r);
    }
  }
  if (!o.key_means.empty()) {
    std::vector<Row> all;
    for (const Row& row : rows) {
      for (const std::string& text : o.key_means) {
        TQKV_ASSIGN_OR_RETURN(const KeyMeanSetting km, ParseKeyMeans(text));
        Row r = row;
        r.label += "+km" + FormatKeyMeans(km);
        r.options.key_mean_block = km.block;
        r.options.key_mean_dtype = km.dtype;
        all.push_back(r);
      }
    }
    rows = std::move(all);
  }
  if (rows.empty()) return Status::InvalidArgument("give at least one --codec");
  return rows;
}

struct Prompt {
  std::vector<int32_t> ids;
  size_t used_chars = 0;
};

// Tokenizes the shortest run of whole lines from the start of the prompt file that gives
// tokens + steps + 64 tokens (the margin keeps the tokens used away from the cut), else the whole
// text. (Merge-by-score tokenizers are quadratic in the text length; GPL-3 is 35 KB.)
Result<Prompt> TokenizePrompt(const MigrateOptions& o, const Model& m) {
  if (m.tokenizer() == nullptr) {
    return Status::InvalidArgument(o.model + " has no tokenizer (give --tokenizer)");
  }
  TQKV_ASSIGN_OR_RETURN(std::string text, ReadText(o.prompt_file));
  const model::Tokenizer& tok = *m.tokenizer();
  const uint64_t need = o.tokens + o.steps;
  Prompt p;
  for (size_t chars = std::max<size_t>(4096, need * 6);; chars *= 2) {
    size_t cut = text.size();
    if (chars < text.size()) {
      cut = text.find('\n', chars);
      cut = cut == std::string::npos ? text.size() : cut + 1;
    }
    p.ids = tok.Encode(std::string_view(text).substr(0, cut), tok.add_bos_default(),
                       /*parse_special=*/false);
    p.used_chars = cut;
    if (cut == text.size() || p.ids.size() >= need + 64) break;
  }
  if (p.ids.size() < need) {
    return Status::InvalidArgument(
        o.prompt_file + " gives " + std::to_string(p.ids.size()) + " tokens; --tokens " +
        std::to_string(o.tokens) + " + --steps " + std::to_string(o.steps) + " needs " +
        std::to_string(need) + " (use a longer prompt or fewer tokens; the text is not repeated)");
  }
  if (need > m.config().context_length) {
    return Status::InvalidArgument("--tokens + --steps = " + std::to_string(need) +
                                   " exceeds the model's context length " +
                                   std::to_string(m.config().context_length));
  }
  return p;
}

// The uncompressed original: its cache after the prefix and its teacher-forced logits.
struct Reference {
  std::unique_ptr<KvCacheBuffer> original;  // kept while the reference engine runs on past it
  std::vector<float> logits;                // steps x vocab
  std::vector<double> margins;              // top-1 minus top-2 logit per step: near a tie?
  uint32_t top1_vs_prompt = 0, top1_vs_prompt_steps = 0;
};

Result<Reference> RunReference(const MigrateOptions& o, const Model& m,
                               const std::vector<int32_t>& ids, ThreadPool& pool) {
  model::EngineOptions eo;
  eo.pool = &pool;
  eo.max_tokens = static_cast<uint32_t>(o.tokens + o.steps);
  TQKV_ASSIGN_OR_RETURN(eo.activations, model::ParseActivations(o.activations));
  TQKV_ASSIGN_OR_RETURN(std::unique_ptr<LlamaEngine> engine, LlamaEngine::Create(m, eo));
  const std::span<const int32_t> prefix(ids.data(), o.tokens);
  const std::span<const int32_t> feed(ids.data() + o.tokens, o.steps);

  Reference ref;
  double t = Now();
  TQKV_RETURN_IF_ERROR(engine->Prefill(prefix).status().WithContext("prefill"));
  Say(o, "migrate: reference prefill of %llu tokens: %.1f s\n",
      static_cast<unsigned long long>(o.tokens), Now() - t);
  TQKV_ASSIGN_OR_RETURN(ref.original, engine->ExportCache());
  t = Now();
  TQKV_ASSIGN_OR_RETURN(ref.logits, model::TeacherForce(*engine, feed));
  Say(o, "migrate: reference teacher-forced %u steps: %.1f s\n", o.steps, Now() - t);
  engine.reset();
  const size_t vocab = m.config().vocab_size;
  ref.margins = Margins(ref.logits, o.steps, vocab);
  // How often the reference itself predicts the prompt's next token (context for the figures).
  for (uint32_t i = 0; i < o.steps; ++i) {
    if (o.tokens + i + 1 >= ids.size()) break;
    ++ref.top1_vs_prompt_steps;
    if (model::ArgMax({ref.logits.data() + i * vocab, vocab}) == ids[o.tokens + i + 1]) {
      ++ref.top1_vs_prompt;
    }
  }
  return ref;
}

// What every row shares.
struct Experiment {
  const MigrateOptions& o;
  const Model& m;
  Store& store;
  ThreadPool& pool;
  const Reference& ref;
  std::vector<std::string> worker;  // argv before the worker options
  std::string logits_path, feed_ids;
  size_t rows = 0;
};

// Checkpoints the row's codec under `key`. The analyses then replace the object with a lossless
// fp16 checkpoint of what the worker must see: mean-removed keys (the codec sees the residual,
// the worker gets the residual's restore plus the means) or --only's hybrid (the codec's K or V
// with the original V or K).
Result<CheckpointStats> CheckpointRow(const Experiment& x, const Row& row, const std::string& key,
                                      model::KeyCentering* centering) {
  const MigrateOptions& o = x.o;
  const ModelGeometry geo = x.m.geometry();
  const KvCache& original = x.ref.original->cache();
  CheckpointOptions copts = row.options;
  copts.pool = &x.pool;
  CheckpointOptions fp16;
  fp16.pool = &x.pool;
  RestoreOptions ro;
  ro.pool = &x.pool;
  const bool center = centering != nullptr;
  if (center) copts.key_mean_block = 0;  // the analysis centers on its own
  std::unique_ptr<KvCacheBuffer> residual;
  if (center) {
    TQKV_ASSIGN_OR_RETURN(residual,
                          KvCacheBuffer::Allocate(x.m.name(), geo, DType::kF16, o.tokens));
    TQKV_ASSIGN_OR_RETURN(*centering,
                          model::CenterKeys(original, o.center_keys, residual->cache()));
  }
  TQKV_ASSIGN_OR_RETURN(CheckpointStats cs,
                        Checkpoint(center ? residual->cache() : original, copts, x.store, key));
  if (center) {
    cs.bytes_written += centering->StoredBits() / 8;  // means and coefficients, 16 bits each
    TQKV_ASSIGN_OR_RETURN(auto restored_residual,
                          KvCacheBuffer::Allocate(x.m.name(), geo, DType::kF16, o.tokens));
    TQKV_RETURN_IF_ERROR(RestoreInto(x.store, key, restored_residual->cache(), ro));
    TQKV_RETURN_IF_ERROR(model::UncenterKeys(*centering, restored_residual->cache()));
    TQKV_RETURN_IF_ERROR(Checkpoint(restored_residual->cache(), fp16, x.store, key).status());
    Say(o, "migrate: %s: keys centered over %u-token blocks, residual energy %.4f of the keys'\n",
        row.label.c_str(), o.center_keys, centering->energy_fraction);
  }
  if (!o.only.empty()) {
    TQKV_ASSIGN_OR_RETURN(auto hybrid,
                          KvCacheBuffer::Allocate(x.m.name(), geo, DType::kF16, o.tokens));
    TQKV_RETURN_IF_ERROR(RestoreInto(x.store, key, hybrid->cache(), ro));
    const int keep_kv = o.only == "k" ? 1 : 0;  // the tensor taken from the original
    for (uint32_t l = 0; l < geo.layers; ++l) {
      std::memcpy(hybrid->cache().tensor(l, keep_kv), original.tensor(l, keep_kv),
                  original.tensor_bytes());
    }
    TQKV_RETURN_IF_ERROR(Checkpoint(hybrid->cache(), fp16, x.store, key).status());
  }
  return cs;
}

// Per-layer mean cosine of the stored session (restored in fp16, as the worker imported it)
// against the original cache.
Status LayerCosines(const Experiment& x, const std::string& key, MigrateRow& out) {
  const ModelGeometry geo = x.m.geometry();
  const KvCache& original = x.ref.original->cache();
  const uint64_t vectors = x.o.tokens * geo.kv_heads;
  TQKV_ASSIGN_OR_RETURN(auto restored,
                        KvCacheBuffer::Allocate(x.m.name(), geo, DType::kF16, x.o.tokens));
  RestoreOptions ro;
  ro.pool = &x.pool;
  TQKV_RETURN_IF_ERROR(RestoreInto(x.store, key, restored->cache(), ro));
  double ksum = 0, vsum = 0;
  for (uint32_t l = 0; l < geo.layers; ++l) {
    const double kc =
        MeanCosine(static_cast<const uint16_t*>(original.k(l)),
                   static_cast<const uint16_t*>(restored->cache().k(l)), vectors, geo.head_dim);
    const double vc =
        MeanCosine(static_cast<const uint16_t*>(original.v(l)),
                   static_cast<const uint16_t*>(restored->cache().v(l)), vectors, geo.head_dim);
    out.k_cosine_per_layer.push_back(kc);
    out.v_cosine_per_layer.push_back(vc);
    ksum += kc;
    vsum += vc;
  }
  out.k_cosine_mean = ksum / geo.layers;
  out.v_cosine_mean = vsum / geo.layers;
  return Status::Ok();
}

// One row: checkpoint, the worker's restore and steps, the comparison.
Result<MigrateRow> MeasureRow(const Experiment& x, const Row& row, size_t r) {
  const MigrateOptions& o = x.o;
  const ModelGeometry geo = x.m.geometry();
  const size_t vocab = x.m.config().vocab_size;
  const std::string key = "migrate-" + std::to_string(::getpid()) + "-" + std::to_string(r);
  const bool center = o.center_keys > 0 && AnyLossyCodec(row.options);
  model::KeyCentering centering;
  double t0 = Now();
  TQKV_ASSIGN_OR_RETURN(const CheckpointStats cs,
                        CheckpointRow(x, row, key, center ? &centering : nullptr));
  MigrateRow out;
  out.bits_per_value = 8.0 * static_cast<double>(cs.bytes_written) /
                       (2.0 * geo.layers * static_cast<double>(o.tokens) * geo.token_elems());
  out.checkpoint_bytes = cs.bytes_written;
  for (const TensorCodecError& e : cs.codec_error) out.guard_rel_err.push_back(RelativeError(e));
  if (!cs.allocated.empty()) {
    std::string chosen;
    for (size_t l = 0; l < cs.allocated.size(); ++l) {
      out.allocated.push_back(JoinKvLabels(cs.allocated[l][0], cs.allocated[l][1]));
      chosen += " " + std::to_string(l) + ":" + out.allocated.back();
    }
    Say(o, "migrate: %s: allocated%s\n", row.label.c_str(), chosen.c_str());
  }
  Say(o, "migrate: [%zu/%zu] %s: checkpoint %llu bytes (%.3f bits/value) %.1f s", r + 1, x.rows,
      row.label.c_str(), static_cast<unsigned long long>(cs.bytes_written), out.bits_per_value,
      Now() - t0);
  t0 = Now();
  ::unlink(x.logits_path.c_str());
  std::vector<std::string> args = x.worker;
  for (const std::string& a :
       {std::string("--model"), o.model, std::string("--store"), o.store, std::string("--session"),
        key, std::string("--tokens"), std::to_string(o.tokens), std::string("--feed"), x.feed_ids,
        std::string("--logits-out"), x.logits_path, std::string("--threads"),
        std::to_string(o.threads), std::string("--activations"), o.activations}) {
    args.push_back(a);
  }
  if (!o.tokenizer.empty()) {
    args.push_back("--tokenizer");
    args.push_back(o.tokenizer);
  }
  TQKV_RETURN_IF_ERROR(model::RunChild(args).WithContext(row.label));
  TQKV_ASSIGN_OR_RETURN(std::vector<float> got, ReadFloats(x.logits_path, o.steps * vocab));
  Say(o, ", worker (restore + %u steps) %.1f s\n", o.steps, Now() - t0);
  const LogitStats ls = CompareLogits(x.ref.logits, got, o.steps, vocab);
  TQKV_RETURN_IF_ERROR(LayerCosines(x, key, out));
  if (!o.keep) TQKV_RETURN_IF_ERROR(x.store.Remove(key));

  out.codec = row.label + (o.only.empty() ? "" : " (" + o.only + " only)");
  if (center) out.codec += " (keys centered/" + std::to_string(o.center_keys) + ")";
  out.top1 = ls.top1;
  out.kl_mean = ls.kl_mean;
  out.kl_max = ls.kl_max;
  out.max_logit_diff = ls.max_logit_diff;
  out.exact_head = std::min<uint64_t>(row.options.exact_head, o.tokens);
  out.exact_tail = std::min<uint64_t>(row.options.exact_tail, o.tokens - out.exact_head);
  out.kl_per_step = ls.kl;
  out.disagree_steps = ls.disagree;
  for (uint32_t d : ls.disagree) out.disagree_ref_margins.push_back(x.ref.margins[d]);
  if (center) {
    out.center_keys_block = o.center_keys;
    out.key_residual_energy = centering.energy_fraction;
  }
  return out;
}

}  // namespace

Result<MigrateReport> RunMigrate(const MigrateOptions& o) {
  TQKV_RETURN_IF_ERROR(CheckOptions(o));
  std::vector<LayerCodec> overrides;
  TQKV_ASSIGN_OR_RETURN(const std::vector<Row> rows, BuildRows(o, overrides));
  TQKV_ASSIGN_OR_RETURN(std::unique_ptr<Model> m, model::LoadMigrateModel(o.model, o.tokenizer));
  const model::LlamaConfig& cfg = m->config();
  for (const auto& lc : overrides) {
    if (lc.layer >= cfg.n_layers) {
      return Status::InvalidArgument("--layer-codec layer " + std::to_string(lc.layer) +
                                     " out of range: the model has " +
                                     std::to_string(cfg.n_layers) + " layers");
    }
  }
  TQKV_ASSIGN_OR_RETURN(const Prompt prompt, TokenizePrompt(o, *m));
  Say(o,
      "migrate: %s (%u layers, %u KV heads, head_dim %u), prompt %s: %zu tokens from its first "
      "%zu bytes, prefix %llu + %u teacher-forced steps\n",
      m->name().c_str(), cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, o.prompt_file.c_str(),
      prompt.ids.size(), prompt.used_chars, static_cast<unsigned long long>(o.tokens), o.steps);

  ThreadPool pool(o.threads);
  TQKV_ASSIGN_OR_RETURN(const Reference ref, RunReference(o, *m, prompt.ids, pool));
  TQKV_ASSIGN_OR_RETURN(std::unique_ptr<Store> store, OpenStore(o.store));
  std::vector<std::string> worker = o.worker_command;
  if (worker.empty()) {
    TQKV_ASSIGN_OR_RETURN(std::string self, model::SelfExe());
    worker = {self, "migrate-worker"};
  }
  char tmpl[] = "/tmp/tqkv-migrate-XXXXXX";
  const char* tmpdir = ::mkdtemp(tmpl);
  if (tmpdir == nullptr) return Status::FromErrno("mkdtemp", tmpl, errno);
  const Experiment x{o,
                     *m,
                     *store,
                     pool,
                     ref,
                     worker,
                     std::string(tmpdir) + "/logits.f32",
                     JoinIds({prompt.ids.data() + o.tokens, o.steps}),
                     rows.size()};

  MigrateReport report;
  Status status = Status::Ok();
  for (size_t r = 0; r < rows.size() && status.ok(); ++r) {
    Result<MigrateRow> row = MeasureRow(x, rows[r], r);
    if (row.ok()) {
      report.results.push_back(std::move(*row));
    } else {
      status = row.status();
    }
  }
  ::unlink(x.logits_path.c_str());
  ::rmdir(tmpdir);
  TQKV_RETURN_IF_ERROR(status);

  const ModelGeometry geo = m->geometry();
  report.model = m->name();
  report.model_file = o.model;
  report.prompt_source = o.prompt_file;
  report.activations = o.activations;
  report.prompt_tokens = o.tokens;
  report.prompt_chars_tokenized = prompt.used_chars;
  report.steps = o.steps;
  report.head_dim = geo.head_dim;
  report.layers = geo.layers;
  report.kv_heads = geo.kv_heads;
  report.reference_top1_vs_prompt = ref.top1_vs_prompt;
  report.reference_top1_vs_prompt_steps = ref.top1_vs_prompt_steps;
  report.reference_margin_per_step = ref.margins;
  return report;
}

std::string MigrateReportJson(const MigrateReport& report) {
  json results = json::array();
  for (const MigrateRow& r : report.results) {
    results.push_back({{"codec", r.codec},
                       {"top1", r.top1},
                       {"kl_mean", r.kl_mean},
                       {"kl_max", r.kl_max},
                       {"max_logit_diff", r.max_logit_diff},
                       {"k_cosine_mean", r.k_cosine_mean},
                       {"v_cosine_mean", r.v_cosine_mean},
                       {"bits_per_value", r.bits_per_value},
                       {"checkpoint_bytes", r.checkpoint_bytes},
                       {"exact_first", r.exact_head},
                       {"exact_last", r.exact_tail},
                       {"k_cosine_per_layer", r.k_cosine_per_layer},
                       {"v_cosine_per_layer", r.v_cosine_per_layer},
                       {"kl_per_step", r.kl_per_step},
                       {"disagree_steps", r.disagree_steps},
                       {"disagree_ref_margins", r.disagree_ref_margins}});
    if (!r.guard_rel_err.empty()) results.back()["guard_rel_err"] = r.guard_rel_err;
    if (!r.allocated.empty()) results.back()["allocated"] = r.allocated;
    if (r.center_keys_block > 0) {
      results.back()["center_keys_block"] = r.center_keys_block;
      results.back()["key_residual_energy"] = r.key_residual_energy;
    }
  }
  const json j = {{"model", report.model},
                  {"model_file", report.model_file},
                  {"prompt_source", report.prompt_source},
                  {"prompt_tokens", report.prompt_tokens},
                  {"prompt_chars_tokenized", report.prompt_chars_tokenized},
                  {"steps", report.steps},
                  {"activations", report.activations},
                  {"head_dim", report.head_dim},
                  {"layers", report.layers},
                  {"kv_heads", report.kv_heads},
                  {"reference_top1_vs_prompt", report.reference_top1_vs_prompt},
                  {"reference_top1_vs_prompt_steps", report.reference_top1_vs_prompt_steps},
                  {"reference_margin_per_step", report.reference_margin_per_step},
                  {"results", results}};
  // The model name is bytes from the file; JSON must be UTF-8 (invalid bytes become U+FFFD).
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace tqkv
