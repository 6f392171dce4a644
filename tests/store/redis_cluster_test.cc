// redis+cluster:// against the loopback 3-node cluster of scripts/start-test-servers.sh: a
// session's keys sit on one node, sessions spread over several, and a stale slot map is corrected
// through ASK (mid-migration) and MOVED (after it). The cluster is inspected and resharded with
// redis-cli.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "store/redis/redis_slot.h"
#include "store/shared_store_servers.h"
#include "tqkv/store_admin.h"
#include "store/store_test_util.h"
#include "tqkv/store.h"

namespace tqkv {
namespace {

using testing_util::Pattern;
using testing_util::ReadObject;
using testing_util::WriteObject;

// stdout of `redis-cli -p port args...` (arguments single-quoted; none contains a quote).
std::string RedisCli(int port, const std::vector<std::string>& args) {
  std::string cmd = "redis-cli -h 127.0.0.1 -p " + std::to_string(port);
  for (const auto& a : args) cmd += " '" + a + "'";
  cmd += " 2>&1";
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  ::pclose(p);
  return out;
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
    if (!line.empty()) out.push_back(line);
  }
  return out;
}

struct ClusterNode {
  std::string id;
  int port = 0;
  bool primary = false;
  std::vector<std::pair<int, int>> slots;
  bool Owns(int slot) const {
    for (auto [a, b] : slots) {
      if (slot >= a && slot <= b) return true;
    }
    return false;
  }
};

// CLUSTER NODES: "<id> <ip:port@bus> <flags> <primary> <ping> <pong> <epoch> <link> <slots>...".
std::vector<ClusterNode> Nodes(int port) {
  std::vector<ClusterNode> out;
  for (const auto& line : Lines(RedisCli(port, {"CLUSTER", "NODES"}))) {
    std::istringstream f(line);
    std::vector<std::string> w;
    for (std::string x; f >> x;) w.push_back(x);
    if (w.size() < 8) continue;
    ClusterNode n;
    n.id = w[0];
    const size_t colon = w[1].rfind(':'), at = w[1].find('@');
    if (colon == std::string::npos) continue;
    n.port = std::atoi(w[1].substr(colon + 1, at - colon - 1).c_str());
    n.primary = w[2].find("master") != std::string::npos;
    for (size_t i = 8; i < w.size(); ++i) {
      if (w[i].empty() || w[i][0] == '[') continue;  // [slot->-id]: migration in progress
      const size_t dash = w[i].find('-');
      const int a = std::atoi(w[i].c_str());
      const int b = dash == std::string::npos ? a : std::atoi(w[i].c_str() + dash + 1);
      n.slots.emplace_back(a, b);
    }
    out.push_back(n);
  }
  return out;
}

// "redis+cluster://127.0.0.1:P1,127.0.0.1:P2/..." -> {P1, P2}.
std::vector<int> SeedPorts(const std::string& uri) {
  std::vector<int> out;
  const size_t begin = uri.find("://") + 3;
  std::string auth = uri.substr(begin, uri.find('/', begin) - begin);
  std::istringstream in(auth);
  for (std::string one; std::getline(in, one, ',');) {
    out.push_back(std::atoi(one.substr(one.rfind(':') + 1).c_str()));
  }
  return out;
}

// The session key K of "<prefix>:{K}:..." ("" if none).
std::string SessionOf(const std::string& redis_key) {
  const size_t a = redis_key.find('{'), b = redis_key.find('}');
  return a == std::string::npos || b == std::string::npos ? "" : redis_key.substr(a + 1, b - a - 1);
}

class RedisClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto& s = testing_util::TestServers();
    if (s.redis_cluster.empty()) GTEST_SKIP() << s.redis_cluster_skip;
    if (!testing_util::BinaryInstalled("redis-cli")) GTEST_SKIP() << "redis-cli is not installed";
    ports_ = SeedPorts(s.redis_cluster);
    ASSERT_FALSE(ports_.empty()) << s.redis_cluster;
    prefix_ = testing_util::UniqueName("cl");
    uri_ = s.redis_cluster + "/" + prefix_;
    auto st = OpenStore(uri_ + "?chunk=4096");
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    store_ = std::move(st).value();
  }
  void TearDown() override {
    if (store_ != nullptr) testing_util::ClearStore(store_.get());
  }
  // Every key of this test's prefix, by the port of the node holding it.
  std::map<int, std::vector<std::string>> KeysByNode() {
    std::map<int, std::vector<std::string>> out;
    for (int port : ports_) {
      out[port] = Lines(RedisCli(port, {"--scan", "--pattern", prefix_ + ":*"}));
    }
    return out;
  }

  std::vector<int> ports_;
  std::string prefix_, uri_;
  std::unique_ptr<Store> store_;
};

