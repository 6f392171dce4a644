// The restore side of the migration experiment (a process of its own) and how the parent starts it.
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>

#include "bench/migrate/migrate_internal.h"
#include "tqkv/checkpoint.h"
#include "tqkv/kv_cache.h"
#include "bench/migrate/migrate.h"
#include "tqkv/store.h"
#include "tqkv/thread_pool.h"

namespace tqkv {
namespace model {

Result<std::unique_ptr<Model>> LoadMigrateModel(const std::string& path,
                                                const std::string& tokenizer) {
  ModelLoadOptions lo;
  lo.tokenizer_path = tokenizer;
  return Model::Load(path, lo);
}

Result<ActivationPrecision> ParseActivations(const std::string& s) {
  if (s == "f32") return ActivationPrecision::kF32;
  if (s == "q8") return ActivationPrecision::kQ8;
  return Status::InvalidArgument("--activations takes f32 or q8, not '" + s + "'");
}

Result<std::vector<float>> TeacherForce(LlamaEngine& engine, std::span<const int32_t> feed) {
  std::vector<float> all;
  for (int32_t t : feed) {
    TQKV_ASSIGN_OR_RETURN(std::vector<float> logits, engine.Forward(t));
    all.insert(all.end(), logits.begin(), logits.end());
  }
  return all;
}

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
    static const char kMsg[] = "tqkv-bench migrate: cannot exec the migrate-worker\n";
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

}  // namespace model

namespace {

Status WriteFloats(const std::string& path, const std::vector<float>& v) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
  f.close();
  if (!f) return Status::IoError("cannot write " + path);
  return Status::Ok();
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

}  // namespace

Status RunMigrateWorker(const MigrateWorkerOptions& o) {
  TQKV_ASSIGN_OR_RETURN(std::unique_ptr<model::Model> m,
                        model::LoadMigrateModel(o.model, o.tokenizer));
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
  TQKV_ASSIGN_OR_RETURN(eo.activations, model::ParseActivations(o.activations));
  TQKV_ASSIGN_OR_RETURN(std::unique_ptr<model::LlamaEngine> engine,
                        model::LlamaEngine::Create(*m, eo));
  TQKV_RETURN_IF_ERROR(engine->ImportCache(buffer->cache()));
  buffer.reset();
  TQKV_ASSIGN_OR_RETURN(std::vector<float> logits, model::TeacherForce(*engine, feed));
  return WriteFloats(o.logits_out, logits);
}

}  // namespace tqkv
