// Session admin of the posix store (tqkv/store_admin.h): pins are ".<name>.tqkv.pin" files beside
// the objects, last use is the object file's atime (set by Open) or mtime, and gc removes by
// renaming aside first. File names: store/file_layout.h.
#ifndef TQKV_SRC_STORE_POSIX_POSIX_ADMIN_H_
#define TQKV_SRC_STORE_POSIX_POSIX_ADMIN_H_

#include <memory>
#include <string>

#include "tqkv/store_admin.h"

namespace tqkv {

// `dir`: the store's absolute directory.
std::unique_ptr<SessionAdmin> MakePosixSessionAdmin(std::string dir);

}  // namespace tqkv

#endif  // TQKV_SRC_STORE_POSIX_POSIX_ADMIN_H_
