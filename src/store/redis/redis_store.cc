// Redis store through hiredis: chunked objects, publish by one Lua script, pipelined reads.
#include "store/redis/redis_store.h"

#include <hiredis/hiredis.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "store/store_admin.h"
#include "store/store_internal.h"

namespace tqkv {
namespace {

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
  std::string prefix = "tqkv";
  uint64_t chunk_bytes = 4u << 20;
  uint32_t depth = 8;              // requests in flight per pipelined read or write
  uint64_t temp_ttl_ms = 3600'000;  // unfinished writers' chunks expire after this
  uint64_t grace_ms = 60'000;       // replaced/removed versions stay readable this long
  uint64_t timeout_ms = 30'000;
  std::string uri;
};

// Connections are pooled; objects hold a shared_ptr to the pool so they outlive the store.
class Pool {
 public:
  explicit Pool(RedisConfig cfg) : cfg_(std::move(cfg)) {}
  ~Pool() {
    for (redisContext* c : idle_) redisFree(c);
  }
  const RedisConfig& cfg() const { return cfg_; }

  Result<redisContext*> Get() {
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
  // A connection with an error or unread replies is closed, never reused.
  void Put(redisContext* c, bool clean) {
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
  std::string Where() const {
    return cfg_.host.empty() ? "unix:" + cfg_.socket : cfg_.host + ":" + std::to_string(cfg_.port);
  }

 private:
  RedisConfig cfg_;
  std::mutex mu_;
  std::vector<redisContext*> idle_;
};

// A connection borrowed from the pool for one scope.
class Lease {
 public:
  Lease(std::shared_ptr<Pool> pool, redisContext* c) : pool_(std::move(pool)), c_(c) {}
  ~Lease() { pool_->Put(c_, clean_); }
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;
  redisContext* get() const { return c_; }
  void MarkDirty() { clean_ = false; }

 private:
  std::shared_ptr<Pool> pool_;
  redisContext* c_;
  bool clean_ = true;
};

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

Result<Reply> GetReply(const Pool& pool, redisContext* c, std::string_view what) {
  void* r = nullptr;
  if (redisGetReply(c, &r) != REDIS_OK || r == nullptr) return ConnError(pool, c, what);
  Reply reply(static_cast<redisReply*>(r));
  if (reply->type == REDIS_REPLY_ERROR) {
    const std::string err(reply->str, reply->len);
    // Redis Cluster redirections are not followed: say so, rather than fail as an I/O error.
    if (err.rfind("MOVED ", 0) == 0 || err.rfind("ASK ", 0) == 0) {
      return Status::Unsupported("redis " + std::string(what) + " on " + pool.Where() + ": " + err +
                                 " (a Redis Cluster redirection; this client talks to one node "
                                 "and does not follow MOVED/ASK: point the URI at the node that "
                                 "owns the session's slot, or at a cluster proxy)");
    }
    return Status::IoError("redis " + std::string(what) + " on " + pool.Where() + ": " + err);
  }
  return reply;
}

Result<Reply> Command(const Pool& pool, Lease& lease, const std::vector<std::string_view>& args,
                      std::string_view what) {
  AppendCmd(lease.get(), args);
  auto r = GetReply(pool, lease.get(), what);
  if (!r.ok() && lease.get()->err != 0) lease.MarkDirty();
  return r;
}

std::string Hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016" PRIx64, v);
  return buf;
}

struct Manifest {
  uint64_t size = 0;
  uint64_t chunk = 0;
  uint64_t nchunks = 0;
  uint64_t xxh = 0;
  std::string writer;
  int64_t mtime_ns = 0;
};

std::string FormatManifest(const Manifest& m) {
  return "tqkv1 " + std::to_string(m.size) + " " + std::to_string(m.chunk) + " " +
         std::to_string(m.nchunks) + " " + Hex64(m.xxh) + " " + m.writer + " " +
         std::to_string(m.mtime_ns);
}

Result<Manifest> ParseManifest(std::string_view text, std::string_view key) {
  Manifest m;
  char writer[64] = {0};
  unsigned long long size, chunk, n, xxh;
  long long mtime;
  const std::string t(text);
  if (std::sscanf(t.c_str(), "tqkv1 %llu %llu %llu %llx %63s %lld", &size, &chunk, &n, &xxh, writer,
                  &mtime) != 6 ||
      chunk == 0 || n != (size + chunk - 1) / chunk) {
    return Status::Corruption("redis: bad manifest for object " + std::string(key) + ": \"" +
                              t.substr(0, 120) + "\"");
  }
  m.size = size;
  m.chunk = chunk;
  m.nchunks = n;
  m.xxh = xxh;
  m.writer = writer;
  m.mtime_ns = mtime;
  return m;
}

std::string RandomWriterId() {
  static std::mutex mu;
  static std::mt19937_64 rng;
  static pid_t seeded_for = 0;
  std::lock_guard<std::mutex> lock(mu);
  if (seeded_for != ::getpid()) {  // reseed in forked children
    seeded_for = ::getpid();
    rng.seed(std::random_device{}() ^ static_cast<uint64_t>(seeded_for) << 32 ^
             static_cast<uint64_t>(store_internal::NowUnixNs()));
  }
  return Hex64(rng()) + "." + std::to_string(::getpid());
}

// Publish: KEYS[1] manifest. ARGV[1] new manifest, ARGV[2] grace ms, ARGV[3] chunk key base
// "<prefix>:{K}:d:", ARGV[4] new writer, ARGV[5] new chunk count.
constexpr const char* kPublishLua = R"lua(
local base, w, n, grace = ARGV[3], ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[2])
for i = 0, n - 1 do
  if redis.call('EXISTS', base .. w .. ':' .. i) == 0 then
    return redis.error_reply('chunk ' .. i .. ' of writer ' .. w .. ' is missing (expired temp?)')
  end
end
for i = 0, n - 1 do redis.call('PERSIST', base .. w .. ':' .. i) end
local old = redis.call('GET', KEYS[1])
redis.call('SET', KEYS[1], ARGV[1])
if old then
  local on, ow = string.match(old, '^tqkv1 %d+ %d+ (%d+) %x+ (%S+)')
  if ow and ow ~= w then
    for i = 0, tonumber(on) - 1 do
      if grace > 0 then redis.call('PEXPIRE', base .. ow .. ':' .. i, grace)
      else redis.call('DEL', base .. ow .. ':' .. i) end
    end
  end
end
return 1
)lua";

