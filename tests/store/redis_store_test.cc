// Redis store behaviour that needs no real server: a fake node that answers every command with a
// Redis Cluster redirection, which the client must report plainly instead of following.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <string>
#include <thread>

#include "tqkv/store.h"

namespace tqkv {
namespace {

// Accepts one connection on 127.0.0.1 and sends `reply` for every read, until the client closes.
class FakeNode {
 public:
  explicit FakeNode(std::string reply) : reply_(std::move(reply)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&a), len) != 0 || ::listen(fd_, 1) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      return;
    }
    port_ = ntohs(a.sin_port);
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
  }
}

}  // namespace
}  // namespace tqkv
