// Registration of the tool's subcommands; each Register* lives in its own file.
#ifndef TQKV_TOOLS_COMMANDS_H_
#define TQKV_TOOLS_COMMANDS_H_

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "tqkv/checkpoint.h"
#include "tqkv/status.h"

namespace tqkv::tools {

void RegisterCommands(CLI::App& app);

// Help text of every --store option: the URI forms OpenStore accepts (docs/store.md).
inline constexpr const char* kStoreUriHelp =
    "Store URI: a directory, file:///dir, nfs://host/export/dir, redis://host:port/prefix, "
    "redis+unix:///path/to.sock/prefix, redis+cluster://host:port[,host:port...]/prefix, "
    "s3://bucket/prefix?endpoint=http://host:port";

inline constexpr const char* kExactTokensHelp =
    "FIRST,LAST: also store the first FIRST and the last LAST tokens exactly (e.g. 4,128: "
    "attention sinks and the most recent tokens; default 0,4 for lossy codecs, 0,0 for none; "
    "docs/accuracy.md)";

// The unit rules of tqkv/units.h, for option help texts.
inline constexpr const char* kByteSizeHelp =
    "Sizes: KB MB GB TB PB = powers of 1000; KiB MiB GiB TiB PiB (or K M G T P) = powers of 1024";
inline constexpr const char* kDurationHelp = "Durations: ms, s, m, h, d (none: seconds)";

// CLI11 check of a count option with ParseCount (tqkv/units.h): decimal digits in [min, max], so
// "-1" (which CLI11 would wrap into an unsigned) and "1e9" are refused before the command runs.
CLI::Validator CountIn(uint64_t min, uint64_t max);

// Sets opts.codec and opts.layer_overrides from --codec and the --layer-codec values (L:SPEC).
Status ApplyCodecs(const std::string& codec, const std::vector<std::string>& layer_codecs,
                   CheckpointOptions& opts);

// Sets opts.exact_head / exact_tail from a --exact-tokens value; "" gives DefaultExactTokens
// (tqkv/checkpoint.h: call after the codecs are set).
Status ApplyExactTokens(const std::string& text, CheckpointOptions& opts);

inline constexpr const char* kKeyMeansHelp =
    "mean-removed keys: off, session or a block of tokens, optionally ,f16 or ,f32 (default "
    "128: per KV head and 128-token block a mean key, per key a coefficient, stored exactly in "
    "f16; format version 4; docs/accuracy.md)";
// Sets opts.key_mean_block / key_mean_dtype from a --key-means value ("" leaves the defaults).
Status ApplyKeyMeans(const std::string& text, CheckpointOptions& opts);

inline constexpr const char* kStrictHelp =
    "Refuse the checkpoint when some layer's K or V codec error exceeds the guard's threshold "
    "(0.5 of the vectors' varying energy; docs/codec.md §9); nothing is written then";
inline constexpr const char* kNoGuardHelp =
    "Do not measure and record the codec's error per layer (format version 6; docs/codec.md §9)";
// The guard's outcome of a checkpoint (and the allocator's choice with auto:B): a line on stdout, one warning per layer and tensor over
// the threshold on stderr.
void PrintGuardReport(const CheckpointStats& stats, const CheckpointOptions& options);
// `tqkv inspect`'s guard lines for a header ("not recorded" before format version 6).
void PrintGuardTable(const ContainerHeader& header);

// Subcommand callbacks report their outcome here; main returns it.
void SetExitCode(int code);
int ExitCode();
// Prints "tqkv <command>: <status>" to stderr and sets exit code 1 when status is not OK.
void Report(const std::string& command, const Status& status);

void RegisterBenchCommands(CLI::App& app);    // bench/
void RegisterSessionCommands(CLI::App& app);  // tools/session_commands.cc
void RegisterCapacityCommand(CLI::App& app);  // tools/capacity_command.cc
void RegisterMigrateCommand(CLI::App& app);   // tools/migrate_command.cc
void RegisterStoreCommands(CLI::App& app);    // tools/store_commands.cc: ls, rm, pin, gc
void RegisterLlamaCommands(CLI::App& app);    // tools/llama_command.cc: import, export, inspect

}  // namespace tqkv::tools

#endif  // TQKV_TOOLS_COMMANDS_H_
