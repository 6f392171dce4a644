// Connections to one Redis node through hiredis: the store's settings, a pool of connections, and
// reading replies (with the cluster redirections MOVED / ASK / TRYAGAIN recognised).
#ifndef TQKV_SRC_STORE_REDIS_REDIS_CONN_H_
#define TQKV_SRC_STORE_REDIS_REDIS_CONN_H_

#include <hiredis/hiredis.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tqkv/status.h"

namespace tqkv::redis {

struct ReplyDeleter {
  void operator()(redisReply* r) const {
    if (r != nullptr) freeReplyObject(r);
  }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

struct RedisConfig {
  std::string host;  // empty: unix socket
  int port = 6379;
  std::string socket;
  bool cluster = false;                             // redis+cluster://: follow redirections
  std::vector<std::pair<std::string, int>> seeds;   // cluster: the nodes named in the URI
  std::string prefix = "tqkv";
  uint64_t chunk_bytes = 4u << 20;
  uint32_t depth = 8;               // requests in flight per pipelined read or write
  uint64_t temp_ttl_ms = 3600'000;  // unfinished writers' chunks expire after this
  uint64_t grace_ms = 60'000;       // replaced/removed versions stay readable this long
  uint64_t timeout_ms = 30'000;
  std::string uri;
};

// Connections to one node. Objects hold a shared_ptr to their pool so they outlive the store.
// Thread-safe.
class Pool {
 public:
  // on_redirect: called when a reply from this node is a cluster redirection (may be empty).
  explicit Pool(RedisConfig cfg, std::function<void()> on_redirect = {})
      : cfg_(std::move(cfg)), on_redirect_(std::move(on_redirect)) {}
  ~Pool();
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  const RedisConfig& cfg() const { return cfg_; }
  // An idle connection or a new one; IoError if the node cannot be reached.
  Result<redisContext*> Get();
  // A connection with an error or unread replies (clean = false) is closed, never reused.
  void Put(redisContext* c, bool clean);
  // "host:port" or "unix:/path".
  std::string Where() const;
  void NoteRedirect() const {
    if (on_redirect_) on_redirect_();
  }

 private:
  RedisConfig cfg_;
  std::function<void()> on_redirect_;
  std::mutex mu_;
  std::vector<redisContext*> idle_;
};

// A connection borrowed from a pool for one scope.
class Lease {
 public:
  Lease(std::shared_ptr<Pool> pool, redisContext* c) : pool_(std::move(pool)), c_(c) {}
  ~Lease() { pool_->Put(c_, clean_); }
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;
  redisContext* get() const { return c_; }
  Pool& pool() const { return *pool_; }
  void MarkDirty() { clean_ = false; }

 private:
  std::shared_ptr<Pool> pool_;
  redisContext* c_;
  bool clean_ = true;
};

// A cluster redirection or "try again" reply, parsed.
struct Redirect {
  enum class Kind { kMoved, kAsk, kTryAgain, kClusterDown };
  Kind kind = Kind::kMoved;
  int slot = -1;     // MOVED / ASK
  std::string host;  // MOVED / ASK; empty: the node that replied (Redis 7 may omit it)
  int port = 0;
};
// Empty for any other reply; a malformed MOVED/ASK is not a redirect (it becomes an error).
std::optional<Redirect> ParseRedirect(const redisReply& r);

Status ConnError(const Pool& pool, redisContext* c, std::string_view what);
void AppendCmd(redisContext* c, const std::vector<std::string_view>& args);
// One reply; error replies stay replies (type REDIS_REPLY_ERROR). Status only if the connection
// failed (the connection is then unusable).
Result<Reply> ReadReply(const Pool& pool, redisContext* c, std::string_view what);
// The Status for an error reply. A redirection is Unsupported from a plain redis:// node (it is
// a cluster node) and a retryable IoError in cluster mode (the caller could not follow it).
Status ReplyError(const Pool& pool, const redisReply& r, std::string_view what);
// ReadReply, with error replies turned into ReplyError.
Result<Reply> GetReply(const Pool& pool, redisContext* c, std::string_view what);
// Sends one command on the lease and reads its reply (GetReply); a broken connection is dirtied.
Result<Reply> Command(Lease& lease, const std::vector<std::string_view>& args,
                      std::string_view what);

}  // namespace tqkv::redis

#endif  // TQKV_SRC_STORE_REDIS_REDIS_CONN_H_
