// Redis store behaviour that needs no real server: a fake node that answers every command with a
// Redis Cluster redirection, which a redis:// client must report plainly instead of following;
// redis+cluster:// URI errors and bad slot maps; hash slots against the values Redis documents.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <string>
#include <thread>

#include "store/loopback_listener.h"
#include "store/redis/redis_slot.h"
#include "tqkv/store.h"

namespace tqkv {
namespace {

// Accepts one connection on 127.0.0.1 and sends `reply` for every read, until the client closes.
class FakeNode {
 public:
  explicit FakeNode(std::string reply) : reply_(std::move(reply)) {
    const auto listener = testing_util::ListenOnLoopback(1);
    fd_ = listener.fd;
    if (fd_ < 0) return;
    port_ = listener.port;
    timeval tv{10, 0};  // never hang the test if the client does not connect
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    thread_ = std::thread([this] {
      const int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      timeval ctv{10, 0};
      ::setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &ctv, sizeof(ctv));
      char buf[4096];
      while (::recv(c, buf, sizeof(buf), 0) > 0) {
        if (::send(c, reply_.data(), reply_.size(), MSG_NOSIGNAL) < 0) break;
      }
      ::close(c);
    });
  }
  ~FakeNode() {
    if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
    if (thread_.joinable()) thread_.join();
    if (fd_ >= 0) ::close(fd_);
  }
  int port() const { return port_; }

 private:
  std::string reply_;
  int fd_ = -1;
  int port_ = 0;
  std::thread thread_;
};

TEST(RedisStoreTest, ClusterRedirectionIsAClearUnsupportedError) {
  for (const std::string redirect : {"MOVED 3999 127.0.0.1:7001", "ASK 3999 127.0.0.1:7002"}) {
    FakeNode node("-" + redirect + "\r\n");
    ASSERT_GT(node.port(), 0);
    auto s = OpenStore("redis://127.0.0.1:" + std::to_string(node.port()) + "/t");
    ASSERT_FALSE(s.ok());
    if (s.status().code() == StatusCode::kInvalidArgument) {
      GTEST_SKIP() << "built without redis: " << s.status().ToString();
    }
    EXPECT_EQ(s.status().code(), StatusCode::kUnsupported) << s.status().ToString();
    EXPECT_NE(s.status().ToString().find(redirect), std::string::npos) << s.status().ToString();
    EXPECT_NE(s.status().ToString().find("does not follow MOVED/ASK"), std::string::npos)
        << s.status().ToString();
    EXPECT_NE(s.status().ToString().find("redis+cluster://"), std::string::npos)
        << s.status().ToString();
  }
}

// A server that takes connections and never answers, as a SIGSTOPped one does: the first
// command fails after the URI's timeout and is not retried (issue 49, item 11; docs/store.md
// §7 states the bound). Only one connection is made.
TEST(RedisStoreTest, AServerThatNeverAnswersIsAnErrorAfterTheTimeout) {
  const auto listener = testing_util::ListenOnLoopback(64);  // never accepted
  ASSERT_GE(listener.fd, 0);
  const int fd = listener.fd;
  auto s = OpenStore("redis://127.0.0.1:" + std::to_string(listener.port) + "/t?timeout=1");
  ASSERT_FALSE(s.ok());
  if (s.status().message().find("unknown store scheme") != std::string::npos) {
    ::close(fd);
    GTEST_SKIP() << "built without redis: " << s.status().ToString();
  }
  EXPECT_EQ(s.status().code(), StatusCode::kIoError) << s.status().ToString();
  ASSERT_EQ(::fcntl(fd, F_SETFL, O_NONBLOCK), 0);
  int tried = 0;
  for (int c; (c = ::accept(fd, nullptr, nullptr)) >= 0; ++tried) ::close(c);
  ::close(fd);
  EXPECT_EQ(tried, 1);
}

// Values from the Redis Cluster specification and the CLUSTER KEYSLOT documentation.
TEST(RedisSlotTest, HashSlotsAndHashTagsAreRedis) {
  EXPECT_EQ(redis::Crc16Xmodem("123456789"), 0x31C3);
  EXPECT_EQ(redis::KeySlot("somekey"), 11058);
  EXPECT_EQ(redis::KeySlot("foo{hash_tag}"), 2515);
  EXPECT_EQ(redis::KeySlot("bar{hash_tag}"), 2515);
  EXPECT_EQ(redis::HashTag("{user1000}.following"), "user1000");
  EXPECT_EQ(redis::HashTag("foo{}{bar}"), "foo{}{bar}");  // empty tag: the whole key
  EXPECT_EQ(redis::HashTag("foo{{bar}}zap"), "{bar");
  EXPECT_EQ(redis::HashTag("foo{bar}{zap}"), "bar");
  EXPECT_EQ(redis::HashTag("no-brace{"), "no-brace{");
  // The store's key layout: every key of session K hashes like K itself.
  for (const std::string k : {"s1", "sess/7/turn-3", "a.b-c_d"}) {
    for (const std::string suffix : {"m", "a", "p", "d:0123456789abcdef.42:17"}) {
      EXPECT_EQ(redis::KeySlot("tqkv/prefix:{" + k + "}:" + suffix), redis::KeySlot(k)) << k;
    }
  }
}

TEST(RedisClusterUriTest, BadSeedsAreClearErrors) {
  for (const std::string uri : {"redis+cluster://:7000/p", "redis+cluster://h:0/p",
                                "redis+cluster://h:1,,h:2/p", "redis+cluster://h:99999/p",
                                "redis+cluster://h:12x/p", "redis+cluster://h:1/p?nope=1"}) {
    auto s = OpenStore(uri);
    ASSERT_FALSE(s.ok()) << uri;
    if (s.status().ToString().find("unknown store scheme") != std::string::npos) {
      GTEST_SKIP() << "built without redis";
    }
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument)
        << uri << ": " << s.status().ToString();
  }
}

TEST(RedisClusterUriTest, NotAClusterOrABadSlotMapIsAClearError) {
  const std::pair<std::string, std::string> cases[] = {
      {"-ERR This instance has cluster support disabled\r\n", "not a cluster node"},
      {":42\r\n", "bad CLUSTER SLOTS reply"},
      {"*1\r\n*3\r\n:0\r\n:99999\r\n*2\r\n$9\r\n127.0.0.1\r\n:7000\r\n", "outside 0-16383"},
      {"*1\r\n*3\r\n:0\r\n:16383\r\n*2\r\n:1\r\n:7000\r\n", "is not [host, port, ...]"},
      {"*0\r\n", "serves no slot"},
  };
  for (const auto& [reply, expect] : cases) {
    FakeNode node(reply);
    ASSERT_GT(node.port(), 0);
    auto s = OpenStore("redis+cluster://127.0.0.1:" + std::to_string(node.port()) + "/t");
    ASSERT_FALSE(s.ok());
    if (s.status().ToString().find("unknown store scheme") != std::string::npos) {
      GTEST_SKIP() << "built without redis";
    }
    EXPECT_NE(s.status().ToString().find(expect), std::string::npos) << s.status().ToString();
  }
}

}  // namespace
}  // namespace tqkv
