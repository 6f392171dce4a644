// GPU commands: `tqkv gpu probe` (the I/O ladder as JSON) and `tqkv restore --target gpu`. The GPU
// codec benchmark is `tqkv-bench gpu` (bench/gpu_bench_command.cc).
#include "tools/gpu_command.h"

#include <cstdio>
#include <iostream>

#include "tools/commands.h"
#include "tqkv/store.h"
#if defined(TQKV_HAVE_CUDA)
#include "tqkv/gpu.h"
#endif

namespace tqkv::tools {

#if defined(TQKV_HAVE_CUDA)

Status RestoreToGpuCommand(const std::string& store_uri, const std::string& session,
                           const std::string& io, const std::string& dtype, bool json) {
  GpuRestoreOptions opts;
  auto dt = ParseDType(dtype);
  if (!dt) return Status::InvalidArgument("unknown dtype " + dtype);
  opts.dtype = *dt;
  OpenStoreOptions store_opts;
  if (!io.empty()) {  // the rung, and the store's host I/O that goes with it (gpu.h)
    TQKV_ASSIGN_OR_RETURN(opts.io, ParseGpuIoPath(io));
    TQKV_ASSIGN_OR_RETURN(store_opts.io, GpuStoreIo(io));
  }
  TQKV_ASSIGN_OR_RETURN(auto store, OpenExistingStore(store_uri, store_opts));
  TQKV_ASSIGN_OR_RETURN(auto gs, RestoreToGpu(*store, session, opts));
  const GpuRestoreStats& st = gs->stats();
  if (json) {
    std::cout << st.ToJson() << "\n";
  } else {
    std::printf("restore %s to GPU: %llu tokens of %s, %.1f MB read in %.3f s (%.3f GB/s), "
                "layer 0 ready after %.3f s, path=%s host_io=%s\n",
                session.c_str(), static_cast<unsigned long long>(st.tokens), st.model.c_str(),
                st.bytes_read / 1e6, st.seconds, st.seconds > 0 ? st.bytes_read / st.seconds / 1e9 : 0,
                st.first_layer_seconds, std::string(GpuIoPathName(st.path)).c_str(),
                st.host_io.c_str());
    for (const auto& s : st.skipped) std::printf("  skipped %s\n", s.c_str());
  }
  return Status::Ok();
}

void RegisterGpuCommands(CLI::App& app) {
  auto* gpu = app.add_subcommand("gpu", "GPU I/O ladder probe");
  gpu->require_subcommand(1);
  auto* probe = gpu->add_subcommand("probe", "Print the GPU I/O ladder probe as JSON");
  auto dir = std::make_shared<std::string>();
  probe->add_option("--dir", *dir, "Directory to test O_DIRECT in (a file:// store's directory)");
  probe->callback([dir] {
    GpuProbeOptions o;
    o.dir = *dir;
    std::cout << ProbeGpuLadder(o).ToJson() << "\n";
  });
}

#else  // !TQKV_HAVE_CUDA

Status RestoreToGpuCommand(const std::string&, const std::string&, const std::string&,
                           const std::string&, bool) {
  return Status::Unsupported(
      "--target gpu: this tqkv was built without CUDA (TQKV_ENABLE_CUDA=OFF); use --target host");
}

void RegisterGpuCommands(CLI::App& app) {
  auto* gpu = app.add_subcommand("gpu", "GPU I/O ladder probe (this build has no CUDA)");
  gpu->allow_extras();
  gpu->callback([] {
    Report("gpu", Status::Unsupported("this tqkv was built without CUDA (TQKV_ENABLE_CUDA=OFF)"));
  });
}

#endif

}  // namespace tqkv::tools
