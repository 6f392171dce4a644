// Pieces of the migration experiment shared by its two processes (src/model/migrate.cc, the
// parent; src/model/migrate_worker.cc, the restore side).
#ifndef TQKV_BENCH_MIGRATE_MIGRATE_INTERNAL_H_
#define TQKV_BENCH_MIGRATE_MIGRATE_INTERNAL_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "model/engine.h"
#include "model/model.h"
#include "tqkv/status.h"

namespace tqkv::model {

Result<std::unique_ptr<Model>> LoadMigrateModel(const std::string& path,
                                                const std::string& tokenizer);
Result<ActivationPrecision> ParseActivations(const std::string& s);
// Logits of the fed tokens, one step each, after the engine's current cache.
Result<std::vector<float>> TeacherForce(LlamaEngine& engine, std::span<const int32_t> feed);

// Runs `args` (args[0]: the program) and waits; non-zero exit -> Internal naming the status.
Status RunChild(const std::vector<std::string>& args);
// This process's executable (/proc/self/exe).
Result<std::string> SelfExe();

}  // namespace tqkv::model

#endif  // TQKV_BENCH_MIGRATE_MIGRATE_INTERNAL_H_
