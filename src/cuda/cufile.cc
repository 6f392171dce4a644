// dlopen loader for libcufile (see cufile.h).
#include "cuda/cufile.h"

#include <dlfcn.h>

#include <type_traits>

namespace tqkv::cuda {

Result<CuFileApi> LoadCuFile(const std::vector<std::string>& names_in) {
  const std::vector<std::string> names =
      names_in.empty() ? std::vector<std::string>{"libcufile.so.0", "libcufile.so"} : names_in;
  std::string errors;
  for (const std::string& name : names) {
    void* lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* e = dlerror();
      errors += (errors.empty() ? "" : "; ") + std::string(e ? e : name + ": dlopen failed");
      continue;
    }
    CuFileApi api;
    api.lib = lib;
    api.library = name;
    std::string missing;
    auto sym = [&](const char* s, auto& fn) {
      void* p = dlsym(lib, s);
      if (p == nullptr) missing += (missing.empty() ? "" : ", ") + std::string(s);
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
    };
    sym("cuFileDriverOpen", api.DriverOpen);
    sym("cuFileDriverClose", api.DriverClose);
    sym("cuFileHandleRegister", api.HandleRegister);
    sym("cuFileHandleDeregister", api.HandleDeregister);
    sym("cuFileBufRegister", api.BufRegister);
    sym("cuFileBufDeregister", api.BufDeregister);
    sym("cuFileRead", api.Read);
    if (missing.empty()) return api;
    errors += (errors.empty() ? "" : "; ") + name + ": missing symbols " + missing;
    dlclose(lib);
  }
  return Status::Unsupported("cuFile not loadable: " + errors);
}

std::string CuFileErrorString(CUfileErrorT e) {
  // The code is cufile.h's CUfileOpError (5000 + n); no table here, so no stale names.
  return "cuFile error " + std::to_string(e.err) + ", CUresult " + std::to_string(e.cu_err);
}

}  // namespace tqkv::cuda
