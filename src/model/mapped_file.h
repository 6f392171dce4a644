// A read-only memory mapping of a whole file (model weights are read in place, never copied).
#ifndef TQKV_SRC_MODEL_MAPPED_FILE_H_
#define TQKV_SRC_MODEL_MAPPED_FILE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "tqkv/status.h"

namespace tqkv::model {

class MappedFile {
 public:
  // Maps `path` read-only. An empty file maps to size() == 0 and data() == nullptr.
  static Result<std::shared_ptr<const MappedFile>> Open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile() = default;
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace tqkv::model

#endif  // TQKV_SRC_MODEL_MAPPED_FILE_H_
