// Address helpers for jobs that span hosts: which local address reaches a
// given host (what a node advertises to peers there), and the subnet of the
// interface that holds an address (what OpenMPI's TCP components are
// restricted to).
#pragma once

#include <string>

namespace cortado::net {

// The numeric IPv4 address of `host` (a name or a dotted quad), resolved on
// this machine. Throws Error(kInvalidArgument) naming the host when it does
// not resolve.
std::string resolveIPv4(const std::string& host);

// The local IPv4 address that the kernel's routes use to reach `host` (no
// packet is sent: a UDP socket is connected and asked for its name). Throws
// Error(kUnavailable) naming the host when there is no route.
std::string localAddressToward(const std::string& host);

// "a.b.c.d/len" of the interface that holds `address`, or "" when no
// interface holds it.
std::string subnetOf(const std::string& address);

// True for 127.0.0.0/8.
bool isLoopback(const std::string& address);

// This machine's host name as gethostname() gives it ("unknown-host" when it
// fails): what a node registers with the scheduler, so what the launcher
// compares its own roles' registrations with.
std::string localHostname();

}  // namespace cortado::net
