// HeldSends (core/transport/held_sends.h): messages to a peer whose address
// is not known yet, released in order on connect, dropped once at the
// deadline; the expiry callback may send and connect again.
#include "core/transport/held_sends.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

namespace cortado::transport {
namespace {

NodeId worker(int r) { return NodeId{Role::kWorker, r}; }

Message messageOf(const std::string& text) {
  Message m;
  m.parts.emplace_back(Buffer::copyOf(text.data(), text.size()));
  return m;
}

std::string textOf(const Message& m) {
  return std::string(reinterpret_cast<const char*>(m.parts.at(0).data()), m.parts.at(0).size());
}

TEST(HeldSends, ReleasesInTheOrderSent) {
  HeldSends h;
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(h.hold(worker(1), messageOf(std::to_string(i)), Millis(1000)));
  auto msgs = h.release(worker(1));
  ASSERT_EQ(msgs.size(), 5u);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(textOf(msgs[i]), std::to_string(i));
  EXPECT_TRUE(h.release(worker(1)).empty());
  EXPECT_EQ(h.nextDeadline(), Clock::time_point::max());
}

TEST(HeldSends, ExpiresOncePerPeerAndDropsLaterSendsUntilConnect) {
  HeldSends h;
  ASSERT_TRUE(h.hold(worker(1), messageOf("a"), Millis(0)));
  ASSERT_TRUE(h.hold(worker(1), messageOf("b"), Millis(0)));
  ASSERT_TRUE(h.hold(worker(2), messageOf("c"), Millis(60000)));
  std::map<int, size_t> calls;
  auto onExpired = [&](const NodeId& peer, size_t dropped) { calls[peer.rank] += dropped + 100; };
  h.expire(Clock::now(), onExpired);
  h.expire(Clock::now(), onExpired);  // reported once
  EXPECT_EQ(calls, (std::map<int, size_t>{{1, 102}}));
  EXPECT_FALSE(h.hold(worker(1), messageOf("d"), Millis(0)));  // dropped
  EXPECT_TRUE(h.release(worker(1)).empty());
  // After connect() the peer starts afresh.
  EXPECT_TRUE(h.hold(worker(1), messageOf("e"), Millis(60000)));
  EXPECT_EQ(h.release(worker(1)).size(), 1u);
  EXPECT_EQ(h.release(worker(2)).size(), 1u);
}

// The transports' error callback runs inside expire(): it may hold messages
// for many new peers (which rehashes the map) and release others.
TEST(HeldSends, TheExpiryCallbackMayHoldAndReleaseOtherPeers) {
  HeldSends h;
  for (int r = 0; r < 8; ++r) ASSERT_TRUE(h.hold(worker(r), messageOf("x"), Millis(0)));
  ASSERT_TRUE(h.hold(worker(1000), messageOf("keep"), Millis(60000)));
  size_t expired = 0;
  h.expire(Clock::now(), [&](const NodeId& peer, size_t dropped) {
    ++expired;
    EXPECT_EQ(dropped, 1u) << peer.toString();
    for (int r = 0; r < 64; ++r) {
      EXPECT_TRUE(h.hold(worker(100 + 64 * peer.rank + r), messageOf("new"), Millis(60000)));
    }
    h.release(worker(1000));
  });
  EXPECT_EQ(expired, 8u);
  for (int r = 100; r < 100 + 64 * 8; ++r) EXPECT_EQ(h.release(worker(r)).size(), 1u) << r;
  EXPECT_TRUE(h.release(worker(1000)).empty());
}

}  // namespace
}  // namespace cortado::transport