// Remove: KEYS[1] manifest, ARGV[1] grace ms, ARGV[2] chunk key base, ARGV[3] key prefix for
// the side records ("<prefix>:{K}:"), ARGV[4] expected writer id or "" (else -1: published
// again). The writer id names one version exactly; a wall-clock mtime could repeat across hosts.
constexpr const char* kRemoveLua = R"lua(
local old = redis.call('GET', KEYS[1])
if not old then return 0 end
local on, ow = string.match(old, '^tqkv1 %d+ %d+ (%d+) %x+ (%S+)')
if ARGV[4] ~= '' and ow ~= ARGV[4] then return -1 end
local grace, base = tonumber(ARGV[1]), ARGV[2]
if ow then
  for i = 0, tonumber(on) - 1 do
    if grace > 0 then redis.call('PEXPIRE', base .. ow .. ':' .. i, grace)
    else redis.call('DEL', base .. ow .. ':' .. i) end
  end
end
redis.call('DEL', KEYS[1], ARGV[3] .. 'a', ARGV[3] .. 'p')
return 1
)lua";

// Stale temp: KEYS[1] chunk, ARGV[1] temp TTL ms, ARGV[2] min age ms. Deletes the chunk only if
// it still carries a TTL and is still that old: a writer may have published (PERSIST) it since
// the caller looked, and a published chunk must never go.
constexpr const char* kRemoveStaleLua = R"lua(
local left = redis.call('PTTL', KEYS[1])
if left < 0 or tonumber(ARGV[1]) - left < tonumber(ARGV[2]) then return 0 end
return redis.call('DEL', KEYS[1])
)lua";

// Open: KEYS[1] manifest, KEYS[2] access record, ARGV[1] now. The access record is written only
// while the manifest exists, so a removed session leaves none for a later republish to inherit.
constexpr const char* kOpenLua = R"lua(
local m = redis.call('GET', KEYS[1])
if m then redis.call('SET', KEYS[2], ARGV[1]) end
return m
)lua";

// Pin: KEYS[1] manifest, KEYS[2] pin record, ARGV[1] expiry. 0 if there is no such object (a pin
// set after a removal would otherwise pin whatever is published under the key later).
constexpr const char* kPinLua = R"lua(
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('SET', KEYS[2], ARGV[1])
return 1
)lua";

