// Redis Cluster router: slot map, a pool per node, MOVED/ASK/TRYAGAIN handling.
#include "store/redis/redis_cluster.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <optional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "store/redis/redis_slot.h"

namespace tqkv::redis {
namespace {

// More node addresses than any real cluster has: a bad slot map cannot grow the cache unbounded.
constexpr size_t kMaxNodes = 2048;
// Nodes asked for the slot map per refresh (each may cost a connect timeout if it is down).
constexpr size_t kMaxRefreshCandidates = 8;

struct SlotRange {
  int first, last;
  std::string host;
  int port;
};

std::string Addr(const std::string& host, int port) { return host + ":" + std::to_string(port); }

// CLUSTER SLOTS: [[first, last, [host, port, id, ...], replica...], ...]. `asked_host` stands in
// for an empty or "?" host (a node that does not know its own address).
Result<std::vector<SlotRange>> ParseClusterSlots(const redisReply& r, const std::string& asked_host,
                                                 const std::string& where) {
  auto bad = [&](const std::string& why) {
    return Status::IoError("redis+cluster: bad CLUSTER SLOTS reply from " + where + ": " + why);
  };
  if (r.type != REDIS_REPLY_ARRAY) return bad("not an array");
  if (r.elements > kClusterSlots) return bad("more ranges than slots");
  std::vector<SlotRange> out;
  for (size_t i = 0; i < r.elements; ++i) {
    const redisReply* e = r.element[i];
    if (e == nullptr || e->type != REDIS_REPLY_ARRAY || e->elements < 3 ||
        e->element[0]->type != REDIS_REPLY_INTEGER || e->element[1]->type != REDIS_REPLY_INTEGER) {
      return bad("range " + std::to_string(i) + " is not [first, last, primary, ...]");
    }
    const long long first = e->element[0]->integer, last = e->element[1]->integer;
    if (first < 0 || last < first || last >= kClusterSlots) {
      return bad("range " + std::to_string(first) + "-" + std::to_string(last) +
                 " is outside 0-16383");
    }
    const redisReply* node = e->element[2];
    if (node->type != REDIS_REPLY_ARRAY || node->elements < 2 ||
        node->element[0]->type != REDIS_REPLY_STRING ||
        node->element[1]->type != REDIS_REPLY_INTEGER || node->element[1]->integer <= 0 ||
        node->element[1]->integer > 65535 || node->element[0]->len > 255) {
      return bad("the primary of range " + std::to_string(first) + "-" + std::to_string(last) +
                 " is not [host, port, ...]");
    }
    std::string host(node->element[0]->str, node->element[0]->len);
    if (host.empty() || host == "?") host = asked_host;
    out.push_back({static_cast<int>(first), static_cast<int>(last), std::move(host),
                   static_cast<int>(node->element[1]->integer)});
  }
  return out;
}

class ClusterRouter final : public Router {
 public:
  explicit ClusterRouter(RedisConfig cfg)
      : cfg_(std::move(cfg)), stale_(std::make_shared<std::atomic<bool>>(true)) {
    slots_.assign(kClusterSlots, -1);
  }

  const RedisConfig& cfg() const override { return cfg_; }
  bool FollowsRedirects() const override { return true; }

  Result<std::shared_ptr<Pool>> PoolFor(std::string_view key) override {
    return PoolForSlot(KeySlot(key));
  }

