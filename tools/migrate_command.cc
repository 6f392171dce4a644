// `tqkv migrate`: measures whether a KV cache that went through a codec, a store and a fresh
// process continues a real transformer as the uncompressed original does.
//
//   1. The reference engine prefills the first N prompt tokens (batched), then teacher-forces the
//      next `steps` prompt tokens one by one: step i feeds prompt token N+i and records the
//      logits predicting token N+i+1. Every step's distribution depends on the N-token cache.
//   2. For each codec (and each codec with the --layer-codec overrides, as its own row): the
//      prefill's fp16 cache (engine->CacheView()) is checkpointed to the store; a separate process
//      (this binary, hidden subcommand `migrate-worker`: fork + exec, nothing shared in memory)
//      loads the model itself, restores the session with RestoreInto into an fp16 KvCache,
//      imports it into a fresh engine, feeds the same tokens and writes its logits to a file.
//   3. The parent compares the logits (top-1 agreement, KL(ref || restored), max |logit diff|)
//      and computes per-layer K/V cosine by restoring the same object in-process (fp16, exactly
//      what the worker imported) against the original cache.
// The prompt must hold at least N + steps tokens, else the command fails (no text is repeated).
// --activations f32 (the default) runs both engines with fp32 activations against the quantized
// weights (dequantized in registers); q8 quantizes activations to q8 blocks before each matmul
// like llama.cpp, which makes logits a step function of the cache (see docs/accuracy.md).
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tools/commands.h"
#include "tqkv/checkpoint.h"
#include "tqkv/codec.h"
#include "tqkv/kv_cache.h"
#include "tqkv/store.h"
#include "tqkv/thread_pool.h"
#include "tqkv/types.h"

#ifdef TQKV_HAVE_MODEL
#include "model/engine.h"
#include "model/key_centering.h"
#include "model/model.h"
#endif

namespace tqkv::tools {

#ifdef TQKV_HAVE_MODEL
namespace {

using json = nlohmann::json;
using model::LlamaEngine;
using model::Model;

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

Result<std::unique_ptr<Model>> LoadModel(const std::string& path, const std::string& tokenizer) {
  model::ModelLoadOptions lo;
  lo.tokenizer_path = tokenizer;
  return Model::Load(path, lo);
}

Result<std::string> ReadText(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return Status::FromErrno("open prompt file", path, errno);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Logits of `steps` teacher-forced tokens after the engine's current cache.
Result<std::vector<float>> TeacherForce(LlamaEngine& engine, std::span<const int32_t> feed) {
  std::vector<float> all;
  for (int32_t t : feed) {
    TQKV_ASSIGN_OR_RETURN(std::vector<float> logits, engine.Forward(t));
    all.insert(all.end(), logits.begin(), logits.end());
  }
  return all;
}

Status WriteFloats(const std::string& path, const std::vector<float>& v) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
  f.close();
  if (!f) return Status::IoError("cannot write " + path);
  return Status::Ok();
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

Result<std::vector<int32_t>> ParseIds(const std::string& text) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find(',', pos);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(pos, end - pos);
    char* stop = nullptr;
    const long v = std::strtol(item.c_str(), &stop, 10);
    if (item.empty() || *stop != '\0' || v < 0 || v > std::numeric_limits<int32_t>::max()) {
      return Status::InvalidArgument("bad token id '" + item + "'");
    }
    ids.push_back(static_cast<int32_t>(v));
    pos = end + 1;
  }
  return ids;
}

// ---- comparison ----

// log-softmax in double.
std::vector<double> LogSoftmax(const float* x, size_t n) {
  double mx = -std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < n; ++i) mx = std::max(mx, static_cast<double>(x[i]));
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(x[i]) - mx);
  const double lse = mx + std::log(sum);
  std::vector<double> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<double>(x[i]) - lse;
  return out;
}