TEST_F(RedisClusterTest, KeySlotMatchesTheServer) {
  for (const std::string key : {"s1", "sess/7", "a.b-c_d", "tqkv/x:{s1}:d:00ff.12:3", "foo{}{bar}",
                                "foo{{bar}}zap", "{user1000}.following", "x{"}) {
    const auto reply = Lines(RedisCli(ports_[0], {"CLUSTER", "KEYSLOT", key}));
    ASSERT_EQ(reply.size(), 1u) << key;
    EXPECT_EQ(std::to_string(redis::KeySlot(key)), reply[0]) << key;
  }
}

TEST_F(RedisClusterTest, ASessionsKeysShareOneNodeAndSessionsSpread) {
  constexpr int kSessions = 24;
  std::vector<std::string> sessions;
  for (int i = 0; i < kSessions; ++i) {
    sessions.push_back(i % 2 == 0 ? "sess-" + std::to_string(i)
                                  : "user/" + std::to_string(i) + "/t");
    // 20000 bytes in 4096-byte chunks: a manifest and 5 chunks; the read adds the access record.
    ASSERT_TRUE(WriteObject(store_.get(), sessions.back(), Pattern(i, 20000), 3000).ok());
    auto back = ReadObject(store_.get(), sessions.back());
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_TRUE(*back == Pattern(i, 20000));
  }
  auto admin = OpenSessionAdmin(store_.get());
  ASSERT_TRUE(admin.ok()) << admin.status().ToString();
  ASSERT_TRUE((*admin)->SetPin(sessions[0], kPinForever).ok());
  // An unfinished writer's temp chunks go to its session's node too.
  auto w = store_->Create(sessions[1]);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  const auto extra = Pattern(99, 10000);
  ASSERT_TRUE((*w)->Append(extra).ok());

  const std::vector<ClusterNode> nodes = Nodes(ports_[0]);
  std::map<std::string, std::set<int>> where;  // session -> ports holding any of its keys
  std::map<std::string, int> count;
  for (const auto& [port, keys] : KeysByNode()) {
    for (const auto& k : keys) {
      where[SessionOf(k)].insert(port);
      ++count[SessionOf(k)];
    }
  }
  std::set<int> used;
  for (const auto& s : sessions) {
    ASSERT_EQ(where[s].size(), 1u) << s << " is spread over several nodes";
    const int port = *where[s].begin();
    used.insert(port);
    for (const auto& n : nodes) {
      if (n.port == port) {
        EXPECT_TRUE(n.Owns(redis::KeySlot(s))) << s << " is not on its slot's owner";
      }
    }
    EXPECT_GE(count[s], 7) << s << ": manifest, access record and 5 chunks";
  }
  EXPECT_EQ(count[sessions[0]], 8) << "the pin record is with the session";
  EXPECT_GE(used.size(), 2u) << kSessions << " sessions all landed on one node";

  // Listing and usage cover every node.
  auto listed = store_->List();
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  EXPECT_EQ(listed->size(), static_cast<size_t>(kSessions));
  auto metas = (*admin)->ListSessions();
  ASSERT_TRUE(metas.ok()) << metas.status().ToString();
  ASSERT_EQ(metas->size(), static_cast<size_t>(kSessions));
  for (const auto& m : *metas) {
    EXPECT_EQ(m.size, 20000u) << m.key;
    EXPECT_GT(m.atime_ns, 0) << m.key;
    EXPECT_EQ(m.pin_until_ns, m.key == sessions[0] ? kPinForever : 0) << m.key;
  }
  ASSERT_TRUE((*w)->Abort().ok());
  ASSERT_TRUE((*admin)->SetPin(sessions[0], 0).ok());
}

