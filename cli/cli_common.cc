#include "cli/cli_common.h"

#include <time.h>

#include <cstdio>
#include <exception>
#include <new>

#include "tqkv/simd.h"
#include "tqkv/units.h"

namespace tqkv::tools {
namespace {
int g_exit_code = 0;
const char* g_program = "tqkv";
}  // namespace

void SetExitCode(int code) { g_exit_code = code; }
void SetProgramName(const char* name) { g_program = name; }

double ProcessCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}
int ExitCode() { return g_exit_code; }

CLI::Validator CountIn(uint64_t min, uint64_t max) {
  return CLI::Validator(
      [min, max](std::string& text) -> std::string {
        auto v = ParseCount(text, min, max);
        return v.ok() ? std::string() : v.status().message();
      },
      "COUNT in [" + std::to_string(min) + ", " + std::to_string(max) + "]");
}

void Report(const std::string& command, const Status& status) {
  if (status.ok()) return;
  std::fprintf(stderr, "%s %s: %s\n", g_program, command.c_str(), status.ToString().c_str());
  SetExitCode(1);
}

int RunProgram(CLI::App& app, const char* program, int argc, char** argv) {
  SetProgramName(program);
  // A TQKV_SIMD the CPU cannot honour would otherwise measure or run another level than asked.
  if (const Status simd = SimdEnvironmentStatus(); !simd.ok()) {
    std::fprintf(stderr, "%s: error: %s\n", program, simd.message().c_str());
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::bad_alloc&) {
    // The library reports memory it cannot have as ResourceExhausted; this is the last line for
    // an allocation outside it (a container of the standard library), so no run ends in abort().
    std::fprintf(stderr, "%s: out of memory\n", program);
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: internal error: %s\n", program, e.what());
    return 1;
  }
  return ExitCode();
}

}  // namespace tqkv::tools
