#include "tools/file_object.h"

#include <filesystem>

#include "store/posix/posix_store.h"

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
  // Opened as a directory, not a URI (a '?' in it is part of the name), and the stem is a file
  // name: "x^y.tqkv" is a local file, not a store key (ValidateKey would refuse the '^').
  PosixStoreOptions options;
  options.dir = dir.string();
  options.file_names = true;
  StoreAndKey out;
  TQKV_ASSIGN_OR_RETURN(out.store, OpenPosixStore(options));
  out.key = p.stem().string();
  return out;
}

}  // namespace tqkv::tools
