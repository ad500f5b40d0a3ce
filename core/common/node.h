// Node identity: a role and a rank within that role. The scheduler assigns
// ranks at registration; the pair names a node in every log line and error.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace cortado {

enum class Role : uint8_t { kScheduler = 0, kServer = 1, kWorker = 2 };

const char* roleName(Role r);
// "scheduler" | "server" | "worker" (case-insensitive); nullopt otherwise.
std::optional<Role> parseRole(std::string_view s);

struct NodeId {
  Role role = Role::kWorker;
  int32_t rank = -1;

  bool operator==(const NodeId&) const = default;
  // NOLINTNEXTLINE(modernize-use-nullptr): clang 14 misreads the defaulted <=>
  auto operator<=>(const NodeId&) const = default;
  std::string toString() const { return fmt::format("{} {}", roleName(role), rank); }
  // Compact and reversible: used as a transport routing id ("w3", "s0", "h").
  std::string toWire() const;
  static std::optional<NodeId> fromWire(std::string_view s);
};

// Where a node is: its id plus the addresses it can be reached at.
struct NodeInfo {
  NodeId id;
  std::string dataAddress;  // transport address, e.g. tcp://127.0.0.1:41234
  std::string hostname;
  int32_t pid = 0;
  // Reads pushes from, and answers into, same-host shared memory (core/shm).
  bool sharedMemory = false;
  // A server's budget of pushes received and not yet summed, in bytes, that
  // the workers keep to (their share each; server/server_engine.h, "Push
  // budget"); 0: none.
  uint64_t pushBudget = 0;
  std::string toString() const {
    return fmt::format("{} (host {}, pid {}, {})", id.toString(), hostname, pid, dataAddress);
  }
};

}  // namespace cortado

template <>
struct std::hash<cortado::NodeId> {
  size_t operator()(const cortado::NodeId& n) const noexcept {
    return (static_cast<size_t>(n.role) << 32) ^ static_cast<uint32_t>(n.rank);
  }
};

template <>
struct fmt::formatter<cortado::NodeId> : fmt::formatter<std::string> {
  template <typename Ctx>
  auto format(const cortado::NodeId& n, Ctx& ctx) const {
    return fmt::formatter<std::string>::format(n.toString(), ctx);
  }
};
