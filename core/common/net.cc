#include "core/common/net.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "core/common/error.h"

namespace cortado::net {

std::string resolveIPv4(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || !res)
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("host '{}' does not resolve to an IPv4 address here: {}", host,
                            gai_strerror(rc)));
  char buf[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr, buf, sizeof(buf));
  freeaddrinfo(res);
  return buf;
}

std::string localAddressToward(const std::string& host) {
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(9);  // any port: connect() on UDP only picks the route
  inet_pton(AF_INET, resolveIPv4(host).c_str(), &to.sin_addr);
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    throw Error(ErrorCode::kUnavailable, fmt::format("socket() failed: {}", strerror(errno)));
  sockaddr_in me{};
  socklen_t len = sizeof(me);
  bool ok = connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) == 0 &&
            getsockname(fd, reinterpret_cast<sockaddr*>(&me), &len) == 0;
  int err = errno;
  close(fd);
  if (!ok)
    throw Error(ErrorCode::kUnavailable,
                fmt::format("no route from this machine to host '{}': {}", host, strerror(err)));
  char buf[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &me.sin_addr, buf, sizeof(buf));
  return buf;
}

std::string subnetOf(const std::string& address) {
  in_addr want{};
  if (inet_pton(AF_INET, address.c_str(), &want) != 1) return "";
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "";
  std::string out;
  for (ifaddrs* i = list; i && out.empty(); i = i->ifa_next) {
    if (!i->ifa_addr || !i->ifa_netmask || i->ifa_addr->sa_family != AF_INET) continue;
    auto a = reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr;
    auto m = reinterpret_cast<sockaddr_in*>(i->ifa_netmask)->sin_addr.s_addr;
    if (a != want.s_addr) continue;
    in_addr net{a & m};
    char buf[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &net, buf, sizeof(buf));
    out = fmt::format("{}/{}", buf, __builtin_popcount(ntohl(m)));
  }
  freeifaddrs(list);
  return out;
}

bool isLoopback(const std::string& address) { return address.rfind("127.", 0) == 0; }

std::string localHostname() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown-host";
  return buf;
}

}  // namespace cortado::net
