// `tqkv bench codec`: placeholder until the codec lands.
#include "tools/commands.h"

namespace tqkv::tools {
void RegisterBenchCodec(CLI::App& bench) {
  CLI::App* cmd = bench.add_subcommand("codec", "Codec speed and quality");
  cmd->callback([] { Report("bench codec", Status::Unsupported("not built yet")); });
}
}  // namespace tqkv::tools
