// tqkv: the command-line tool. Each subcommand registers itself from its own file; the
// benchmarks and experiments are another program, tqkv-bench (bench/).
#include <CLI/CLI.hpp>

#include "cli/cli_common.h"
#include "tools/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"tqkv: TurboQuant-compressed KV-cache checkpoint and restore"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "tqkv 0.1.0");
  tqkv::tools::RegisterCommands(app);
  return tqkv::tools::RunProgram(app, "tqkv", argc, argv);
}