// The client's slot map goes stale when a slot moves: during the migration the old owner answers
// ASK (the keys already moved), afterwards MOVED. Reads, writes and listings must still work.
TEST_F(RedisClusterTest, StaleSlotMapIsCorrectedThroughAskAndMoved) {
  const std::string key = testing_util::UniqueName("mig");
  const auto v1 = Pattern(1, 30000), v2 = Pattern(2, 25000);
  ASSERT_TRUE(WriteObject(store_.get(), key, v1, 4096).ok());
  ASSERT_TRUE(ReadObject(store_.get(), key).ok());  // the client now knows the current map

  const int slot = redis::KeySlot(key);
  const std::vector<ClusterNode> nodes = Nodes(ports_[0]);
  const ClusterNode *src = nullptr, *dst = nullptr, *other = nullptr;
  for (const auto& n : nodes) {
    if (!n.primary) continue;
    if (n.Owns(slot)) {
      src = &n;
    } else if (dst == nullptr) {
      dst = &n;
    } else {
      other = &n;
    }
  }
  ASSERT_TRUE(src != nullptr && dst != nullptr) << "need two primaries";
  const std::string s = std::to_string(slot), dst_port = std::to_string(dst->port);

  // Migrate the slot by hand, as redis-cli --cluster reshard does.
  ASSERT_EQ(Lines(RedisCli(dst->port, {"CLUSTER", "SETSLOT", s, "IMPORTING", src->id})),
            std::vector<std::string>{"OK"});
  ASSERT_EQ(Lines(RedisCli(src->port, {"CLUSTER", "SETSLOT", s, "MIGRATING", dst->id})),
            std::vector<std::string>{"OK"});
  for (int round = 0; round < 1000; ++round) {
    const auto keys = Lines(RedisCli(src->port, {"CLUSTER", "GETKEYSINSLOT", s, "100"}));
    if (keys.empty()) break;
    std::vector<std::string> args{"MIGRATE", "127.0.0.1", dst_port, "", "0", "10000", "KEYS"};
    args.insert(args.end(), keys.begin(), keys.end());
    ASSERT_EQ(Lines(RedisCli(src->port, args)), std::vector<std::string>{"OK"});
  }
  // Mid-migration: the old owner no longer has the keys and answers ASK.
  auto mid = ReadObject(store_.get(), key);
  ASSERT_TRUE(mid.ok()) << mid.status().ToString();
  EXPECT_TRUE(*mid == v1);

  for (const auto* n : {dst, src, other}) {
    if (n == nullptr) continue;
    ASSERT_EQ(Lines(RedisCli(n->port, {"CLUSTER", "SETSLOT", s, "NODE", dst->id})),
              std::vector<std::string>{"OK"});
  }
  // Done: the old owner answers MOVED; the client re-reads the map and carries on.
  auto after = ReadObject(store_.get(), key);
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  EXPECT_TRUE(*after == v1);
  ASSERT_TRUE(WriteObject(store_.get(), key, v2, 5000).ok());
  auto l = store_->List();
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  ASSERT_EQ(l->size(), 1u);
  EXPECT_EQ((*l)[0].key, key);
  EXPECT_EQ((*l)[0].size, v2.size());
  const auto by_node = KeysByNode();
  EXPECT_TRUE(by_node.at(src->port).empty()) << "keys left on the old owner";
  EXPECT_FALSE(by_node.at(dst->port).empty());

  // A client that knows a single seed node finds the rest from it.
  const int seed = other != nullptr ? other->port : src->port;
  auto one = OpenStore("redis+cluster://127.0.0.1:" + std::to_string(seed) + "/" + prefix_);
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  auto got = ReadObject(one->get(), key);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_TRUE(*got == v2);
}

}  // namespace
}  // namespace tqkv