struct Keys {
  std::string base;      // "<prefix>:{K}:"
  std::string manifest;  // base + "m"
  std::string chunks;    // base + "d:"
  std::string Chunk(std::string_view writer, uint64_t i) const {
    return chunks + std::string(writer) + ":" + std::to_string(i);
  }
};

Keys KeysFor(const RedisConfig& cfg, std::string_view key) {
  Keys k;
  k.base = cfg.prefix + ":{" + std::string(key) + "}:";
  k.manifest = k.base + "m";
  k.chunks = k.base + "d:";
  return k;
}

class RedisWritable final : public WritableObject, public store_internal::Crashable {
 public:
  RedisWritable(std::shared_ptr<Pool> pool, redisContext* c, std::string key)
      : pool_(std::move(pool)),
        lease_(pool_, c),
        key_(std::move(key)),
        keys_(KeysFor(pool_->cfg(), key_)),
        writer_(RandomWriterId()) {
    staging_.reserve(pool_->cfg().chunk_bytes);
  }
  ~RedisWritable() override {
    if (state_ == State::kOpen || state_ == State::kFailed) (void)Cleanup();
  }

  Status Append(std::span<const uint8_t> src) override {
    if (state_ != State::kOpen) return Closed("append");
    const uint64_t chunk = pool_->cfg().chunk_bytes;
    while (!src.empty()) {
      if (staging_.empty() && src.size() >= chunk) {
        Status s = SendChunk(src.first(chunk));
        if (!s.ok()) return Fail(s);
        src = src.subspan(chunk);
        written_ += chunk;
        continue;
      }
      const size_t n = std::min<size_t>(chunk - staging_.size(), src.size());
      staging_.insert(staging_.end(), src.begin(), src.begin() + n);
      src = src.subspan(n);
      written_ += n;
      if (staging_.size() == chunk) {
        Status s = SendChunk(staging_);
        staging_.clear();
        if (!s.ok()) return Fail(s);
      }
    }
    return Status::Ok();
  }

  Status Commit() override {
    if (state_ == State::kFailed) return failure_;
    if (state_ != State::kOpen) return Closed("commit");
    if (!staging_.empty()) {
      Status s = SendChunk(staging_);
      staging_.clear();
      if (!s.ok()) return Fail(s);
    }
    Status s = Drain();
    if (!s.ok()) return Fail(s);
    Manifest m;
    m.size = written_;
    m.chunk = pool_->cfg().chunk_bytes;
    m.nchunks = sent_;
    m.xxh = XXH3_64bits_digest(hash_.get());
    m.writer = writer_;
    m.mtime_ns = store_internal::NowUnixNs();
    const std::string text = FormatManifest(m);
    const std::string grace = std::to_string(pool_->cfg().grace_ms);
    const std::string n = std::to_string(sent_);
    auto r = Command(*pool_, lease_,
                     {"EVAL", kPublishLua, "1", keys_.manifest, text, grace, keys_.chunks, writer_, n},
                     "publish " + key_);
    if (!r.ok()) return Fail(r.status());
    state_ = State::kCommitted;
    return Status::Ok();
  }

  Status Abort() override {
    if (state_ == State::kCrashed) return Status::IoError("redis writer of " + key_ + " crashed");
    if (state_ != State::kOpen && state_ != State::kFailed) return Closed("abort");
    state_ = State::kAborted;
    return Cleanup();
  }

  uint64_t BytesWritten() const override { return written_; }

  void SimulateCrash() override {
    state_ = State::kCrashed;
    lease_.MarkDirty();  // drop the connection with whatever is in flight, run no cleanup
  }

 private:
  enum class State { kOpen, kFailed, kCommitted, kAborted, kCrashed };

  struct HashFree {
    void operator()(XXH3_state_t* s) const { XXH3_freeState(s); }
  };
  static std::unique_ptr<XXH3_state_t, HashFree> NewHash() {
    std::unique_ptr<XXH3_state_t, HashFree> h(XXH3_createState());
    XXH3_64bits_reset(h.get());
    return h;
  }

  Status Closed(std::string_view what) const {
    if (state_ == State::kCrashed) return Status::IoError("redis writer of " + key_ + " crashed");
    return Status::InvalidArgument(std::string(what) + " on a finished writer of " + key_);
  }
  Status Fail(Status s) {
    if (state_ == State::kOpen) {
      state_ = State::kFailed;
      failure_ = s;
    }
    return s;
  }

