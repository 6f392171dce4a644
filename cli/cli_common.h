// What the two programs share, `tqkv` (tools/) and `tqkv-bench` (bench/): exit codes, error
// reports, count checks and the help texts of common options (target tqkv_cli_common).
#ifndef TQKV_CLI_CLI_COMMON_H_
#define TQKV_CLI_CLI_COMMON_H_

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

#include "tqkv/status.h"

namespace tqkv::tools {

// Help text of every --store option: the URI forms OpenStore accepts (docs/store.md).
inline constexpr const char* kStoreUriHelp =
    "Store URI: a directory, file:///dir, nfs://host/export/dir, redis://host:port/prefix, "
    "redis+unix:///path/to.sock/prefix, redis+cluster://host:port[,host:port...]/prefix, "
    "s3://bucket/prefix?endpoint=http://host:port";

// The unit rules of tqkv/units.h, for option help texts.
inline constexpr const char* kByteSizeHelp =
    "Sizes: KB MB GB TB PB = powers of 1000; KiB MiB GiB TiB PiB (or K M G T P) = powers of 1024";
inline constexpr const char* kDurationHelp = "Durations: ms, s, m, h, d (none: seconds)";

// The exact-token and key-means settings (tqkv/settings.h), for the option help texts.
inline constexpr const char* kExactTokensHelp =
    "FIRST,LAST: also store the first FIRST and the last LAST tokens exactly (e.g. 4,128: "
    "attention sinks and the most recent tokens; default 0,4 for lossy codecs, 0,0 for none; "
    "docs/accuracy.md)";

inline constexpr const char* kKeyMeansHelp =
    "mean-removed keys: off, session or a block of tokens, optionally ,f16 or ,f32 (default "
    "128: per KV head and 128-token block a mean key, per key a coefficient, stored exactly in "
    "f16; format version 4; docs/accuracy.md)";

// CLI11 check of a count option with ParseCount (tqkv/units.h): decimal digits in [min, max], so
// "-1" (which CLI11 would wrap into an unsigned) and "1e9" are refused before the command runs.
CLI::Validator CountIn(uint64_t min, uint64_t max);

// A repeatable option (a vector target) that takes one value per use ("--codec a --codec b"), so
// it never swallows the positionals or values after it: CLI11 lets a vector option take every
// following non-option argument.
inline CLI::Option* OneValuePerUse(CLI::Option* option) { return option->allow_extra_args(false); }

// Subcommand callbacks report their outcome here; main returns it.
void SetExitCode(int code);
int ExitCode();
// The program's name in reports ("tqkv" unless main sets another).
void SetProgramName(const char* name);
// Prints "<program> <command>: <status>" to stderr and sets exit code 1 when status is not OK.
void Report(const std::string& command, const Status& status);

// A program's main after its subcommands are registered: checks TQKV_SIMD, parses and runs the
// command, turns an escaped exception into exit code 1; returns the exit code.
int RunProgram(CLI::App& app, const char* program, int argc, char** argv);

// CPU seconds this process has used, every thread (CLOCK_PROCESS_CPUTIME_ID).
double ProcessCpuSeconds();

}  // namespace tqkv::tools

#endif  // TQKV_CLI_CLI_COMMON_H_
