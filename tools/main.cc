// tqkv: the command-line tool. Each subcommand registers itself from its own file.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>
#include <new>

#include "tools/commands.h"
#include "tqkv/simd.h"

int main(int argc, char** argv) {
  CLI::App app{"tqkv: TurboQuant-compressed KV-cache checkpoint and restore"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "tqkv 0.1.0");
  tqkv::tools::RegisterCommands(app);
  // A TQKV_SIMD the CPU cannot honour would otherwise measure or run another level than asked.
  if (const tqkv::Status simd = tqkv::SimdEnvironmentStatus(); !simd.ok()) {
    std::fprintf(stderr, "tqkv: error: %s\n", simd.message().c_str());
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::bad_alloc&) {
    // The library reports memory it cannot have as ResourceExhausted; this is the last line for
    // an allocation outside it (a container of the standard library), so no run ends in abort().
    std::fprintf(stderr, "tqkv: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tqkv: internal error: %s\n", e.what());
    return 1;
  }
  return tqkv::tools::ExitCode();
}
