// The transport conformance suite: every data-plane backend passes the same
// tests (transport_test.cc). A backend joins with one line in its own file:
//
//   CORTADO_TRANSPORT_CONFORMANCE(Zmq, zmqTcpFactory());
//
// A factory makes an environment per test, so that backends that need shared
// state (the in-process Hub) get a fresh one each time.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>

#include "core/transport/transport.h"

namespace cortado::transport::testing {

struct TransportEnv {
  // A new Transport for `self`; the Transports of one env reach each other.
  std::function<std::unique_ptr<Transport>(const NodeId& self)> makeTransport;
  // An address to listen() on: a fresh one per call.
  std::function<std::string()> listenAddress;
  // An address that nothing listens on.
  std::string deadAddress;
};

struct TransportFactory {
  std::string name;  // a test-name suffix: letters, digits and '_'
  // Called once per test. The env's Transports must give up on an unreachable
  // peer within about two seconds (connectTimeout), so the failure tests are quick.
  std::function<TransportEnv()> makeEnv;
};

class TransportTest : public ::testing::TestWithParam<TransportFactory> {};

inline std::string transportFactoryName(const ::testing::TestParamInfo<TransportFactory>& info) {
  return info.param.name;
}

}  // namespace cortado::transport::testing

// Use inside namespace cortado::transport::testing (GoogleTest wants the
// suite's name unqualified).
#define CORTADO_TRANSPORT_CONFORMANCE(prefix, ...) \
  INSTANTIATE_TEST_SUITE_P(prefix, TransportTest, ::testing::Values(__VA_ARGS__), transportFactoryName)