struct LogitStats {
  uint32_t top1 = 0;
  double kl_mean = 0, kl_max = 0, max_logit_diff = 0;
  std::vector<double> kl;  // per step
  std::vector<uint32_t> disagree;  // steps whose argmax differs
};

LogitStats CompareLogits(const std::vector<float>& ref, const std::vector<float>& got, size_t steps,
                         size_t vocab) {
  LogitStats s;
  for (size_t i = 0; i < steps; ++i) {
    const float* a = ref.data() + i * vocab;
    const float* b = got.data() + i * vocab;
    if (model::ArgMax({a, vocab}) == model::ArgMax({b, vocab})) {
      ++s.top1;
    } else {
      s.disagree.push_back(static_cast<uint32_t>(i));
    }
    const std::vector<double> la = LogSoftmax(a, vocab), lb = LogSoftmax(b, vocab);
    double kl = 0;
    for (size_t j = 0; j < vocab; ++j) {
      kl += std::exp(la[j]) * (la[j] - lb[j]);
      s.max_logit_diff = std::max(s.max_logit_diff, std::fabs(static_cast<double>(a[j]) - b[j]));
    }
    kl = std::max(kl, 0.0);  // rounding can make a tiny KL slightly negative
    s.kl.push_back(kl);
    s.kl_mean += kl;
    s.kl_max = std::max(s.kl_max, kl);
  }
  if (steps) s.kl_mean /= static_cast<double>(steps);
  return s;
}

// Mean over (token, head) vectors of cos(original, restored) for one f16 tensor. Two zero
// vectors count as 1, one zero vector as 0.
double MeanCosine(const uint16_t* a, const uint16_t* b, uint64_t vectors, uint32_t head_dim) {
  double total = 0;
  for (uint64_t v = 0; v < vectors; ++v) {
    double dot = 0, na = 0, nb = 0;
    for (uint32_t i = 0; i < head_dim; ++i) {
      const double x = HalfToFloat(a[v * head_dim + i]), y = HalfToFloat(b[v * head_dim + i]);
      dot += x * y;
      na += x * x;
      nb += y * y;
    }
    if (na == 0 && nb == 0) {
      total += 1;
    } else if (na > 0 && nb > 0) {
      total += dot / std::sqrt(na * nb);
    }
  }
  return vectors ? total / static_cast<double>(vectors) : 1.0;
}

// ---- the worker process ----

struct WorkerOpts {
  std::string model, tokenizer, store, session, feed, logits_out;
  uint64_t tokens = 0;
  size_t threads = 0;
  std::string activations = "f32";
};

Result<model::ActivationPrecision> ParseActivations(const std::string& s) {
  if (s == "f32") return model::ActivationPrecision::kF32;
  if (s == "q8") return model::ActivationPrecision::kQ8;
  return Status::InvalidArgument("--activations takes f32 or q8, not '" + s + "'");
}

Status RunWorker(const WorkerOpts& o) {
  TQKV_ASSIGN_OR_RETURN(std::unique_ptr<Model> m, LoadModel(o.model, o.tokenizer));
  TQKV_ASSIGN_OR_RETURN(std::vector<int32_t> feed, ParseIds(o.feed));
  TQKV_ASSIGN_OR_RETURN(std::unique_ptr<Store> store, OpenStore(o.store));
  ThreadPool pool(o.threads);
  TQKV_ASSIGN_OR_RETURN(auto buffer, KvCacheBuffer::Allocate(m->name(), m->geometry(), DType::kF16,
                                                             o.tokens));
  RestoreOptions ro;
  ro.dtype = DType::kF16;
  ro.pool = &pool;
  TQKV_RETURN_IF_ERROR(RestoreInto(*store, o.session, buffer->cache(), ro)
                           .WithContext("restore " + o.session));
  model::EngineOptions eo;
  eo.pool = &pool;
  eo.max_tokens = static_cast<uint32_t>(o.tokens + feed.size());
  TQKV_ASSIGN_OR_RETURN(eo.activations, ParseActivations(o.activations));
  TQKV_ASSIGN_OR_RETURN(std::unique_ptr<LlamaEngine> engine, LlamaEngine::Create(*m, eo));
  TQKV_RETURN_IF_ERROR(engine->ImportCache(buffer->cache()));
  buffer.reset();
  TQKV_ASSIGN_OR_RETURN(std::vector<float> logits, TeacherForce(*engine, feed));
  return WriteFloats(o.logits_out, logits);
}