  Status SendChunk(std::span<const uint8_t> data) {
    XXH3_64bits_update(hash_.get(), data.data(), data.size());
    const std::string k = keys_.Chunk(writer_, sent_);
    const std::string ttl = std::to_string(pool_->cfg().temp_ttl_ms);
    AppendCmd(lease_.get(), {"SET", k,
                          std::string_view(reinterpret_cast<const char*>(data.data()), data.size()),
                          "PX", ttl});
    ++sent_;
    ++pending_;
    // Send now (hiredis would wait for the next read): the server stores chunk i while chunk
    // i+1 is staged, and what was sent is on the server even if this process dies next.
    int done = 0;
    while (!done) {
      if (redisBufferWrite(lease_.get(), &done) != REDIS_OK) {
        lease_.MarkDirty();
        return ConnError(*pool_, lease_.get(), "SET chunk of " + key_);
      }
    }
    if (pending_ >= pool_->cfg().depth) {
      auto r = GetReply(*pool_, lease_.get(), "SET chunk of " + key_);
      --pending_;
      if (!r.ok()) {
        lease_.MarkDirty();
        return r.status();
      }
    }
    return Status::Ok();
  }

  Status Drain() {
    Status first;
    while (pending_ > 0) {
      auto r = GetReply(*pool_, lease_.get(), "SET chunk of " + key_);
      --pending_;
      if (!r.ok()) {
        lease_.MarkDirty();
        if (lease_.get()->err != 0) return r.status();
        if (first.ok()) first = r.status();
      }
    }
    return first;
  }

  // Deletes the chunks sent so far (they would expire anyway).
  Status Cleanup() {
    if (lease_.get()->err != 0) return Status::IoError("redis connection broken; temps expire");
    Status s = Drain();
    if (sent_ == 0) return s;
    std::vector<std::string> keys;
    for (uint64_t i = 0; i < sent_; ++i) keys.push_back(keys_.Chunk(writer_, i));
    std::vector<std::string_view> args{"DEL"};
    for (const auto& k : keys) args.push_back(k);
    auto r = Command(*pool_, lease_, args, "DEL temps of " + key_);
    sent_ = 0;
    return r.ok() ? s : r.status();
  }

  std::shared_ptr<Pool> pool_;
  Lease lease_;
  std::string key_;
  Keys keys_;
  std::string writer_;
  std::vector<uint8_t> staging_;
  std::unique_ptr<XXH3_state_t, HashFree> hash_ = NewHash();
  uint64_t written_ = 0;
  uint64_t sent_ = 0;
  uint64_t pending_ = 0;
  State state_ = State::kOpen;
  Status failure_;
};

class RedisReadable final : public ReadableObject {
 public:
  RedisReadable(std::shared_ptr<Pool> pool, std::string key, Manifest m)
      : pool_(std::move(pool)), key_(std::move(key)), keys_(KeysFor(pool_->cfg(), key_)), m_(m) {}

  uint64_t Size() const override { return m_.size; }

  Status ReadAt(uint64_t offset, std::span<uint8_t> dst) override {
    ReadRequest r{offset, dst};
    return ReadBatch(std::span<const ReadRequest>(&r, 1));
  }

