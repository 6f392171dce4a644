// `tqkv bench ...`: the benchmark subcommands.
#include "tools/cli_common.h"

namespace tqkv::tools {

void RegisterBenchCodec(CLI::App& bench);    // bench/codec_bench.cc
void RegisterBenchRestore(CLI::App& bench);  // bench/restore_bench.cc

void RegisterBenchCommands(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks that print figures (and JSON)");
  bench->require_subcommand(1);
  RegisterBenchCodec(*bench);
  RegisterBenchRestore(*bench);
}

}  // namespace tqkv::tools
