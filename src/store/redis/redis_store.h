// The Redis store: "redis://host:port/prefix?chunk=4MiB", "redis+unix:///run/redis.sock/prefix",
// and Redis Cluster: "redis+cluster://host:port[,host:port...]/prefix" (routing: redis_cluster.h).
//
// Object key K is kept as bounded chunks plus one manifest, all under the hash tag {K} so that a
// Redis Cluster puts every key of a session on one node:
//   <prefix>:{K}:m              manifest "tqkv1 <size> <chunk> <nchunks> <xxh3> <writer> <mtime_ns>"
//   <prefix>:{K}:d:<writer>:<i> chunk i of the version written by <writer> (16 hex + pid)
//   <prefix>:{K}:a / :p         last access time (ns) / pin (see store_admin.h)
// A writer SETs its chunks with a TTL (a killed writer leaves litter that expires), then Commit
// runs one Lua script: check every chunk is there, PERSIST them, swap the manifest, and give the
// replaced version's chunks a grace TTL (readers that opened it keep reading it whole). docs/store.md.
#ifndef TQKV_SRC_STORE_REDIS_REDIS_STORE_H_
#define TQKV_SRC_STORE_REDIS_REDIS_STORE_H_

#include <memory>

#include "tqkv/status.h"
#include "tqkv/store.h"

namespace tqkv {

// The "redis", "redis+unix" and "redis+cluster" schemes of OpenStore.
Result<std::unique_ptr<Store>> OpenRedisStoreFromUri(const StoreUri& uri);

}  // namespace tqkv

#endif  // TQKV_SRC_STORE_REDIS_REDIS_STORE_H_
