#include "tools/commands.h"

#include <cstdio>

namespace tqkv::tools {
namespace {
int g_exit_code = 0;
}  // namespace

void SetExitCode(int code) { g_exit_code = code; }
int ExitCode() { return g_exit_code; }

Status ApplyExactTokens(const std::string& text, CheckpointOptions& opts) {
  if (text.empty()) return Status::Ok();
  TQKV_ASSIGN_OR_RETURN(const ExactTokens et, ParseExactTokens(text));
  opts.exact_head = et.head;
  opts.exact_tail = et.tail;
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
  RegisterBenchCommands(app);
}

}  // namespace tqkv::tools
