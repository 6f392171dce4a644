// `tqkv gpu probe` and the GPU side of `tqkv restore --target gpu` (tools/gpu_command.cc).
// Built with or without CUDA: without it, each returns Unsupported with a clear message.
#ifndef TQKV_TOOLS_GPU_COMMAND_H_
#define TQKV_TOOLS_GPU_COMMAND_H_

#include <CLI/CLI.hpp>

#include <string>

#include "tqkv/status.h"

namespace tqkv::tools {

void RegisterGpuCommands(CLI::App& app);

// Restores `session` from the store at `store_uri` into GPU memory. io: "" (ladder), gds, direct,
// uring or buffered; prints the result (JSON when `json`).
Status RestoreToGpuCommand(const std::string& store_uri, const std::string& session,
                           const std::string& io, const std::string& dtype, bool json);

}  // namespace tqkv::tools

#endif  // TQKV_TOOLS_GPU_COMMAND_H_
