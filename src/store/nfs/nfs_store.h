// The NFS store through libnfs (a userspace NFSv3 client; no kernel mount):
// "nfs://host/export/sub/dir?version=3". Same layout and publish protocol as the posix store:
// object "a/b" is <dir>/a/b.tqkv, a writer writes <dir>/a/.b.tqkv.tmp.<pid>.<hex>, Commit = COMMIT
// (fsync), set mtime, RENAME over b.tqkv (atomic on the server). A reader pins the version it
// opened with a hard link (.b.tqkv.tmp.r<pid>.<hex>, removed on close), so a later overwrite or
// Remove never pulls the file from under it (NFSv3 has no open state; libnfs no silly rename).
#ifndef TQKV_SRC_STORE_NFS_NFS_STORE_H_
#define TQKV_SRC_STORE_NFS_NFS_STORE_H_

#include <memory>

#include "tqkv/status.h"
#include "tqkv/store.h"

namespace tqkv {

// The "nfs" scheme of OpenStore. Options: version=3, nfsport, mountport, uid, gid, depth
// (RPCs in flight), chunk (I/O request size), io=buffered, create=0|1.
Result<std::unique_ptr<Store>> OpenNfsStoreFromUri(const StoreUri& uri);

}  // namespace tqkv

#endif  // TQKV_SRC_STORE_NFS_NFS_STORE_H_
