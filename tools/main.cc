// tqkv: the command-line tool. Each subcommand registers itself from its own file.
#include <CLI/CLI.hpp>

#include <cstdio>

#include "tools/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"tqkv: TurboQuant-compressed KV-cache checkpoint and restore"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "tqkv 0.1.0");
  tqkv::tools::RegisterCommands(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return tqkv::tools::ExitCode();
}
