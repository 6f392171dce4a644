#include "tools/cli_common.h"

#include <time.h>

#include <cstdio>

#include "tqkv/units.h"

namespace tqkv::tools {
namespace {
int g_exit_code = 0;
}  // namespace

void SetExitCode(int code) { g_exit_code = code; }

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
  std::fprintf(stderr, "tqkv %s: %s\n", command.c_str(), status.ToString().c_str());
  SetExitCode(1);
}

}  // namespace tqkv::tools
