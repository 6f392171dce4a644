// The subcommands of tqkv-bench (bench/main.cc); each Register* lives in its own file.
#ifndef TQKV_BENCH_COMMANDS_H_
#define TQKV_BENCH_COMMANDS_H_

#include <CLI/CLI.hpp>

namespace tqkv::tools {

void RegisterBenchCodec(CLI::App& app);      // bench/codec_bench.cc: codec
void RegisterBenchRestore(CLI::App& app);    // bench/restore_bench.cc: restore
void RegisterMigrateCommand(CLI::App& app);  // bench/migrate_command.cc: migrate (with the model)
void RegisterGpuBench(CLI::App& app);        // bench/gpu_bench_command.cc: gpu

}  // namespace tqkv::tools

#endif  // TQKV_BENCH_COMMANDS_H_
