#include "test_paths.h"

namespace tqkv::test {

const std::string& SourceDir() {
  static const std::string dir = TQKV_SOURCE_DIR;
  return dir;
}

const std::string& BinaryDir() {
  static const std::string dir = TQKV_BINARY_DIR;
  return dir;
}

}  // namespace tqkv::test