// Runs `argv` (argv[0] = this binary) and waits; non-zero exit -> Internal naming the status.
Status RunChild(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = ::fork();
  if (pid < 0) return Status::FromErrno("fork", "migrate-worker", errno);
  if (pid == 0) {
    ::execv(argv[0], argv.data());
    // Only async-signal-safe calls between fork and exec (the parent has pool threads).
    static const char kMsg[] = "tqkv migrate: cannot exec the migrate-worker\n";
    (void)!::write(2, kMsg, sizeof kMsg - 1);
    ::_exit(127);
  }
  int st = 0;
  while (::waitpid(pid, &st, 0) < 0) {
    if (errno != EINTR) return Status::FromErrno("waitpid", "migrate-worker", errno);
  }
  if (WIFEXITED(st) && WEXITSTATUS(st) == 0) return Status::Ok();
  if (WIFEXITED(st)) {
    return Status::Internal("migrate-worker exited with status " +
                            std::to_string(WEXITSTATUS(st)));
  }
  return Status::Internal("migrate-worker killed by signal " +
                          std::to_string(WIFSIGNALED(st) ? WTERMSIG(st) : -1));
}

Result<std::string> SelfExe() {
  std::vector<char> buf(4096);
  const ssize_t n = ::readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  if (n <= 0) return Status::FromErrno("readlink", "/proc/self/exe", errno);
  return std::string(buf.data(), static_cast<size_t>(n));
}

// ---- the parent ----

struct MigrateOpts {
  std::string model, tokenizer, prompt_file, store, json_path;
  std::vector<std::string> codecs, layer_codecs;
  uint64_t tokens = 2000;
  uint32_t steps = 50;
  size_t threads = 0;
  std::string activations = "f32";
  bool keep = false;
  std::string only;  // "", "k" or "v": analysis, the codec touches only K (or only V)
  uint32_t center_keys = 0;  // analysis: mean-removed keys over blocks of this many tokens
  std::string exact_tokens;  // "FIRST,LAST" for the TurboQuant rows
};

struct Row {
  std::string label;
  CheckpointOptions options;
};

