// tqkv-bench: the benchmarks and experiments (codec, restore, migrate, gpu), a program of its own
// beside tqkv, as RocksDB's db_bench is. It links what tqkv does not: the test-store decorators
// (--link-gbps), the reference engine and the migration experiment.
#include <CLI/CLI.hpp>

#include "bench/commands.h"
#include "cli/cli_common.h"

int main(int argc, char** argv) {
  CLI::App app{"tqkv-bench: benchmarks and experiments for tqkv (figures and JSON)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "tqkv-bench 0.1.0");
  tqkv::tools::RegisterBenchCodec(app);
  tqkv::tools::RegisterBenchRestore(app);
  tqkv::tools::RegisterMigrateCommand(app);
  tqkv::tools::RegisterGpuBench(app);
  return tqkv::tools::RunProgram(app, "tqkv-bench", argc, argv);
}
