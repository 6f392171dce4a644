// Command-line paths to store objects: "dir/name.tqkv" is key "name" of the store at "dir".
#ifndef TQKV_TOOLS_FILE_OBJECT_H_
#define TQKV_TOOLS_FILE_OBJECT_H_

#include <memory>
#include <string>

#include "tqkv/status.h"
#include "tqkv/store.h"

namespace tqkv::tools {

struct StoreAndKey {
  std::unique_ptr<Store> store;
  std::string key;
};

// Splits a .tqkv file path into the directory store and the key. The key is the file's name
// (any bytes but '/' and NUL), not a store key: the store is opened with file_names.
Result<StoreAndKey> OpenFilePath(const std::string& path, bool create_dir = false);

}  // namespace tqkv::tools

#endif  // TQKV_TOOLS_FILE_OBJECT_H_
