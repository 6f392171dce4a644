#include "tools/commands.h"

#include <cstdio>

namespace tqkv::tools {
namespace {
int g_exit_code = 0;
}  // namespace

void SetExitCode(int code) { g_exit_code = code; }
int ExitCode() { return g_exit_code; }

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