  Status ReadBatch(std::span<const ReadRequest> reqs) override {
    struct Piece {
      uint64_t chunk, start, len;
      uint8_t* dst;
    };
    std::vector<Piece> pieces;
    for (const ReadRequest& r : reqs) {
      if (r.offset > m_.size || r.dst.size() > m_.size - r.offset) {
        return Status::Corruption("redis object " + key_ + ": read of " +
                                  std::to_string(r.dst.size()) + " bytes at offset " +
                                  std::to_string(r.offset) + " is past its end (" +
                                  std::to_string(m_.size) + " bytes)");
      }
      uint64_t off = r.offset;
      uint64_t done = 0;
      while (done < r.dst.size()) {
        const uint64_t c = off / m_.chunk;
        const uint64_t in = off % m_.chunk;
        const uint64_t n = std::min<uint64_t>(m_.chunk - in, r.dst.size() - done);
        pieces.push_back({c, in, n, r.dst.data() + done});
        off += n;
        done += n;
      }
    }
    if (pieces.empty()) return Status::Ok();
    TQKV_ASSIGN_OR_RETURN(redisContext * c, pool_->Get());
    Lease lease(pool_, c);
    const uint32_t depth = pool_->cfg().depth;
    size_t next = 0;
    size_t in_flight = 0;
    Status first;
    auto send = [&](const Piece& p) {
      const std::string k = keys_.Chunk(m_.writer, p.chunk);
      const uint64_t chunk_len = std::min<uint64_t>(m_.chunk, m_.size - p.chunk * m_.chunk);
      if (p.start == 0 && p.len == chunk_len) {
        AppendCmd(c, {"GET", k});
      } else {
        const std::string a = std::to_string(p.start), b = std::to_string(p.start + p.len - 1);
        AppendCmd(c, {"GETRANGE", k, a, b});
      }
    };
    for (size_t done = 0; done < pieces.size(); ++done) {
      while (next < pieces.size() && in_flight < depth) {
        send(pieces[next++]);
        ++in_flight;
      }
      const Piece& p = pieces[done];
      auto r = GetReply(*pool_, c, "read of " + key_);
      --in_flight;
      if (!r.ok()) {
        lease.MarkDirty();
        if (c->err != 0) return r.status();
        if (first.ok()) first = r.status();
        continue;
      }
      const redisReply* rep = r->get();
      if (rep->type != REDIS_REPLY_STRING || rep->len != p.len) {
        if (first.ok()) {
          first = Status::NotFound(
              "redis object " + key_ + ": chunk " + std::to_string(p.chunk) + " of version " +
              m_.writer + " is gone (the object was replaced or removed more than the grace "
              "period ago while this reader had it open); open it again");
        }
        continue;
      }
      std::memcpy(p.dst, rep->str, p.len);
      bytes_read_ += p.len;
    }
    TQKV_RETURN_IF_ERROR(first);
    // A whole-object read is checked against the writer's checksum.
    if (reqs.size() == 1 && reqs[0].offset == 0 && reqs[0].dst.size() == m_.size) {
      const uint64_t h = XXH3_64bits(reqs[0].dst.data(), reqs[0].dst.size());
      if (h != m_.xxh) {
        return Status::Corruption("redis object " + key_ + ": checksum mismatch (xxh3 " + Hex64(h) +
                                  ", manifest says " + Hex64(m_.xxh) + ")");
      }
    }
    return Status::Ok();
  }

  uint64_t BytesRead() const override { return bytes_read_; }

 private:
  std::shared_ptr<Pool> pool_;
  std::string key_;
  Keys keys_;
  Manifest m_;
  std::atomic<uint64_t> bytes_read_{0};
};

class RedisStore final : public Store, public SessionAdmin {
 public:
  explicit RedisStore(RedisConfig cfg) : pool_(std::make_shared<Pool>(std::move(cfg))) {}

  std::string_view Name() const override { return "redis"; }
  std::string Uri() const override { return pool_->cfg().uri; }
  StoreCaps Caps() const override { return StoreCaps{}; }

  Result<std::unique_ptr<WritableObject>> Create(std::string_view key) override {
    TQKV_RETURN_IF_ERROR(ValidateKey(key));
    TQKV_ASSIGN_OR_RETURN(redisContext * c, pool_->Get());
    return std::unique_ptr<WritableObject>(
        std::make_unique<RedisWritable>(pool_, c, std::string(key)));
  }

  Result<std::unique_ptr<ReadableObject>> Open(std::string_view key) override {
    TQKV_RETURN_IF_ERROR(ValidateKey(key));
    const Keys k = KeysFor(pool_->cfg(), key);
    TQKV_ASSIGN_OR_RETURN(redisContext * c, pool_->Get());
    Lease lease(pool_, c);
    // Last access time for LRU eviction across processes (tqkv gc), set with the manifest read.
    const std::string now = std::to_string(store_internal::NowUnixNs());
    const std::string access = k.base + "a";
    TQKV_ASSIGN_OR_RETURN(Reply r, Command(*pool_, lease,
                                           {"EVAL", kOpenLua, "2", k.manifest, access, now},
                                           "open " + std::string(key)));
    if (r->type == REDIS_REPLY_NIL) {
      return Status::NotFound("redis: no object " + std::string(key) + " in " + Uri());
    }
    if (r->type != REDIS_REPLY_STRING) {
      return Status::Corruption("redis: manifest of " + std::string(key) + " is not a string");
    }
    TQKV_ASSIGN_OR_RETURN(Manifest m, ParseManifest(std::string_view(r->str, r->len), key));
    return std::unique_ptr<ReadableObject>(
        std::make_unique<RedisReadable>(pool_, std::string(key), m));
  }

