// The staggered chunk order (core/partition.h, sendOrder) written the way
// its documentation states it, server by server, as the tests' reference.
#pragma once

#include <cstddef>
#include <map>
#include <vector>

namespace cortado::test {

// serverOf[i]: the server of chunk i. Round g takes the g-th chunk of every
// server that has more than g of them, servers ascending, starting at
// position rank mod m of the round's m servers and wrapping around.
inline std::vector<size_t> staggeredReference(const std::vector<int>& serverOf, int rank) {
  std::map<int, std::vector<size_t>> byServer;
  for (size_t i = 0; i < serverOf.size(); ++i) byServer[serverOf[i]].push_back(i);
  std::vector<size_t> out;
  for (size_t g = 0; out.size() < serverOf.size(); ++g) {
    std::vector<size_t> round;
    for (const auto& [server, list] : byServer)
      if (list.size() > g) round.push_back(list[g]);
    for (size_t k = 0; k < round.size(); ++k)
      out.push_back(round[(size_t(rank) + k) % round.size()]);
  }
  return out;
}

}  // namespace cortado::test
