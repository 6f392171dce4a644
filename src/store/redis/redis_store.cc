// Redis store through hiredis: chunked objects, publish by one Lua script, pipelined reads.
#include "store/redis/redis_store.h"

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

#include "store/redis/redis_cluster.h"
#include "store/redis/redis_conn.h"
#include "store/redis/redis_router.h"
#include "store/publishing_writer.h"
#include "tqkv/store_admin.h"
#include "store/store_internal.h"

namespace tqkv {
namespace {

using redis::AppendCmd;
using redis::ConnError;
using redis::GetReply;
using redis::Lease;
using redis::ParseRedirect;
using redis::Pool;
using redis::ReadReply;
using redis::RedisConfig;
using redis::Reply;
using redis::ReplyError;
using redis::Router;

// Sends one command on the lease (the node an object talks to). In a cluster a redirected reply
// (the slot moved since the object was opened) is re-sent through the router, which follows it.
Result<Reply> RunOnLease(Router& router, Lease& lease, std::string_view route_key,
                         const std::vector<std::string_view>& args, std::string_view what) {
  AppendCmd(lease.get(), args);
  auto r = ReadReply(lease.pool(), lease.get(), what);
  if (!r.ok()) {
    lease.MarkDirty();
    return r.status();
  }
  if ((*r)->type != REDIS_REPLY_ERROR) return r;
  if (router.FollowsRedirects() && ParseRedirect(**r)) {
    lease.pool().NoteRedirect();
    return router.Exec(route_key, args, what);
  }
  return ReplyError(lease.pool(), **r, what);
}

// One command per entry of `cmds`, pipelined on `pool` (where a SCAN found their keys); replies in
// order, error replies as a Status. In a cluster, a reply redirected because the key's slot moved
// since the SCAN is re-sent through the router (routed by route_keys[i]).
Result<std::vector<Reply>> PipelineOnNode(Router& router, const std::shared_ptr<Pool>& pool,
                                          const std::vector<std::vector<std::string>>& cmds,
                                          const std::vector<std::string>& route_keys,
                                          std::string_view what) {
  std::vector<Reply> out(cmds.size());
  if (cmds.empty()) return out;
  TQKV_ASSIGN_OR_RETURN(redisContext * c, pool->Get());
  Lease lease(pool, c);
  for (const auto& cmd : cmds) AppendCmd(c, std::vector<std::string_view>(cmd.begin(), cmd.end()));
  std::vector<size_t> redo;
  for (size_t i = 0; i < cmds.size(); ++i) {
    auto r = ReadReply(*pool, c, what);
    if (!r.ok()) {
      lease.MarkDirty();
      return r.status();
    }
    if ((*r)->type == REDIS_REPLY_ERROR) {
      if (router.FollowsRedirects() && ParseRedirect(**r)) {
        pool->NoteRedirect();
        redo.push_back(i);
        continue;
      }
      lease.MarkDirty();  // replies left unread
      return ReplyError(*pool, **r, what);
    }
    out[i] = std::move(r).value();
  }
  for (size_t i : redo) {
    TQKV_ASSIGN_OR_RETURN(out[i], router.Exec(route_keys[i], std::vector<std::string_view>(
                                                                 cmds[i].begin(), cmds[i].end()),
                                              what));
  }
  return out;
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

class RedisWritable final : public store_internal::PublishingWriter {
 public:
  RedisWritable(std::shared_ptr<Router> router, std::shared_ptr<Pool> pool, redisContext* c,
                std::string key)
      : PublishingWriter("redis", key),
        router_(std::move(router)),
        pool_(std::move(pool)),
        lease_(pool_, c),
        key_(std::move(key)),
        keys_(KeysFor(pool_->cfg(), key_)),
        writer_(RandomWriterId()) {
    staging_.reserve(pool_->cfg().chunk_bytes);
  }
  ~RedisWritable() override { DiscardIfUnfinished(); }

  uint64_t BytesWritten() const override { return written_; }

 private:
  Status AppendBytes(std::span<const uint8_t> src) override {
    const uint64_t chunk = pool_->cfg().chunk_bytes;
    while (!src.empty()) {
      if (staging_.empty() && src.size() >= chunk) {
        TQKV_RETURN_IF_ERROR(SendChunk(src.first(chunk)));
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
        TQKV_RETURN_IF_ERROR(s);
      }
    }
    return Status::Ok();
  }

  Status Publish() override {
    if (!staging_.empty()) {
      Status s = SendChunk(staging_);
      staging_.clear();
      TQKV_RETURN_IF_ERROR(s);
    }
    TQKV_RETURN_IF_ERROR(Drain());
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
    auto r = RunOnLease(*router_, lease_, keys_.manifest,
                        {"EVAL", kPublishLua, "1", keys_.manifest, text, grace, keys_.chunks,
                         writer_, n},
                        "publish " + key_);
    return r.ok() ? Status::Ok() : r.status();
  }

  // Drop the connection with whatever is in flight and run no cleanup: the chunks expire.
  void Stop() override { lease_.MarkDirty(); }

  struct HashFree {
    void operator()(XXH3_state_t* s) const { XXH3_freeState(s); }
  };
  static std::unique_ptr<XXH3_state_t, HashFree> NewHash() {
    std::unique_ptr<XXH3_state_t, HashFree> h(XXH3_createState());
    XXH3_64bits_reset(h.get());
    return h;
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
  Status Discard() override {
    if (lease_.get()->err != 0) return Status::IoError("redis connection broken; temps expire");
    Status s = Drain();
    if (sent_ == 0) return s;
    std::vector<std::string> keys;
    for (uint64_t i = 0; i < sent_; ++i) keys.push_back(keys_.Chunk(writer_, i));
    std::vector<std::string_view> args{"DEL"};
    for (const auto& k : keys) args.push_back(k);
    auto r = RunOnLease(*router_, lease_, keys_.manifest, args, "DEL temps of " + key_);
    sent_ = 0;
    return r.ok() ? s : r.status();
  }

  std::shared_ptr<Router> router_;
  std::shared_ptr<Pool> pool_;  // the node of the session's slot when the writer was created
  Lease lease_;
  std::string key_;
  Keys keys_;
  std::string writer_;
  std::vector<uint8_t> staging_;
  std::unique_ptr<XXH3_state_t, HashFree> hash_ = NewHash();
  uint64_t written_ = 0;
  uint64_t sent_ = 0;
  uint64_t pending_ = 0;
};

class RedisReadable final : public ReadableObject {
 public:
  RedisReadable(std::shared_ptr<Router> router, std::string key, Manifest m)
      : router_(std::move(router)),
        key_(std::move(key)),
        keys_(KeysFor(router_->cfg(), key_)),
        m_(m) {}

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
    // The node is looked up per batch: a slot that moved since Open is followed.
    TQKV_ASSIGN_OR_RETURN(std::shared_ptr<Pool> pool, router_->PoolFor(keys_.manifest));
    TQKV_ASSIGN_OR_RETURN(redisContext * c, pool->Get());
    Lease lease(pool, c);
    const uint32_t depth = router_->cfg().depth;
    const std::string what = "read of " + key_;
    size_t next = 0;
    size_t in_flight = 0;
    Status first;
    struct Cmd {
      std::string key, from, to;  // from/to set: GETRANGE
    };
    auto cmd_for = [&](const Piece& p) {
      Cmd m{keys_.Chunk(m_.writer, p.chunk), "", ""};
      const uint64_t chunk_len = std::min<uint64_t>(m_.chunk, m_.size - p.chunk * m_.chunk);
      if (p.start != 0 || p.len != chunk_len) {
        m.from = std::to_string(p.start);
        m.to = std::to_string(p.start + p.len - 1);
      }
      return m;
    };
    auto argv = [](const Cmd& m) -> std::vector<std::string_view> {
      if (m.from.empty()) return {"GET", m.key};
      return {"GETRANGE", m.key, m.from, m.to};
    };
    auto take = [&](const Piece& p, const redisReply* rep) {
      if (rep->type != REDIS_REPLY_STRING || rep->len != p.len) {
        if (first.ok()) {
          first = Status::NotFound(
              "redis object " + key_ + ": chunk " + std::to_string(p.chunk) + " of version " +
              m_.writer + " is gone (the object was replaced or removed more than the grace "
              "period ago while this reader had it open); open it again");
        }
        return;
      }
      std::memcpy(p.dst, rep->str, p.len);
      bytes_read_ += p.len;
    };
    std::vector<size_t> redo;  // redirected pieces (cluster: the slot moved), re-sent one by one
    for (size_t done = 0; done < pieces.size(); ++done) {
      while (next < pieces.size() && in_flight < depth) {
        const Cmd m = cmd_for(pieces[next++]);
        AppendCmd(c, argv(m));
        ++in_flight;
      }
      const Piece& p = pieces[done];
      auto r = ReadReply(*pool, c, what);
      --in_flight;
      if (!r.ok()) {
        lease.MarkDirty();
        return r.status();
      }
      if ((*r)->type == REDIS_REPLY_ERROR) {
        if (router_->FollowsRedirects() && ParseRedirect(**r)) {
          pool->NoteRedirect();
          redo.push_back(done);
          continue;
        }
        lease.MarkDirty();
        if (first.ok()) first = ReplyError(*pool, **r, what);
        continue;
      }
      take(p, r->get());
    }
    for (size_t i : redo) {
      const Cmd m = cmd_for(pieces[i]);
      auto r = router_->Exec(m.key, argv(m), what);
      if (!r.ok()) {
        if (first.ok()) first = r.status();
        continue;
      }
      take(pieces[i], r->get());
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
  std::shared_ptr<Router> router_;
  std::string key_;
  Keys keys_;
  Manifest m_;
  std::atomic<uint64_t> bytes_read_{0};
};

class RedisStore final : public Store, public SessionAdmin {
 public:
  explicit RedisStore(std::shared_ptr<Router> router) : router_(std::move(router)) {}

  std::string_view Name() const override { return "redis"; }
  std::string Uri() const override { return cfg().uri; }
  StoreCaps Caps() const override { return StoreCaps{}; }

  Result<std::unique_ptr<WritableObject>> Create(std::string_view key) override {
    TQKV_RETURN_IF_ERROR(ValidateKey(key));
    const Keys k = KeysFor(cfg(), key);
    TQKV_ASSIGN_OR_RETURN(std::shared_ptr<Pool> pool, router_->PoolFor(k.manifest));
    TQKV_ASSIGN_OR_RETURN(redisContext * c, pool->Get());
    return std::unique_ptr<WritableObject>(
        std::make_unique<RedisWritable>(router_, std::move(pool), c, std::string(key)));
  }

  Result<std::unique_ptr<ReadableObject>> Open(std::string_view key) override {
    TQKV_RETURN_IF_ERROR(ValidateKey(key));
    const Keys k = KeysFor(cfg(), key);
    // Last access time for LRU eviction across processes (tqkv gc), set with the manifest read.
    const std::string now = std::to_string(store_internal::NowUnixNs());
    const std::string access = k.base + "a";
    TQKV_ASSIGN_OR_RETURN(Reply r, router_->Exec(k.manifest,
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
        std::make_unique<RedisReadable>(router_, std::string(key), m));
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
    const Keys k = KeysFor(cfg(), key);
    const std::string pin = k.base + "p";
    if (until_ns == 0) return router_->Exec(k.manifest, {"DEL", pin}, "unpin").status();
    const std::string until = std::to_string(until_ns);
    TQKV_ASSIGN_OR_RETURN(
        Reply r, router_->Exec(k.manifest, {"EVAL", kPinLua, "2", k.manifest, pin, until},
                               "pin " + std::string(key)));
    if (r->type == REDIS_REPLY_INTEGER && r->integer == 0) {
      return Status::NotFound("redis: no object " + std::string(key) + " in " + Uri());
    }
    return Status::Ok();
  }

  Result<std::vector<SessionMeta>> ListSessions() override {
    const std::string head = cfg().prefix + ":{";
    TQKV_ASSIGN_OR_RETURN(std::vector<NodeKeys> nodes, ScanAll(head + "*}:m"));
    std::vector<SessionMeta> out;
    for (const NodeKeys& node : nodes) {
      std::vector<std::vector<std::string>> cmds;
      for (const auto& m : node.keys) {
        const std::string base = m.substr(0, m.size() - 1);
        cmds.push_back({"MGET", m, base + "a", base + "p"});
      }
      TQKV_ASSIGN_OR_RETURN(std::vector<Reply> replies,
                            PipelineOnNode(*router_, node.pool, cmds, node.keys, "MGET"));
      for (size_t i = 0; i < node.keys.size(); ++i) {
        const std::string& m = node.keys[i];
        const redisReply* rep = replies[i].get();
        if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 3 ||
            rep->element[0]->type != REDIS_REPLY_STRING) {
          continue;
        }
        const std::string key = m.substr(head.size(), m.size() - head.size() - 3);
        auto parsed =
            ParseManifest(std::string_view(rep->element[0]->str, rep->element[0]->len), key);
        if (!parsed.ok()) continue;
        SessionMeta meta;
        meta.key = key;
        meta.size = parsed->size;
        meta.mtime_ns = parsed->mtime_ns;
        meta.version = parsed->writer;
        if (rep->element[1]->type == REDIS_REPLY_STRING) {
          meta.atime_ns = std::atoll(rep->element[1]->str);
        }
        if (rep->element[2]->type == REDIS_REPLY_STRING) {
          meta.pin_until_ns = std::atoll(rep->element[2]->str);
        }
        out.push_back(std::move(meta));
      }
    }
    std::sort(out.begin(), out.end(),
              [](const SessionMeta& a, const SessionMeta& b) { return a.key < b.key; });
    // A session whose slot moved between two nodes' SCANs can be seen twice.
    auto same = [](const SessionMeta& a, const SessionMeta& b) { return a.key == b.key; };
    out.erase(std::unique(out.begin(), out.end(), same), out.end());
    return out;
  }

  // expect_writer: "" removes whatever version is published.
  Status RemoveChecked(std::string_view key, const std::string& expect_writer) {
    TQKV_RETURN_IF_ERROR(ValidateKey(key));
    const Keys k = KeysFor(cfg(), key);
    const std::string grace = std::to_string(cfg().grace_ms);
    TQKV_ASSIGN_OR_RETURN(Reply r, router_->Exec(k.manifest,
                                                 {"EVAL", kRemoveLua, "1", k.manifest, grace,
                                                  k.chunks, k.base, expect_writer},
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
    if (!store_internal::CouldPrefixAKey(prefix)) return out;
    const std::string head = cfg().prefix + ":{";
    TQKV_ASSIGN_OR_RETURN(std::vector<NodeKeys> nodes,
                          ScanAll(head + std::string(prefix) + "*}:m"));
    for (const NodeKeys& node : nodes) {
      std::vector<std::vector<std::string>> cmds;
      for (const auto& m : node.keys) cmds.push_back({"GET", m});
      TQKV_ASSIGN_OR_RETURN(std::vector<Reply> replies,
                            PipelineOnNode(*router_, node.pool, cmds, node.keys, "GET manifest"));
      for (size_t i = 0; i < node.keys.size(); ++i) {
        const std::string& m = node.keys[i];
        const redisReply* rep = replies[i].get();
        if (rep->type != REDIS_REPLY_STRING) continue;  // removed since the scan
        const std::string key = m.substr(head.size(), m.size() - head.size() - 3);
        auto parsed = ParseManifest(std::string_view(rep->str, rep->len), key);
        if (!parsed.ok()) continue;
        out.push_back({key, parsed->size, parsed->mtime_ns});
      }
    }
    std::sort(out.begin(), out.end(),
              [](const ObjectInfo& a, const ObjectInfo& b) { return a.key < b.key; });
    out.erase(std::unique(out.begin(), out.end(),
                          [](const ObjectInfo& a, const ObjectInfo& b) { return a.key == b.key; }),
              out.end());
    return out;
  }

  // Temp chunks (those still carrying the writer's TTL) whose age, temp_ttl - PTTL, is at least
  // min_age. Chunks of replaced versions in their grace period count as well: they are garbage.
  // The PTTL pass only picks candidates; each is checked again and deleted in one script.
  Result<uint64_t> RemoveStaleTemps(std::chrono::seconds min_age) override {
    return SweepStaleTemps(min_age, /*remove=*/true);
  }
  // The candidates of the PTTL pass (the removal's script checks each again).
  Result<uint64_t> CountStaleTemps(std::chrono::seconds min_age) override {
    return SweepStaleTemps(min_age, /*remove=*/false);
  }

  Status Connect() { return router_->Connect(); }

 private:
  struct NodeKeys {
    std::shared_ptr<Pool> pool;
    std::vector<std::string> keys;
  };

  // remove false: count only (gc --dry-run).
  Result<uint64_t> SweepStaleTemps(std::chrono::seconds min_age, bool remove) {
    TQKV_ASSIGN_OR_RETURN(std::vector<NodeKeys> nodes, ScanAll(cfg().prefix + ":{*}:d:*"));
    const int64_t ttl = static_cast<int64_t>(cfg().temp_ttl_ms);
    const int64_t min_ms = static_cast<int64_t>(min_age.count()) * 1000;
    const std::string ttl_arg = std::to_string(ttl), min_arg = std::to_string(min_ms);
    uint64_t removed = 0;
    for (const NodeKeys& node : nodes) {
      std::vector<std::vector<std::string>> cmds;
      for (const auto& k : node.keys) cmds.push_back({"PTTL", k});
      TQKV_ASSIGN_OR_RETURN(std::vector<Reply> ttls,
                            PipelineOnNode(*router_, node.pool, cmds, node.keys, "PTTL"));
      std::vector<std::string> stale;
      for (size_t i = 0; i < node.keys.size(); ++i) {
        const long long left = ttls[i]->integer;
        if (left < 0) continue;  // published (no TTL) or gone
        if (ttl - left >= min_ms) stale.push_back(node.keys[i]);
      }
      if (!remove) {
        removed += stale.size();
        continue;
      }
      cmds.clear();
      for (const auto& k : stale) {
        cmds.push_back({"EVAL", kRemoveStaleLua, "1", k, ttl_arg, min_arg});
      }
      TQKV_ASSIGN_OR_RETURN(std::vector<Reply> dels,
                            PipelineOnNode(*router_, node.pool, cmds, stale, "remove stale temp"));
      for (const Reply& r : dels) removed += static_cast<uint64_t>(r->integer);
    }
    return removed;
  }

  const RedisConfig& cfg() const { return router_->cfg(); }

  // SCAN on every primary (one node unless clustered): the keys each holds.
  Result<std::vector<NodeKeys>> ScanAll(const std::string& pattern) {
    TQKV_ASSIGN_OR_RETURN(std::vector<std::shared_ptr<Pool>> pools, router_->Primaries());
    std::vector<NodeKeys> out;
    for (auto& pool : pools) {
      TQKV_ASSIGN_OR_RETURN(std::vector<std::string> keys, Scan(pool, pattern));
      if (!keys.empty()) out.push_back({std::move(pool), std::move(keys)});
    }
    return out;
  }

  static Result<std::vector<std::string>> Scan(const std::shared_ptr<Pool>& pool,
                                               const std::string& pattern) {
    TQKV_ASSIGN_OR_RETURN(redisContext * c, pool->Get());
    Lease lease(pool, c);
    std::vector<std::string> out;
    std::string cursor = "0";
    for (int guard = 0; guard < 1'000'000; ++guard) {
      TQKV_ASSIGN_OR_RETURN(
          Reply r, redis::Command(lease, {"SCAN", cursor, "MATCH", pattern, "COUNT", "1000"},
                                  "SCAN"));
      if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
          r->element[0]->type != REDIS_REPLY_STRING || r->element[1]->type != REDIS_REPLY_ARRAY) {
        return Status::IoError("redis: unexpected SCAN reply from " + pool->Where());
      }
      cursor.assign(r->element[0]->str, r->element[0]->len);
      const redisReply* keys = r->element[1];
      for (size_t i = 0; i < keys->elements; ++i) {
        if (keys->element[i]->type != REDIS_REPLY_STRING) continue;
        out.emplace_back(keys->element[i]->str, keys->element[i]->len);
      }
      if (cursor == "0") break;
    }
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
  }

  std::shared_ptr<Router> router_;
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
  } else if (uri.scheme == "redis+cluster") {
    // Seed nodes, comma-separated; any one that answers gives the whole slot map.
    cfg.cluster = true;
    std::string_view auth = uri.authority;
    if (auth.empty()) auth = "127.0.0.1:6379";
    while (true) {
      const size_t comma = auth.find(',');
      const std::string_view one = auth.substr(0, comma);
      const size_t colon = one.rfind(':');
      std::string host(one.substr(0, colon));
      int port = 6379;
      if (colon != std::string_view::npos) {
        const std::string_view p = one.substr(colon + 1);
        auto [ptr, ec] = std::from_chars(p.data(), p.data() + p.size(), port);
        if (ec != std::errc() || ptr != p.data() + p.size() || port <= 0 || port > 65535) {
          return Status::InvalidArgument("redis+cluster:// bad port \"" + std::string(p) +
                                         "\" in \"" + std::string(one) + "\"");
        }
      }
      if (host.empty() || host.size() > 255) {
        return Status::InvalidArgument("redis+cluster:// seed \"" + std::string(one) +
                                       "\" names no host (expected host:port[,host:port...])");
      }
      if (cfg.seeds.size() >= 64) {
        return Status::InvalidArgument("redis+cluster:// takes at most 64 seed nodes");
      }
      cfg.seeds.emplace_back(std::move(host), port);
      if (comma == std::string_view::npos) break;
      auth = auth.substr(comma + 1);
    }
    cfg.host = cfg.seeds.front().first;
    cfg.port = cfg.seeds.front().second;
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
  TQKV_RETURN_IF_ERROR(opts.GetBytes("chunk", 4096, 512u << 20, &cfg.chunk_bytes));
  uint64_t depth = cfg.depth;
  TQKV_RETURN_IF_ERROR(opts.GetCount("depth", 1, 256, &depth));
  cfg.depth = static_cast<uint32_t>(depth);
  uint64_t ttl_s = cfg.temp_ttl_ms / 1000, grace_s = cfg.grace_ms / 1000;
  TQKV_RETURN_IF_ERROR(opts.GetSeconds("temp_ttl", 1, 7 * 86400, &ttl_s));
  TQKV_RETURN_IF_ERROR(opts.GetSeconds("grace", 0, 86400, &grace_s));
  cfg.temp_ttl_ms = ttl_s * 1000;
  cfg.grace_ms = grace_s * 1000;
  uint64_t timeout_s = cfg.timeout_ms / 1000;
  TQKV_RETURN_IF_ERROR(opts.GetSeconds("timeout", 1, 3600, &timeout_s));
  cfg.timeout_ms = timeout_s * 1000;
  if (const std::string* io = opts.Find("io")) {
    TQKV_ASSIGN_OR_RETURN(IoMode mode, ParseIoMode(*io));
    if (mode != IoMode::kBuffered) {
      return Status::InvalidArgument("redis:// store supports only io=buffered (network I/O), not io=" +
                                     *io);
    }
  }
  TQKV_RETURN_IF_ERROR(opts.Finish());
  std::string nodes = cfg.host.empty() ? cfg.socket : cfg.host + ":" + std::to_string(cfg.port);
  if (cfg.cluster) {
    nodes.clear();
    for (const auto& [host, port] : cfg.seeds) {
      nodes += (nodes.empty() ? "" : ",") + host + ":" + std::to_string(port);
    }
  }
  cfg.uri = uri.scheme + "://" + nodes + "/" + cfg.prefix;
  std::shared_ptr<Router> router = cfg.cluster ? redis::MakeClusterRouter(std::move(cfg))
                                                : redis::MakeSingleNodeRouter(std::move(cfg));
  auto store = std::make_unique<RedisStore>(std::move(router));
  // Fail early on an unreachable server (cluster: read the slot map).
  TQKV_RETURN_IF_ERROR(store->Connect());
  return std::unique_ptr<Store>(std::move(store));
}

}  // namespace tqkv