  Status Remove(std::string_view key) override { return RemoveChecked(key, ""); }

  Status RemoveIfUnchanged(const SessionMeta& listed) override {
    if (listed.version.empty()) {
      return Status::InvalidArgument("redis: remove of " + listed.key + " names no version");
    }
    return RemoveChecked(listed.key, listed.version);
  }

  Status SetPin(std::string_view key, int64_t until_ns) override {
    TQKV_RETURN_IF_ERROR(ValidateKey(key));
    const Keys k = KeysFor(pool_->cfg(), key);
    TQKV_ASSIGN_OR_RETURN(redisContext * c, pool_->Get());
    Lease lease(pool_, c);
    if (until_ns == 0) return Command(*pool_, lease, {"DEL", k.base + "p"}, "unpin").status();
    const std::string pin = k.base + "p", until = std::to_string(until_ns);
    TQKV_ASSIGN_OR_RETURN(
        Reply r, Command(*pool_, lease, {"EVAL", kPinLua, "2", k.manifest, pin, until},
                         "pin " + std::string(key)));
    if (r->type == REDIS_REPLY_INTEGER && r->integer == 0) {
      return Status::NotFound("redis: no object " + std::string(key) + " in " + Uri());
    }
    return Status::Ok();
  }

  Result<std::vector<SessionMeta>> ListSessions() override {
    const std::string head = pool_->cfg().prefix + ":{";
    TQKV_ASSIGN_OR_RETURN(std::vector<std::string> manifests, Scan(head + "*}:m"));
    std::vector<SessionMeta> out;
    if (manifests.empty()) return out;
    TQKV_ASSIGN_OR_RETURN(redisContext * c, pool_->Get());
    Lease lease(pool_, c);
    for (const auto& m : manifests) {
      const std::string base = m.substr(0, m.size() - 1);
      AppendCmd(c, {"MGET", m, base + "a", base + "p"});
    }
    for (const auto& m : manifests) {
      auto r = GetReply(*pool_, c, "MGET");
      if (!r.ok()) {
        lease.MarkDirty();
        return r.status();
      }
      const redisReply* rep = r->get();
      if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 3 ||
          rep->element[0]->type != REDIS_REPLY_STRING) {
        continue;
      }
      const std::string key = m.substr(head.size(), m.size() - head.size() - 3);
      auto parsed = ParseManifest(std::string_view(rep->element[0]->str, rep->element[0]->len), key);
      if (!parsed.ok()) continue;
      SessionMeta meta;
      meta.key = key;
      meta.size = parsed->size;
      meta.mtime_ns = parsed->mtime_ns;
      meta.version = parsed->writer;
      if (rep->element[1]->type == REDIS_REPLY_STRING) meta.atime_ns = std::atoll(rep->element[1]->str);
      if (rep->element[2]->type == REDIS_REPLY_STRING) meta.pin_until_ns = std::atoll(rep->element[2]->str);
      out.push_back(std::move(meta));
    }
    std::sort(out.begin(), out.end(),
              [](const SessionMeta& a, const SessionMeta& b) { return a.key < b.key; });
    return out;
  }

  // expect_writer: "" removes whatever version is published.
  Status RemoveChecked(std::string_view key, const std::string& expect_writer) {
    TQKV_RETURN_IF_ERROR(ValidateKey(key));
    const Keys k = KeysFor(pool_->cfg(), key);
    TQKV_ASSIGN_OR_RETURN(redisContext * c, pool_->Get());
    Lease lease(pool_, c);
    const std::string grace = std::to_string(pool_->cfg().grace_ms);
    TQKV_ASSIGN_OR_RETURN(Reply r, Command(*pool_, lease,
                                           {"EVAL", kRemoveLua, "1", k.manifest, grace, k.chunks,
                                            k.base, expect_writer},
                                           "remove " + std::string(key)));
    if (r->type == REDIS_REPLY_INTEGER && r->integer == 0) {
      return Status::NotFound("redis: no object " + std::string(key) + " in " + Uri());
    }
    if (r->type == REDIS_REPLY_INTEGER && r->integer == -1) {
      return Status::Busy("redis: object " + std::string(key) + " was published again; kept");
    }
    return Status::Ok();
  }

  Result<std::vector<ObjectInfo>> List(std::string_view prefix) override {
    std::vector<ObjectInfo> out;
    for (char ch : prefix) {
      if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
            ch == '.' || ch == '_' || ch == '-' || ch == '/')) {
        return out;  // no valid key has this prefix
      }
    }
    const std::string head = pool_->cfg().prefix + ":{";
    TQKV_ASSIGN_OR_RETURN(std::vector<std::string> manifests,
                          Scan(head + std::string(prefix) + "*}:m"));
    if (manifests.empty()) return out;
    TQKV_ASSIGN_OR_RETURN(redisContext * c, pool_->Get());
    Lease lease(pool_, c);
    for (const auto& m : manifests) AppendCmd(c, {"GET", m});
    Status first;
    for (const auto& m : manifests) {
      auto r = GetReply(*pool_, c, "GET manifest");
      if (!r.ok()) {
        lease.MarkDirty();
        return r.status();
      }
      if ((*r)->type != REDIS_REPLY_STRING) continue;  // removed since the scan
      const std::string key = m.substr(head.size(), m.size() - head.size() - 3);
      auto parsed = ParseManifest(std::string_view((*r)->str, (*r)->len), key);
      if (!parsed.ok()) continue;
      out.push_back({key, parsed->size, parsed->mtime_ns});
    }
    std::sort(out.begin(), out.end(),
              [](const ObjectInfo& a, const ObjectInfo& b) { return a.key < b.key; });
    return out;
  }

  // Temp chunks (those still carrying the writer's TTL) whose age, temp_ttl - PTTL, is at least
  // min_age. Chunks of replaced versions in their grace period count as well: they are garbage.
  // The PTTL pass only picks candidates; each is checked again and deleted in one script.
  Result<uint64_t> RemoveStaleTemps(std::chrono::seconds min_age) override {
    TQKV_ASSIGN_OR_RETURN(std::vector<std::string> chunks,
                          Scan(pool_->cfg().prefix + ":{*}:d:*"));
    if (chunks.empty()) return uint64_t{0};
    TQKV_ASSIGN_OR_RETURN(redisContext * c, pool_->Get());
    Lease lease(pool_, c);
    for (const auto& k : chunks) AppendCmd(c, {"PTTL", k});
    std::vector<std::string> stale;
    const int64_t ttl = static_cast<int64_t>(pool_->cfg().temp_ttl_ms);
    const int64_t min_ms = static_cast<int64_t>(min_age.count()) * 1000;
    for (const auto& k : chunks) {
      auto r = GetReply(*pool_, c, "PTTL");
      if (!r.ok()) {
        lease.MarkDirty();
        return r.status();
      }
      const long long left = (*r)->integer;
      if (left < 0) continue;  // published (no TTL) or gone
      if (ttl - left >= min_ms) stale.push_back(k);
    }
    const std::string ttl_arg = std::to_string(ttl), min_arg = std::to_string(min_ms);
    for (const auto& k : stale) AppendCmd(c, {"EVAL", kRemoveStaleLua, "1", k, ttl_arg, min_arg});
    uint64_t removed = 0;
    for (size_t i = 0; i < stale.size(); ++i) {
      auto r = GetReply(*pool_, c, "remove stale temp");
      if (!r.ok()) {
        lease.MarkDirty();
        return r.status();
      }
      removed += static_cast<uint64_t>((*r)->integer);
    }
    return removed;
  }

  Status Ping() {
    TQKV_ASSIGN_OR_RETURN(redisContext * c, pool_->Get());
    Lease lease(pool_, c);
    return Command(*pool_, lease, {"PING"}, "PING").status();
  }

  Result<std::vector<std::string>> Scan(const std::string& pattern) {
    TQKV_ASSIGN_OR_RETURN(redisContext * c, pool_->Get());
    Lease lease(pool_, c);
    std::vector<std::string> out;
    std::string cursor = "0";
    for (int guard = 0; guard < 1'000'000; ++guard) {
      TQKV_ASSIGN_OR_RETURN(Reply r, Command(*pool_, lease,
                                             {"SCAN", cursor, "MATCH", pattern, "COUNT", "1000"},
                                             "SCAN"));
      if (r->type != REDIS_REPLY_ARRAY || r->elements != 2) {
        return Status::IoError("redis: unexpected SCAN reply");
      }
      cursor.assign(r->element[0]->str, r->element[0]->len);
      const redisReply* keys = r->element[1];
      for (size_t i = 0; i < keys->elements; ++i) {
        out.emplace_back(keys->element[i]->str, keys->element[i]->len);
      }
      if (cursor == "0") break;
    }
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
  }

 private:
  std::shared_ptr<Pool> pool_;
};

