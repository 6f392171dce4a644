// Registration of the tool's subcommands; each Register* lives in its own file.
#ifndef TQKV_TOOLS_COMMANDS_H_
#define TQKV_TOOLS_COMMANDS_H_

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "cli/cli_common.h"
#include "tqkv/checkpoint.h"
#include "tqkv/settings.h"
#include "tqkv/status.h"

namespace tqkv::tools {

void RegisterCommands(CLI::App& app);

inline constexpr const char* kStrictHelp =
    "Refuse the checkpoint when some layer's K or V codec error exceeds the guard's threshold "
    "(0.5 of the vectors' varying energy; docs/codec.md §9); nothing is written then";
inline constexpr const char* kNoGuardHelp =
    "Do not measure and record the codec's error per layer (format version 6; docs/codec.md §9)";

inline constexpr const char* kAlignHelp =
    "Payload alignment in bytes, a power of two from 64 to 4096 (default 4096, for O_DIRECT reads "
    "of big sessions; 64 for small ones such as vLLM chunks: less padding; format version 9)";

// The checkpoint settings options of a command (--codec, --layer-codec, --exact-tokens,
// --key-means, --align and, with `guard`, --strict and --no-guard): only what the user gives is set, so
// ResolveCheckpointOptions (tqkv/settings.h) decides every default.
struct SettingsFlags {
  CheckpointSettings settings;
  void Add(CLI::App* cmd, bool guard = true);
  Result<CheckpointOptions> Resolve() const { return ResolveCheckpointOptions(settings); }
  std::string codec() const { return settings.codec.value_or(std::string(kDefaultCodec)); }
  // The settings as resolved, for --json: {"codec", "layer_codecs", "exact_tokens", ...}.
  nlohmann::json Json(const CheckpointOptions& resolved) const;
};
// The guard's outcome of a checkpoint (and the allocator's choice with auto:B): a line on stdout, one warning per layer and tensor over
// the threshold on stderr.
void PrintGuardReport(const CheckpointStats& stats, const CheckpointOptions& options);
// `tqkv inspect`'s guard lines for a header ("not recorded" before format version 6).
void PrintGuardTable(const ContainerHeader& header);

void RegisterSessionCommands(CLI::App& app);  // tools/session_commands.cc
void RegisterCapacityCommand(CLI::App& app);  // tools/capacity_command.cc
void RegisterStoreCommands(CLI::App& app);    // tools/store_commands.cc: ls, rm, pin, gc
void RegisterLlamaCommands(CLI::App& app);    // tools/llama_command.cc: import, export, inspect

}  // namespace tqkv::tools

#endif  // TQKV_TOOLS_COMMANDS_H_