  Result<Reply> Exec(std::string_view key, const std::vector<std::string_view>& args,
                     std::string_view what) override {
    const int slot = KeySlot(key);
    std::shared_ptr<Pool> ask;  // set by ASK: the next send goes there, after ASKING
    std::string last;
    for (int attempt = 0; attempt < kMaxClusterTries; ++attempt) {
      std::shared_ptr<Pool> pool = std::move(ask);
      ask.reset();
      const bool asking = pool != nullptr;
      if (!asking) {
        TQKV_ASSIGN_OR_RETURN(pool, PoolForSlot(slot));
      }
      auto got = pool->Get();
      if (!got.ok()) {
        stale_->store(true);  // the node may have failed over: re-read the map next time
        return got.status();
      }
      Lease lease(pool, *got);
      if (asking) AppendCmd(lease.get(), {"ASKING"});
      AppendCmd(lease.get(), args);
      if (asking) {
        auto a = ReadReply(*pool, lease.get(), "ASKING");
        if (!a.ok()) {
          lease.MarkDirty();
          return a.status();
        }
      }
      auto r = ReadReply(*pool, lease.get(), what);
      if (!r.ok()) {
        lease.MarkDirty();
        stale_->store(true);
        return r.status();
      }
      if ((*r)->type != REDIS_REPLY_ERROR) return r;
      const std::optional<Redirect> d = ParseRedirect(**r);
      if (!d) return ReplyError(*pool, **r, what);
      last = std::string((*r)->str, (*r)->len) + " from " + pool->Where();
      switch (d->kind) {
        case Redirect::Kind::kMoved: {
          const std::string host = d->host.empty() ? pool->cfg().host : d->host;
          TQKV_RETURN_IF_ERROR(SetOwner(d->slot, host, d->port));
          stale_->store(true);  // the map is out of date: re-read it before the retry
          break;
        }
        case Redirect::Kind::kAsk: {
          const std::string host = d->host.empty() ? pool->cfg().host : d->host;
          TQKV_ASSIGN_OR_RETURN(ask, PoolForAddr(host, d->port));
          break;
        }
        case Redirect::Kind::kClusterDown:
          stale_->store(true);
          [[fallthrough]];
        case Redirect::Kind::kTryAgain:
          // A slot in migration (multi-key command split between nodes) or a failover: wait.
          std::this_thread::sleep_for(std::chrono::milliseconds(std::min(5 << attempt, 250)));
          break;
      }
    }
    return Status::IoError("redis " + std::string(what) + ": still redirected after " +
                           std::to_string(kMaxClusterTries) + " tries (last: " + last +
                           "); the cluster is resharding or failing over; retry later");
  }

  Result<std::vector<std::shared_ptr<Pool>>> Primaries() override {
    TQKV_RETURN_IF_ERROR(RefreshIfStale());
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<bool> seen(nodes_.size(), false);
    std::vector<std::shared_ptr<Pool>> out;
    for (int idx : slots_) {
      if (idx >= 0 && !seen[idx]) {
        seen[idx] = true;
        out.push_back(nodes_[idx].pool);
      }
    }
    if (out.empty()) return Status::IoError("redis+cluster: no node serves any slot");
    return out;
  }

  Status Connect() override {
    std::lock_guard<std::mutex> refresh(refresh_mu_);
    return Refresh();
  }

 private:
  struct Node {
    std::string host;
    int port;
    std::shared_ptr<Pool> pool;
  };

  Result<std::shared_ptr<Pool>> PoolForSlot(int slot) {
    TQKV_RETURN_IF_ERROR(RefreshIfStale());
    std::lock_guard<std::mutex> lock(mu_);
    const int idx = slots_[slot];
    if (idx < 0) {
      stale_->store(true);
      return Status::IoError("redis+cluster: hash slot " + std::to_string(slot) +
                             " is served by no node (cluster_state not ok?)");
    }
    return nodes_[idx].pool;
  }

  Result<std::shared_ptr<Pool>> PoolForAddr(const std::string& host, int port) {
    std::lock_guard<std::mutex> lock(mu_);
    TQKV_ASSIGN_OR_RETURN(int idx, NodeIndexLocked(host, port));
    return nodes_[idx].pool;
  }

  Status SetOwner(int slot, const std::string& host, int port) {
    std::lock_guard<std::mutex> lock(mu_);
    TQKV_ASSIGN_OR_RETURN(int idx, NodeIndexLocked(host, port));
    slots_[slot] = idx;
    prefer_ = idx;  // the node that sent us here knows the newer map
    return Status::Ok();
  }

  Result<int> NodeIndexLocked(const std::string& host, int port) {
    const std::string addr = Addr(host, port);
    if (auto it = by_addr_.find(addr); it != by_addr_.end()) return it->second;
    if (nodes_.size() >= kMaxNodes) {
      return Status::IoError("redis+cluster: more than " + std::to_string(kMaxNodes) +
                             " node addresses seen; refusing " + addr);
    }
    RedisConfig node_cfg = cfg_;
    node_cfg.host = host;
    node_cfg.port = port;
    node_cfg.socket.clear();
    node_cfg.seeds.clear();
    std::shared_ptr<std::atomic<bool>> stale = stale_;
    nodes_.push_back(
        {host, port, std::make_shared<Pool>(std::move(node_cfg), [stale] { stale->store(true); })});
    by_addr_.emplace(addr, static_cast<int>(nodes_.size() - 1));
    return static_cast<int>(nodes_.size() - 1);
  }