bool IsPrefixChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-' || c == '/';
}

}  // namespace

Result<std::unique_ptr<Store>> OpenRedisStoreFromUri(const StoreUri& uri) {
  RedisConfig cfg;
  std::string path = uri.path;
  if (uri.scheme == "redis+unix") {
    if (!uri.authority.empty() && uri.authority != "localhost") {
      return Status::InvalidArgument("redis+unix:// takes no host: redis+unix:///path/to.sock/prefix");
    }
    // The socket is the path up to the first segment ending in ".sock"; the rest is the prefix.
    const size_t at = path.find(".sock");
    if (at == std::string::npos) {
      return Status::InvalidArgument("redis+unix:// path " + path +
                                     " names no socket ending in \".sock\"");
    }
    cfg.socket = path.substr(0, at + 5);
    path = path.substr(at + 5);
  } else {
    std::string auth = uri.authority;
    if (auth.empty()) auth = "127.0.0.1";
    const size_t colon = auth.rfind(':');
    cfg.host = auth.substr(0, colon);
    if (colon != std::string::npos) {
      const std::string p = auth.substr(colon + 1);
      int port = 0;
      auto [ptr, ec] = std::from_chars(p.data(), p.data() + p.size(), port);
      if (ec != std::errc() || ptr != p.data() + p.size() || port <= 0 || port > 65535) {
        return Status::InvalidArgument("redis:// bad port \"" + p + "\"");
      }
      cfg.port = port;
    }
  }
  while (!path.empty() && path.front() == '/') path.erase(0, 1);
  while (!path.empty() && path.back() == '/') path.pop_back();
  if (!path.empty()) cfg.prefix = path;
  if (cfg.prefix.size() > 100 || !std::all_of(cfg.prefix.begin(), cfg.prefix.end(), IsPrefixChar)) {
    return Status::InvalidArgument("redis:// key prefix \"" + cfg.prefix +
                                   "\" must be 1..100 bytes of [A-Za-z0-9._-/]");
  }
  store_internal::UriOptions opts(uri);
  TQKV_RETURN_IF_ERROR(opts.GetUint("chunk", 4096, 512u << 20, &cfg.chunk_bytes));
  uint64_t depth = cfg.depth;
  TQKV_RETURN_IF_ERROR(opts.GetUint("depth", 1, 256, &depth));
  cfg.depth = static_cast<uint32_t>(depth);
  uint64_t ttl_s = cfg.temp_ttl_ms / 1000, grace_s = cfg.grace_ms / 1000;
  TQKV_RETURN_IF_ERROR(opts.GetUint("temp_ttl", 1, 7 * 86400, &ttl_s));
  TQKV_RETURN_IF_ERROR(opts.GetUint("grace", 0, 86400, &grace_s));
  cfg.temp_ttl_ms = ttl_s * 1000;
  cfg.grace_ms = grace_s * 1000;
  uint64_t timeout_s = cfg.timeout_ms / 1000;
  TQKV_RETURN_IF_ERROR(opts.GetUint("timeout", 1, 3600, &timeout_s));
  cfg.timeout_ms = timeout_s * 1000;
  if (const std::string* io = opts.Find("io")) {
    TQKV_ASSIGN_OR_RETURN(IoMode mode, ParseIoMode(*io));
    if (mode != IoMode::kBuffered) {
      return Status::InvalidArgument("redis:// store supports only io=buffered (network I/O), not io=" +
                                     *io);
    }
  }
  TQKV_RETURN_IF_ERROR(opts.Finish());
  cfg.uri = uri.scheme + "://" + (cfg.host.empty() ? cfg.socket : cfg.host + ":" +
                                  std::to_string(cfg.port)) + "/" + cfg.prefix;
  auto store = std::make_unique<RedisStore>(std::move(cfg));
  // Fail early on an unreachable server.
  TQKV_RETURN_IF_ERROR(store->Ping());
  return std::unique_ptr<Store>(std::move(store));
}

}  // namespace tqkv
