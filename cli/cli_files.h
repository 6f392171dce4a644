// The command line's own files, outside any store: the inputs it reads whole (llama.cpp states)
// and the outputs it writes (decompress, restore --out, llama export, --json FILE). One rule for
// each, so that no command can clobber a session or grow without bound (docs/store.md §2, "The
// command line's own files").
#ifndef TQKV_CLI_CLI_FILES_H_
#define TQKV_CLI_CLI_FILES_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tqkv/status.h"

namespace tqkv::tools {

// Refuses an output path that is a store's object or internal file (a name with ".tqkv" in it,
// docs/store.md "Files"), an existing file that starts with the container magic (a session under
// another name), or the same file as one of `inputs`. Commands call it before doing their work.
Status CheckOutputPath(const std::string& path, const std::vector<std::string>& inputs = {});

// Writes `bytes` to `path` after CheckOutputPath: a temp file beside it, fsync, then rename, so
// the previous file stays whole until the new one is (a full disk leaves it, and the error names
// errno). Errors name the path.
Status WriteOutputFile(const std::string& path, std::string_view bytes,
                       const std::vector<std::string>& inputs = {});

// Reads a regular file whole (memory: its size). Pipes, devices and directories are refused:
// their size is unknown, and /dev/zero would grow memory until killed.
Result<std::vector<uint8_t>> ReadInputFile(const std::string& path);

}  // namespace tqkv::tools

#endif  // TQKV_CLI_CLI_FILES_H_