  // One thread re-reads the map; the others wait for it and use its result. If every node fails,
  // the old map stays in use (commands then get redirected or fail on their own).
  Status RefreshIfStale() {
    if (!stale_->load()) return Status::Ok();
    std::lock_guard<std::mutex> refresh(refresh_mu_);
    if (!stale_->load()) return Status::Ok();
    Status s = Refresh();
    if (s.ok()) return s;
    std::lock_guard<std::mutex> lock(mu_);
    const bool have_map =
        std::any_of(slots_.begin(), slots_.end(), [](int idx) { return idx >= 0; });
    return have_map ? Status::Ok() : s;
  }

  // Caller holds refresh_mu_. Asks the node of the last MOVED, then the primaries, then the
  // seeds, until one answers CLUSTER SLOTS.
  Status Refresh() {
    std::vector<std::pair<std::string, int>> candidates;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (prefer_ >= 0) candidates.emplace_back(nodes_[prefer_].host, nodes_[prefer_].port);
      std::vector<bool> seen(nodes_.size(), false);
      for (int idx : slots_) {
        if (idx >= 0 && !seen[idx]) {
          seen[idx] = true;
          candidates.emplace_back(nodes_[idx].host, nodes_[idx].port);
        }
      }
    }
    for (const auto& seed : cfg_.seeds) candidates.push_back(seed);
    std::vector<std::string> tried;
    std::string errors;
    for (const auto& [host, port] : candidates) {
      const std::string addr = Addr(host, port);
      if (std::find(tried.begin(), tried.end(), addr) != tried.end()) continue;
      if (tried.size() >= kMaxRefreshCandidates) break;
      tried.push_back(addr);
      Result<std::vector<SlotRange>> ranges = ReadSlots(host, port);
      if (!ranges.ok()) {
        errors += (errors.empty() ? "" : "; ") + ranges.status().message();
        continue;
      }
      if (ranges->empty()) {
        errors += (errors.empty() ? "" : "; ") + addr + " serves no slot yet";
        continue;
      }
      std::lock_guard<std::mutex> lock(mu_);
      std::vector<int> slots(kClusterSlots, -1);
      for (const SlotRange& r : *ranges) {
        TQKV_ASSIGN_OR_RETURN(int idx, NodeIndexLocked(r.host, r.port));
        std::fill(slots.begin() + r.first, slots.begin() + r.last + 1, idx);
      }
      slots_ = std::move(slots);
      prefer_ = -1;
      stale_->store(false);
      return Status::Ok();
    }
    return Status::IoError("redis+cluster: cannot read the slot map from any of " +
                           std::to_string(tried.size()) + " node(s): " + errors);
  }

  Result<std::vector<SlotRange>> ReadSlots(const std::string& host, int port) {
    std::shared_ptr<Pool> pool;
    {
      std::lock_guard<std::mutex> lock(mu_);
      TQKV_ASSIGN_OR_RETURN(int idx, NodeIndexLocked(host, port));
      pool = nodes_[idx].pool;
    }
    TQKV_ASSIGN_OR_RETURN(redisContext * c, pool->Get());
    Lease lease(pool, c);
    AppendCmd(c, {"CLUSTER", "SLOTS"});
    auto r = ReadReply(*pool, c, "CLUSTER SLOTS");
    if (!r.ok()) {
      lease.MarkDirty();
      return r.status();
    }
    if ((*r)->type == REDIS_REPLY_ERROR) {
      const std::string err((*r)->str, (*r)->len);
      return Status::IoError(
          "CLUSTER SLOTS on " + pool->Where() + ": " + err +
          (err.find("cluster support disabled") != std::string::npos
               ? " (not a cluster node: open it as redis://host:port/prefix)"
               : ""));
    }
    return ParseClusterSlots(**r, host, pool->Where());
  }

  const RedisConfig cfg_;
  const std::shared_ptr<std::atomic<bool>> stale_;  // set by MOVED anywhere (pools share it)
  std::mutex refresh_mu_;  // one refresh at a time; taken before mu_
  std::mutex mu_;          // nodes_, by_addr_, slots_, prefer_
  std::vector<Node> nodes_;
  std::map<std::string, int> by_addr_;
  std::vector<int> slots_;  // slot -> index in nodes_ of its primary; -1 unserved
  int prefer_ = -1;
};

}  // namespace

std::shared_ptr<Router> MakeClusterRouter(RedisConfig cfg) {
  return std::make_shared<ClusterRouter>(std::move(cfg));
}

}  // namespace tqkv::redis
