// Runs the built programs, `tqkv` and `tqkv-bench`, for command-line tests.
#ifndef TQKV_TESTS_TOOLS_CLI_UTIL_H_
#define TQKV_TESTS_TOOLS_CLI_UTIL_H_

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include "test_paths.h"

namespace tqkv::testing_util {

struct CmdResult {
  int status = -1;   // exit status; -1 if it did not exit normally
  std::string out;   // stdout and stderr together
};

// Runs <build dir>/<program> with args; env: "NAME=value ..." set for this run only.
inline CmdResult RunProgram(const std::string& program, const std::string& args,
                            const std::string& env = "") {
  const std::string cmd =
      env + " " + tqkv::test::BinaryDir() + "/" + program + " " + args + " 2>&1";
  CmdResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

inline CmdResult Tqkv(const std::string& args, const std::string& env = "") {
  return RunProgram("tqkv", args, env);
}
inline CmdResult TqkvBench(const std::string& args, const std::string& env = "") {
  return RunProgram("tqkv-bench", args, env);
}

// The first JSON object in a command's output (discarded JSON if none).
inline nlohmann::json Json(const std::string& text) {
  const size_t b = text.find('{');
  return nlohmann::json::parse(text.substr(b == std::string::npos ? 0 : b), nullptr, false);
}

// A JSON file a command wrote (discarded JSON if unreadable).
inline nlohmann::json JsonFile(const std::string& path) {
  std::ifstream f(path);
  return nlohmann::json::parse(f, nullptr, false);
}

}  // namespace tqkv::testing_util

#endif  // TQKV_TESTS_TOOLS_CLI_UTIL_H_
