// nfs:// specifics that need no NFS server.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "tqkv/store.h"

namespace tqkv {
namespace {

// A server that takes connections and never answers, as a SIGSTOPped one does (the kernel
// completes the handshakes): the mount's RPCs give up after the URI's timeout, where each RPC
// waited 60 s before (issue 49, item 11).
TEST(NfsStoreTest, AServerThatNeverAnswersIsAnErrorAfterTheTimeout) {
  if (OpenStore("nfs://").status().message().find("unknown store scheme") != std::string::npos) {
    GTEST_SKIP() << "this build has no nfs:// store";
  }
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(::listen(fd, 64), 0);  // never accepted: connections wait in the backlog
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  const std::string port = std::to_string(ntohs(a.sin_port));
  auto s = OpenStore("nfs://127.0.0.1/export/a/b?nfsport=" + port + "&mountport=" + port +
                     "&timeout=1");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kIoError) << s.status().ToString();
  EXPECT_NE(s.status().message().find("timed out"), std::string::npos) << s.status().ToString();
  // One mount was tried, not one per candidate export (/export/a/b, /export/a, /export): each
  // left its connection in the backlog.
  ASSERT_EQ(::fcntl(fd, F_SETFL, O_NONBLOCK), 0);
  int tried = 0;
  for (int c; (c = ::accept(fd, nullptr, nullptr)) >= 0; ++tried) ::close(c);
  ::close(fd);
  EXPECT_EQ(tried, 1);
  // The option is seconds, as every store's timeout.
  auto bad = OpenStore("nfs://127.0.0.1/export/dir?timeout=1k");
  EXPECT_NE(bad.status().message().find("expected seconds"), std::string::npos)
      << bad.status().ToString();
}

}  // namespace
}  // namespace tqkv
