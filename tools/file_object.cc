#include "tools/file_object.h"

#include <filesystem>

namespace tqkv::tools {

Result<StoreAndKey> OpenFilePath(const std::string& path, bool create_dir) {
  namespace fs = std::filesystem;
  const fs::path p(path);
  if (p.extension() != ".tqkv") {
    return Status::InvalidArgument(path + ": a container file name must end in .tqkv");
  }
  std::error_code ec;
  fs::path dir = fs::absolute(p.has_parent_path() ? p.parent_path() : fs::path("."), ec);
  if (ec) return Status::InvalidArgument(path + ": " + ec.message());
  if (!create_dir && !fs::is_directory(dir)) return Status::NotFound(dir.string() + ": no such directory");
  StoreAndKey out;
  TQKV_ASSIGN_OR_RETURN(out.store, OpenStore(dir.string()));
  out.key = p.stem().string();
  TQKV_RETURN_IF_ERROR(ValidateKey(out.key));
  return out;
}

}  // namespace tqkv::tools
