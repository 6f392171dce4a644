// Connections to one Redis node: pooling and reply reading.
#include "store/redis/redis_conn.h"

#include <charconv>

namespace tqkv::redis {

Pool::~Pool() {
  for (redisContext* c : idle_) redisFree(c);
}

Result<redisContext*> Pool::Get() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!idle_.empty()) {
      redisContext* c = idle_.back();
      idle_.pop_back();
      return c;
    }
  }
  timeval tv{static_cast<time_t>(cfg_.timeout_ms / 1000),
             static_cast<suseconds_t>((cfg_.timeout_ms % 1000) * 1000)};
  redisContext* c = cfg_.host.empty() ? redisConnectUnixWithTimeout(cfg_.socket.c_str(), tv)
                                      : redisConnectWithTimeout(cfg_.host.c_str(), cfg_.port, tv);
  if (c == nullptr) return Status::IoError("redis: cannot allocate a connection to " + Where());
  if (c->err != 0) {
    Status s = Status::IoError("redis: cannot connect to " + Where() + ": " + c->errstr);
    redisFree(c);
    return s;
  }
  redisSetTimeout(c, tv);
  // Large replies: keep hiredis from shrinking its read buffer after every chunk.
  if (c->reader != nullptr) c->reader->maxbuf = 0;
  return c;
}

void Pool::Put(redisContext* c, bool clean) {
  if (c == nullptr) return;
  if (!clean || c->err != 0) {
    redisFree(c);
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (idle_.size() >= 32) {
    redisFree(c);
    return;
  }
  idle_.push_back(c);
}

std::string Pool::Where() const {
  return cfg_.host.empty() ? "unix:" + cfg_.socket : cfg_.host + ":" + std::to_string(cfg_.port);
}

namespace {

bool ParseInt(std::string_view s, int min, int max, int* out) {
  int v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || ptr != s.data() + s.size() || v < min || v > max) return false;
  *out = v;
  return true;
}

}  // namespace

std::optional<Redirect> ParseRedirect(const redisReply& r) {
  if (r.type != REDIS_REPLY_ERROR || r.str == nullptr) return std::nullopt;
  const std::string_view e(r.str, r.len);
  Redirect d;
  std::string_view rest;
  if (e.rfind("TRYAGAIN", 0) == 0) {
    d.kind = Redirect::Kind::kTryAgain;
    return d;
  }
  if (e.rfind("CLUSTERDOWN", 0) == 0) {
    d.kind = Redirect::Kind::kClusterDown;
    return d;
  }
  if (e.rfind("MOVED ", 0) == 0) {
    d.kind = Redirect::Kind::kMoved;
    rest = e.substr(6);
  } else if (e.rfind("ASK ", 0) == 0) {
    d.kind = Redirect::Kind::kAsk;
    rest = e.substr(4);
  } else {
    return std::nullopt;
  }
  // "<slot> <host>:<port>"; the host may be empty (same host) or an IPv6 address (last ':').
  const size_t sp = rest.find(' ');
  if (sp == std::string_view::npos) return std::nullopt;
  const std::string_view addr = rest.substr(sp + 1);
  const size_t colon = addr.rfind(':');
  if (colon == std::string_view::npos || addr.size() > 300 ||
      !ParseInt(rest.substr(0, sp), 0, 16383, &d.slot) ||
      !ParseInt(addr.substr(colon + 1), 1, 65535, &d.port)) {
    return std::nullopt;
  }
  d.host = std::string(addr.substr(0, colon));
  return d;
}

Status ConnError(const Pool& pool, redisContext* c, std::string_view what) {
  return Status::IoError("redis " + std::string(what) + " on " + pool.Where() + ": " +
                         (c->err != 0 ? std::string(c->errstr) : std::string("no reply")));
}

void AppendCmd(redisContext* c, const std::vector<std::string_view>& args) {
  std::vector<const char*> argv(args.size());
  std::vector<size_t> lens(args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    argv[i] = args[i].data();
    lens[i] = args[i].size();
  }
  redisAppendCommandArgv(c, static_cast<int>(args.size()), argv.data(), lens.data());
}

Result<Reply> ReadReply(const Pool& pool, redisContext* c, std::string_view what) {
  void* r = nullptr;
  if (redisGetReply(c, &r) != REDIS_OK || r == nullptr) return ConnError(pool, c, what);
  return Reply(static_cast<redisReply*>(r));
}

Status ReplyError(const Pool& pool, const redisReply& r, std::string_view what) {
  const std::string err = r.str != nullptr ? std::string(r.str, r.len) : std::string("error");
  const std::string head = "redis " + std::string(what) + " on " + pool.Where() + ": " + err;
  if (err.rfind("MOVED ", 0) == 0 || err.rfind("ASK ", 0) == 0) {
    pool.NoteRedirect();
    if (!pool.cfg().cluster) {
      return Status::Unsupported(head +
                                 " (a Redis Cluster redirection; this redis:// client talks to one "
                                 "node and does not follow MOVED/ASK: open the store as "
                                 "redis+cluster://host:port/prefix, or use a cluster proxy)");
    }
    return Status::IoError(head + " (the session's slot moved to another node during this "
                                  "operation; the slot map is refreshed, retry)");
  }
  return Status::IoError(head);
}

Result<Reply> GetReply(const Pool& pool, redisContext* c, std::string_view what) {
  TQKV_ASSIGN_OR_RETURN(Reply reply, ReadReply(pool, c, what));
  if (reply->type == REDIS_REPLY_ERROR) return ReplyError(pool, *reply, what);
  return reply;
}

Result<Reply> Command(Lease& lease, const std::vector<std::string_view>& args,
                      std::string_view what) {
  AppendCmd(lease.get(), args);
  auto r = GetReply(lease.pool(), lease.get(), what);
  if (!r.ok() && lease.get()->err != 0) lease.MarkDirty();
  return r;
}

}  // namespace tqkv::redis