Status RunMigrate(const MigrateOpts& o) {
  const double t_start = Now();
  if (o.steps == 0) return Status::InvalidArgument("--steps must be at least 1");
  if (o.tokens == 0) return Status::InvalidArgument("--tokens must be at least 1");
  TQKV_ASSIGN_OR_RETURN(const model::ActivationPrecision act, ParseActivations(o.activations));
  if (!o.only.empty() && o.only != "k" && o.only != "v") {
    return Status::InvalidArgument("--only takes k or v");
  }
  if (o.center_keys > 0 && !o.only.empty()) {
    return Status::InvalidArgument("--center-keys and --only do not combine");
  }

  // Rows: every codec as given; then every TurboQuant codec with the per-layer overrides.
  std::vector<Row> rows;
  std::vector<LayerCodec> overrides;
  std::string override_label;
  for (const auto& text : o.layer_codecs) {
    TQKV_ASSIGN_OR_RETURN(LayerCodec lc, ParseLayerCodec(text));
    overrides.push_back(lc);
    override_label += (override_label.empty() ? "" : ",") + text;
  }
  for (const auto& text : o.codecs) {
    Row r;
    r.label = text;
    TQKV_ASSIGN_OR_RETURN(r.options.codec, ParseCodecSpec(text));
    rows.push_back(r);
  }
  if (!overrides.empty()) {
    const size_t n = rows.size();
    for (size_t i = 0; i < n; ++i) {
      if (rows[i].options.codec.kind == CodecKind::kRaw) continue;
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
      if (rows[i].options.codec.kind == CodecKind::kRaw) continue;
      Row r = rows[i];
      r.label += "+exact" + std::to_string(et.head) + "," + std::to_string(et.tail);
      r.options.exact_head = et.head;
      r.options.exact_tail = et.tail;
      rows.push_back(r);
    }
  }
  if (rows.empty()) return Status::InvalidArgument("give at least one --codec");

  TQKV_ASSIGN_OR_RETURN(std::unique_ptr<Model> m, LoadModel(o.model, o.tokenizer));
  const model::LlamaConfig& cfg = m->config();
  for (const auto& lc : overrides) {
    if (lc.layer >= cfg.n_layers) {
      return Status::InvalidArgument("--layer-codec layer " + std::to_string(lc.layer) +
                                     " out of range: the model has " +
                                     std::to_string(cfg.n_layers) + " layers");
    }
  }
  if (m->tokenizer() == nullptr) {
    return Status::InvalidArgument(o.model + " has no tokenizer (give --tokenizer)");
  }
  TQKV_ASSIGN_OR_RETURN(std::string text, ReadText(o.prompt_file));
  const model::Tokenizer& tok = *m->tokenizer();
  const uint64_t need = o.tokens + o.steps;
  // Tokenizes the shortest run of whole lines from the start of the text that gives need + 64
  // tokens (the margin keeps the tokens used away from the cut), else the whole text.
  // (Merge-by-score tokenizers are quadratic in the text length; GPL-3 is 35 KB.)
  std::vector<int32_t> ids;
  size_t used_chars = 0;
  for (size_t chars = std::max<size_t>(4096, need * 6);; chars *= 2) {
    size_t cut = text.size();
    if (chars < text.size()) {
      cut = text.find('\n', chars);
      cut = cut == std::string::npos ? text.size() : cut + 1;
    }
    ids = tok.Encode(std::string_view(text).substr(0, cut), tok.add_bos_default(),
                     /*parse_special=*/false);
    used_chars = cut;
    if (cut == text.size() || ids.size() >= need + 64) break;
  }
  if (ids.size() < need) {
    return Status::InvalidArgument(
        o.prompt_file + " gives " + std::to_string(ids.size()) + " tokens; --tokens " +
        std::to_string(o.tokens) + " + --steps " + std::to_string(o.steps) + " needs " +
        std::to_string(need) + " (use a longer prompt or fewer tokens; the text is not repeated)");
  }
  if (need > cfg.context_length) {
    return Status::InvalidArgument("--tokens + --steps = " + std::to_string(need) +
                                   " exceeds the model's context length " +
                                   std::to_string(cfg.context_length));
  }
  std::fprintf(stderr,
               "migrate: %s (%u layers, %u KV heads, head_dim %u), prompt %s: %zu tokens from its first "
               "%zu bytes, prefix %llu + %u teacher-forced steps\n",
               m->name().c_str(), cfg.n_layers, cfg.n_kv_heads, cfg.head_dim,
               o.prompt_file.c_str(), ids.size(), used_chars,
               static_cast<unsigned long long>(o.tokens), o.steps);

  ThreadPool pool(o.threads);
  model::EngineOptions eo;
  eo.pool = &pool;
  eo.max_tokens = static_cast<uint32_t>(need);
  eo.activations = act;
  TQKV_ASSIGN_OR_RETURN(std::unique_ptr<LlamaEngine> engine, LlamaEngine::Create(*m, eo));
  const std::span<const int32_t> prefix(ids.data(), o.tokens);
  const std::span<const int32_t> feed(ids.data() + o.tokens, o.steps);

  double t = Now();
  TQKV_RETURN_IF_ERROR(engine->Prefill(prefix).status().WithContext("prefill"));
  std::fprintf(stderr, "migrate: reference prefill of %llu tokens: %.1f s\n",
               static_cast<unsigned long long>(o.tokens), Now() - t);
  // The original cache, kept while the reference engine runs on past it.
  TQKV_ASSIGN_OR_RETURN(std::unique_ptr<KvCacheBuffer> original, engine->ExportCache());
  t = Now();
  TQKV_ASSIGN_OR_RETURN(std::vector<float> ref_logits, TeacherForce(*engine, feed));
  std::fprintf(stderr, "migrate: reference teacher-forced %u steps: %.1f s\n", o.steps, Now() - t);
  engine.reset();
  const size_t vocab = cfg.vocab_size;
  // The reference's top-1 minus top-2 logit per step: how close each step is to a tie.
  std::vector<double> margins;
  for (uint32_t i = 0; i < o.steps; ++i) {
    std::vector<float> l(ref_logits.begin() + i * vocab, ref_logits.begin() + (i + 1) * vocab);
    std::partial_sort(l.begin(), l.begin() + 2, l.end(), std::greater<float>());
    margins.push_back(static_cast<double>(l[0]) - l[1]);
  }
  // How often the reference itself predicts the prompt's next token (context for the figures).
  uint32_t ref_vs_text = 0, ref_vs_text_n = 0;
  for (uint32_t i = 0; i < o.steps; ++i) {
    if (o.tokens + i + 1 >= ids.size()) break;
    ++ref_vs_text_n;
    if (model::ArgMax({ref_logits.data() + i * vocab, vocab}) == ids[o.tokens + i + 1]) {
      ++ref_vs_text;
    }
  }

  TQKV_ASSIGN_OR_RETURN(std::unique_ptr<Store> store, OpenStore(o.store));
  TQKV_ASSIGN_OR_RETURN(std::string self, SelfExe());
  char tmpl[] = "/tmp/tqkv-migrate-XXXXXX";
  const char* tmpdir = ::mkdtemp(tmpl);
  if (tmpdir == nullptr) return Status::FromErrno("mkdtemp", tmpl, errno);
  const std::string logits_path = std::string(tmpdir) + "/logits.f32";
  const std::string feed_ids = JoinIds(feed);
  const ModelGeometry geo = m->geometry();
  const uint64_t vectors = o.tokens * geo.kv_heads;

  json results = json::array();
  Status status = Status::Ok();
  for (size_t r = 0; r < rows.size() && status.ok(); ++r) {
    status = [&]() -> Status {
      const Row& row = rows[r];
      const std::string key = "migrate-" + std::to_string(::getpid()) + "-" + std::to_string(r);
      CheckpointOptions copts = row.options;
      copts.pool = &pool;
      double t0 = Now();
      // Analysis: mean-removed keys; the codec sees the residual, the worker gets the residual's
      // restore plus the means, carried by a lossless fp16 checkpoint under the same key.
      const bool center = o.center_keys > 0 && row.options.codec.kind != CodecKind::kRaw;
      std::unique_ptr<KvCacheBuffer> residual;
      model::KeyCentering centering;
      if (center) {
        TQKV_ASSIGN_OR_RETURN(residual, KvCacheBuffer::Allocate(m->name(), geo, DType::kF16,
                                                                o.tokens));
        TQKV_ASSIGN_OR_RETURN(centering,
                              model::CenterKeys(original->cache(), o.center_keys, residual->cache()));
      }
      TQKV_ASSIGN_OR_RETURN(
          CheckpointStats cs,
          Checkpoint(center ? residual->cache() : original->cache(), copts, *store, key));
      if (center) {
        cs.bytes_written += centering.StoredBits() / 8;  // means and coefficients, 16 bits each
        TQKV_ASSIGN_OR_RETURN(auto restored_residual,
                              KvCacheBuffer::Allocate(m->name(), geo, DType::kF16, o.tokens));
        RestoreOptions cro;
        cro.pool = &pool;
        TQKV_RETURN_IF_ERROR(RestoreInto(*store, key, restored_residual->cache(), cro));
        TQKV_RETURN_IF_ERROR(model::UncenterKeys(centering, restored_residual->cache()));
        CheckpointOptions fp16;
        fp16.pool = &pool;
        TQKV_RETURN_IF_ERROR(Checkpoint(restored_residual->cache(), fp16, *store, key).status());
        std::fprintf(stderr, "migrate: %s: keys centered over %u-token blocks, residual energy "
                     "%.4f of the keys'\n", row.label.c_str(), o.center_keys,
                     centering.energy_fraction);
      }
      if (!o.only.empty()) {
        // Analysis: the codec's K (or V) with the original V (or K), carried by a lossless fp16
        // checkpoint under the same key, so the worker sees exactly that hybrid.
        TQKV_ASSIGN_OR_RETURN(auto hybrid, KvCacheBuffer::Allocate(m->name(), geo, DType::kF16,
                                                                   o.tokens));
        RestoreOptions hro;
        hro.pool = &pool;
        TQKV_RETURN_IF_ERROR(RestoreInto(*store, key, hybrid->cache(), hro));
        const int keep_kv = o.only == "k" ? 1 : 0;  // the tensor taken from the original
        for (uint32_t l = 0; l < geo.layers; ++l) {
          std::memcpy(hybrid->cache().tensor(l, keep_kv), original->cache().tensor(l, keep_kv),
                      original->cache().tensor_bytes());
        }
        CheckpointOptions fp16;
        fp16.pool = &pool;
        TQKV_RETURN_IF_ERROR(Checkpoint(hybrid->cache(), fp16, *store, key).status());
      }
      const double bpv = 8.0 * static_cast<double>(cs.bytes_written) /
                         (2.0 * geo.layers * static_cast<double>(o.tokens) * geo.token_elems());
      std::fprintf(stderr, "migrate: [%zu/%zu] %s: checkpoint %llu bytes (%.3f bits/value) %.1f s",
                   r + 1, rows.size(), row.label.c_str(),
                   static_cast<unsigned long long>(cs.bytes_written), bpv, Now() - t0);
      t0 = Now();
      ::unlink(logits_path.c_str());
      std::vector<std::string> args = {self,       "migrate-worker", "--model", o.model,
                                       "--store",  o.store,          "--session", key,
                                       "--tokens", std::to_string(o.tokens),
                                       "--feed",   feed_ids,         "--logits-out", logits_path,
                                       "--threads", std::to_string(o.threads),
                                       "--activations", o.activations};
      if (!o.tokenizer.empty()) {
        args.push_back("--tokenizer");
        args.push_back(o.tokenizer);
      }
      TQKV_RETURN_IF_ERROR(RunChild(args).WithContext(row.label));
      TQKV_ASSIGN_OR_RETURN(std::vector<float> got, ReadFloats(logits_path, o.steps * vocab));
      std::fprintf(stderr, ", worker (restore + %u steps) %.1f s\n", o.steps, Now() - t0);
      const LogitStats ls = CompareLogits(ref_logits, got, o.steps, vocab);

      // Per-layer cosine against the same fp16 cache the worker imported.
      TQKV_ASSIGN_OR_RETURN(auto restored, KvCacheBuffer::Allocate(m->name(), geo, DType::kF16,
                                                                   o.tokens));
      RestoreOptions ro;
      ro.pool = &pool;
      TQKV_RETURN_IF_ERROR(RestoreInto(*store, key, restored->cache(), ro));
      json kcos = json::array(), vcos = json::array();
      double ksum = 0, vsum = 0;
      for (uint32_t l = 0; l < geo.layers; ++l) {
        const double kc =
            MeanCosine(static_cast<const uint16_t*>(original->cache().k(l)),
                       static_cast<const uint16_t*>(restored->cache().k(l)), vectors, geo.head_dim);
        const double vc =
            MeanCosine(static_cast<const uint16_t*>(original->cache().v(l)),
                       static_cast<const uint16_t*>(restored->cache().v(l)), vectors, geo.head_dim);
        kcos.push_back(kc);
        vcos.push_back(vc);
        ksum += kc;
        vsum += vc;
      }
      if (!o.keep) TQKV_RETURN_IF_ERROR(store->Remove(key));
      json kl_steps = ls.kl;
      json margins_of_disagreements = json::array();
      for (uint32_t d : ls.disagree) margins_of_disagreements.push_back(margins[d]);
      std::string label = row.label + (o.only.empty() ? "" : " (" + o.only + " only)");
      if (center) label += " (keys centered/" + std::to_string(o.center_keys) + ")";
      results.push_back({{"codec", label},
                         {"top1", ls.top1},
                         {"kl_mean", ls.kl_mean},
                         {"kl_max", ls.kl_max},
                         {"max_logit_diff", ls.max_logit_diff},
                         {"k_cosine_mean", ksum / geo.layers},
                         {"v_cosine_mean", vsum / geo.layers},
                         {"bits_per_value", bpv},
                         {"checkpoint_bytes", cs.bytes_written},
                         {"exact_first", std::min<uint64_t>(row.options.exact_head, o.tokens)},
                         {"exact_last", std::min<uint64_t>(row.options.exact_tail,
                                                           o.tokens - std::min<uint64_t>(
                                                               row.options.exact_head, o.tokens))},
                         {"k_cosine_per_layer", kcos},
                         {"v_cosine_per_layer", vcos},
                         {"kl_per_step", kl_steps},
                         {"disagree_steps", ls.disagree},
                         {"disagree_ref_margins", margins_of_disagreements}});
      if (center) {
        results.back()["center_keys_block"] = o.center_keys;
        results.back()["key_residual_energy"] = centering.energy_fraction;
      }
      return Status::Ok();
    }();
  }
  ::unlink(logits_path.c_str());
  ::rmdir(tmpdir);
  TQKV_RETURN_IF_ERROR(status);

  json j = {{"model", m->name()},
            {"model_file", o.model},
            {"prompt_source", o.prompt_file},
            {"prompt_tokens", o.tokens},
            {"prompt_chars_tokenized", used_chars},
            {"steps", o.steps},
            {"activations", model::ActivationPrecisionName(act)},
            {"head_dim", geo.head_dim},
            {"layers", geo.layers},
            {"kv_heads", geo.kv_heads},
            {"reference_top1_vs_prompt", ref_vs_text},
            {"reference_top1_vs_prompt_steps", ref_vs_text_n},
            {"reference_margin_per_step", margins},
            {"results", results}};
  std::printf("%s, prompt %s: %llu prefix tokens, %u teacher-forced steps, %s activations "
              "(reference predicts the prompt's next token %u/%u)\n",
              m->name().c_str(), o.prompt_file.c_str(), static_cast<unsigned long long>(o.tokens),
              o.steps, model::ActivationPrecisionName(act), ref_vs_text, ref_vs_text_n);
  std::printf("%-40s %7s %11s %11s %10s %9s %9s %9s\n", "codec", "top1", "kl_mean", "kl_max",
              "max_dlogit", "k_cos", "v_cos", "bits/val");
  for (const auto& r : results) {
    char top[32];
    std::snprintf(top, sizeof top, "%u/%u", r["top1"].get<uint32_t>(), o.steps);
    std::printf("%-40s %7s %11.3e %11.3e %10.4f %9.6f %9.6f %9.3f\n",
                r["codec"].get<std::string>().c_str(), top, r["kl_mean"].get<double>(),
                r["kl_max"].get<double>(), r["max_logit_diff"].get<double>(),
                r["k_cosine_mean"].get<double>(), r["v_cosine_mean"].get<double>(),
                r["bits_per_value"].get<double>());
  }
  std::fprintf(stderr, "migrate: total %.1f s\n", Now() - t_start);
  if (!o.json_path.empty()) {
    if (o.json_path == "-") {
      std::cout << j.dump(2) << "\n";
    } else {
      std::ofstream f(o.json_path, std::ios::trunc);
      f << j.dump(2) << "\n";
      f.close();
      if (!f) return Status::IoError("cannot write " + o.json_path);
    }
  }
  return Status::Ok();
}

}  // namespace

void RegisterMigrateCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "migrate",
      "Checkpoint a real model's KV cache with codecs, restore it in a fresh process and compare "
      "the teacher-forced next-token distributions with the uncompressed original");
  auto o = std::make_shared<MigrateOpts>();
  cmd->add_option("--model", o->model, "Model file (GGUF or llama2.c .bin)")->required();
  cmd->add_option("--tokenizer", o->tokenizer, "Tokenizer file (llama2.c tok512.bin)");
  cmd->add_option("--prompt-file", o->prompt_file, "Prompt text (e.g. /usr/share/common-licenses/GPL-3)")
      ->required();
  cmd->add_option("--tokens", o->tokens, "Prefix tokens in the checkpointed cache")
      ->capture_default_str();
  cmd->add_option("--steps", o->steps, "Teacher-forced steps after the prefix")
      ->capture_default_str();
  cmd->add_option("--codec", o->codecs, "Codec spec (repeatable: fp16, tq2, tq2.5, tq3, ...)")
      ->required();
  cmd->add_option("--layer-codec", o->layer_codecs,
                  "Per-layer override L:SPEC (repeatable); measured as extra rows, one per "
                  "TurboQuant --codec");
  cmd->add_option("--store", o->store, kStoreUriHelp)->required();
  cmd->add_option("--threads", o->threads, "Threads (0: all cores)");
  cmd->add_option("--activations", o->activations,
                  "Activation precision of quantized matmuls: f32 (default; weights dequantized "
                  "in registers) or q8 (activations quantized to q8 blocks, like llama.cpp)");
  cmd->add_option("--json", o->json_path, "Write the results as JSON to FILE ('-' for stdout)");
  cmd->add_flag("--keep", o->keep, "Keep the checkpoints in the store");
  cmd->add_option("--only", o->only,
                  "Analysis: apply the codec to K only (k) or V only (v); the other tensor stays "
                  "exact (the hybrid travels as a lossless fp16 checkpoint)");
  cmd->add_option("--center-keys", o->center_keys,
                  "Analysis: encode keys minus their per-head mean over blocks of N tokens "
                  "(scaled per vector), add it back on restore; the means and coefficients "
                  "count at 16 bits each (docs/accuracy.md)");
  cmd->add_option("--exact-tokens", o->exact_tokens,
                  std::string(kExactTokensHelp) + "; applies to the TurboQuant rows");
  cmd->callback([o] { Report("migrate", RunMigrate(*o)); });

  auto* worker = app.add_subcommand("migrate-worker", "Restore side of migrate (internal)");
  worker->group("");
  auto w = std::make_shared<WorkerOpts>();
  worker->add_option("--model", w->model)->required();
  worker->add_option("--tokenizer", w->tokenizer);
  worker->add_option("--store", w->store)->required();
  worker->add_option("--session", w->session)->required();
  worker->add_option("--tokens", w->tokens)->required();
  worker->add_option("--feed", w->feed)->required();
  worker->add_option("--logits-out", w->logits_out)->required();
  worker->add_option("--threads", w->threads);
  worker->add_option("--activations", w->activations);
  worker->callback([w] { Report("migrate-worker", RunWorker(*w)); });
}

#else  // !TQKV_HAVE_MODEL

void RegisterMigrateCommand(CLI::App&) {}

#endif  // TQKV_HAVE_MODEL

}  // namespace tqkv::tools
