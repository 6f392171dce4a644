// nfs:// specifics: a server that never answers, and one that stalls for a while.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <regex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "store/loopback_listener.h"
#include "store/shared_store_servers.h"
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
  const auto listener = testing_util::ListenOnLoopback(64);  // never accepted
  ASSERT_GE(listener.fd, 0);
  const int fd = listener.fd;
  const std::string port = std::to_string(listener.port);
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

// A loopback TCP relay to the NFS server that can stop passing the server's replies on and start
// again: a server that stalls (under a lock, or SIGSTOPped for a while) without touching the
// shared test server. Replies held back wait in the socket buffers.
class StallableRelay {
 public:
  explicit StallableRelay(int upstream_port) : upstream_port_(upstream_port) {
    const auto listener = testing_util::ListenOnLoopback(16);
    listen_fd_ = listener.fd;
    port_ = listener.port;
    thread_ = std::thread([this] { Run(); });
  }
  ~StallableRelay() {
    stop_ = true;
    thread_.join();
    for (auto [c, u] : pairs_) {
      if (c >= 0) ::close(c);
      if (u >= 0) ::close(u);
    }
    ::close(listen_fd_);
  }
  bool ok() const { return listen_fd_ >= 0; }
  int port() const { return port_; }
  void Stall(bool on) { stalled_ = on; }

 private:
  void Run() {
    while (!stop_) {
      std::vector<pollfd> fds{{listen_fd_, POLLIN, 0}};
      for (auto [c, u] : pairs_) {
        fds.push_back({c, POLLIN, 0});
        fds.push_back({u, static_cast<short>(stalled_ ? 0 : POLLIN), 0});
      }
      if (::poll(fds.data(), fds.size(), 20) <= 0) continue;
      const size_t polled = pairs_.size();
      if (fds[0].revents & POLLIN) Accept();
      for (size_t i = 0; i < polled; ++i) {
        auto& [c, u] = pairs_[i];
        if (c < 0) continue;
        const auto ready = [&](size_t k) { return (fds[k].revents & (POLLIN | POLLHUP)) != 0; };
        const bool open = (!ready(1 + 2 * i) || Pass(c, u)) && (!ready(2 + 2 * i) || Pass(u, c));
        if (!open) {  // either side closed: close both (poll skips the -1s)
          ::close(c);
          ::close(u);
          c = u = -1;
        }
      }
    }
  }
  void Accept() {
    const int c = ::accept(listen_fd_, nullptr, nullptr);
    if (c < 0) return;
    const int u = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(upstream_port_));
    if (::connect(u, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      ::close(c);
      ::close(u);
      return;
    }
    pairs_.emplace_back(c, u);
  }
  // false when `from` has closed (or either side failed).
  static bool Pass(int from, int to) {
    char buf[65536];
    const ssize_t n = ::read(from, buf, sizeof(buf));
    if (n <= 0) return false;
    for (ssize_t off = 0; off < n;) {
      const ssize_t w = ::write(to, buf + off, static_cast<size_t>(n - off));
      if (w <= 0) return false;
      off += w;
    }
    return true;
  }

  int upstream_port_, listen_fd_ = -1, port_ = 0;
  std::atomic<bool> stop_{false}, stalled_{false};
  std::vector<std::pair<int, int>> pairs_;  // (client, upstream), the relay thread's only
  std::thread thread_;
};

// A server that stops answering for a while: the requests in flight fail after the URI's
// timeout (libnfs times them out), and the same store works again once the server answers:
// new writes, and a reader opened before the stall. The context was once abandoned here for
// good, and destroying it later ran the batch's callbacks into a dead frame (CI, ASan).
TEST(NfsStoreTest, AServerThatStallsFailsTheRequestsInFlightAndTheStoreGoesOn) {
  const auto& servers = testing_util::TestServers();
  if (!servers.nfs_missing.empty()) GTEST_SKIP() << servers.nfs_missing;
  ASSERT_FALSE(servers.nfs.empty()) << servers.start_error;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(servers.nfs, m, std::regex("nfsport=([0-9]+)"))) << servers.nfs;
  StallableRelay relay(std::stoi(m[1]));
  ASSERT_TRUE(relay.ok());
  const std::string via_relay = std::regex_replace(
      servers.nfs, std::regex("nfsport=[0-9]+"), "nfsport=" + std::to_string(relay.port()));
  auto opened = OpenStore(testing_util::WithSubdir(via_relay, testing_util::UniqueName("stall"),
                                                   "timeout=1&chunk=65536&depth=4"));
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  Store* store = opened->get();
  const auto a = testing_util::Pattern(1, 300000), b = testing_util::Pattern(2, 300000);
  ASSERT_TRUE(testing_util::WriteObject(store, "a", a).ok());
  auto reader = store->Open("a");
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  auto writer = store->Create("b");
  ASSERT_TRUE(writer.ok()) << writer.status().ToString();

  relay.Stall(true);
  const auto t0 = std::chrono::steady_clock::now();
  const Status append = (*writer)->Append(b);  // 256 KiB staged: four 64 KiB WRITEs in flight
  std::vector<uint8_t> got(a.size());
  const Status read = (*reader)->ReadAt(0, got);
  const double stalled_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  relay.Stall(false);
  EXPECT_EQ(append.code(), StatusCode::kIoError) << append.ToString();
  EXPECT_NE(append.message().find("no reply"), std::string::npos) << append.ToString();
  EXPECT_EQ(read.code(), StatusCode::kIoError) << read.ToString();
  EXPECT_LT(stalled_s, 12.0) << "two batches, each bounded by the 1 s timeout";
  writer->reset();

  // The server answers again: the same store writes and reads, the earlier reader included.
  ASSERT_TRUE(testing_util::WriteObject(store, "c", b).ok());
  auto c = testing_util::ReadObject(store, "c");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(*c == b);
  const Status again = (*reader)->ReadAt(0, got);
  ASSERT_TRUE(again.ok()) << again.ToString();
  EXPECT_TRUE(got == a);
}

}  // namespace
}  // namespace tqkv
