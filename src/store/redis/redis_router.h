// Which node serves a Redis key: one node (redis://, redis+unix://) or the owner of the key's hash
// slot in a Redis Cluster (redis+cluster://, redis_cluster.h).
#ifndef TQKV_SRC_STORE_REDIS_REDIS_ROUTER_H_
#define TQKV_SRC_STORE_REDIS_REDIS_ROUTER_H_

#include <memory>
#include <string_view>
#include <vector>

#include "store/redis/redis_conn.h"
#include "tqkv/status.h"

namespace tqkv::redis {

// Thread-safe. Routing keys are full Redis keys; a cluster hashes their {hash tag}.
class Router {
 public:
  virtual ~Router() = default;
  // The store's settings (prefix, chunk, TTLs); the node address fields are the URI's.
  virtual const RedisConfig& cfg() const = 0;
  // Whether pipelined callers should re-send redirected commands through Exec.
  virtual bool FollowsRedirects() const = 0;
  // The pool of the node that serves `key` (as far as the router knows).
  virtual Result<std::shared_ptr<Pool>> PoolFor(std::string_view key) = 0;
  // One command, routed by `key`; a cluster router follows MOVED/ASK/TRYAGAIN a bounded number of
  // times. Error replies are a Status (ReplyError).
  virtual Result<Reply> Exec(std::string_view key, const std::vector<std::string_view>& args,
                             std::string_view what) = 0;
  // Every primary node, each once: SCAN covers the namespace by scanning each of them.
  virtual Result<std::vector<std::shared_ptr<Pool>>> Primaries() = 0;
  // Checks the nodes can be reached (at open: fail early).
  virtual Status Connect() = 0;
};

// The one node of cfg (host:port or socket); redirections are errors (ReplyError).
std::shared_ptr<Router> MakeSingleNodeRouter(RedisConfig cfg);

}  // namespace tqkv::redis

#endif  // TQKV_SRC_STORE_REDIS_REDIS_ROUTER_H_
