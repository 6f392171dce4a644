// A TCP socket listening on an ephemeral 127.0.0.1 port, for the store tests' fake and stalled
// servers.
#ifndef TQKV_TESTS_STORE_LOOPBACK_LISTENER_H_
#define TQKV_TESTS_STORE_LOOPBACK_LISTENER_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace tqkv::testing_util {

struct LoopbackListener {
  int fd = -1;   // -1 when the socket could not be made, bound or listened on
  int port = 0;
};

// Connections past `backlog` that are never accepted wait in the kernel's queue.
inline LoopbackListener ListenOnLoopback(int backlog) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return {};
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), len) != 0 || ::listen(fd, backlog) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ::close(fd);
    return {};
  }
  return {fd, ntohs(a.sin_port)};
}

}  // namespace tqkv::testing_util

#endif  // TQKV_TESTS_STORE_LOOPBACK_LISTENER_H_
