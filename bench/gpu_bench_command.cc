// `tqkv-bench gpu`: GPU encode/decode throughput of a codec against a same-run D2D copy (JSON;
// tqkv/gpu_bench.h, implemented in src/cuda/bench.cc). Without CUDA it says so and exits 1.
#include <cstdint>
#include <iostream>
#include <memory>
#include <string>

#include "bench/commands.h"
#include "cli/cli_common.h"
#include "tqkv/settings.h"
#if defined(TQKV_HAVE_CUDA)
#include "tqkv/gpu_bench.h"
#endif

namespace tqkv::tools {

#if defined(TQKV_HAVE_CUDA)

void RegisterGpuBench(CLI::App& app) {
  struct Opts {
    std::string codec{kDefaultCodec};
    uint32_t heads = 4, head_dim = 128;
    uint64_t tokens = 262144;
    int iterations = 10;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("gpu", "GPU encode/decode throughput vs D2D copy (JSON)");
  cmd->add_option("--codec", o->codec)->capture_default_str();
  cmd->add_option("--heads", o->heads)->capture_default_str();
  cmd->add_option("--head-dim", o->head_dim)->capture_default_str();
  cmd->add_option("--tokens", o->tokens)->capture_default_str();
  cmd->add_option("--iterations", o->iterations)->capture_default_str();
  cmd->callback([o] {
    Status s = [&]() -> Status {
      TQKV_ASSIGN_OR_RETURN(GpuCodecBench b, BenchGpuCodec(o->codec, o->heads, o->head_dim,
                                                           o->tokens, o->iterations));
      std::cout << b.ToJson() << "\n";
      return Status::Ok();
    }();
    Report("gpu", s);
  });
}

#else  // !TQKV_HAVE_CUDA

void RegisterGpuBench(CLI::App& app) {
  auto* cmd = app.add_subcommand("gpu", "GPU codec throughput (this build has no CUDA)");
  cmd->allow_extras();
  cmd->callback([] {
    Report("gpu",
           Status::Unsupported("this tqkv-bench was built without CUDA (TQKV_ENABLE_CUDA=OFF)"));
  });
}

#endif

}  // namespace tqkv::tools
