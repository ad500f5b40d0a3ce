#include "core/common/node.h"

#include <cctype>
#include <charconv>

namespace cortado {

const char* roleName(Role r) {
  switch (r) {
    case Role::kScheduler: return "scheduler";
    case Role::kServer: return "server";
    case Role::kWorker: return "worker";
  }
  return "unknown";
}

std::optional<Role> parseRole(std::string_view s) {
  std::string l;
  for (char c : s) l += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (l == "scheduler") return Role::kScheduler;
  if (l == "server") return Role::kServer;
  if (l == "worker") return Role::kWorker;
  return std::nullopt;
}

std::string NodeId::toWire() const {
  char c = role == Role::kScheduler ? 'h' : role == Role::kServer ? 's' : 'w';
  return fmt::format("{}{}", c, rank);
}

std::optional<NodeId> NodeId::fromWire(std::string_view s) {
  if (s.size() < 2) return std::nullopt;
  NodeId id;
  switch (s[0]) {
    case 'h': id.role = Role::kScheduler; break;
    case 's': id.role = Role::kServer; break;
    case 'w': id.role = Role::kWorker; break;
    default: return std::nullopt;
  }
  auto [p, ec] = std::from_chars(s.data() + 1, s.data() + s.size(), id.rank);
  if (ec != std::errc() || p != s.data() + s.size() || id.rank < 0) return std::nullopt;
  return id;
}

}  // namespace cortado
