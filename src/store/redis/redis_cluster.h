// Redis Cluster routing for redis+cluster://host:port[,host:port...]/prefix.
//
// The router reads the slot map (CLUSTER SLOTS) from the seed nodes at open and sends each command
// to the primary that owns its key's hash slot (redis_slot.h), through a connection pool per node.
// Every key of a session carries the hash tag {K}, so a session's keys and Lua scripts stay in one
// slot on one node. MOVED: the slot's owner is updated at once and the whole map re-read before the
// retry; ASK: ASKING then the command, once, on the named node; TRYAGAIN / CLUSTERDOWN: a short
// backoff. At most kMaxClusterTries sends per command, then IoError. Replicas are never used.
#ifndef TQKV_SRC_STORE_REDIS_REDIS_CLUSTER_H_
#define TQKV_SRC_STORE_REDIS_REDIS_CLUSTER_H_

#include <memory>

#include "store/redis/redis_conn.h"
#include "store/redis/redis_router.h"

namespace tqkv::redis {

inline constexpr int kMaxClusterTries = 16;

// cfg.seeds: the nodes to read the slot map from (1..64). Connect() reads it.
std::shared_ptr<Router> MakeClusterRouter(RedisConfig cfg);

}  // namespace tqkv::redis

#endif  // TQKV_SRC_STORE_REDIS_REDIS_CLUSTER_H_
