// Job-token challenge-response for the control plane (private).
//
// Each side sends a fresh random nonce; each proves that it knows the job token
// with HMAC-SHA256(token, context || nodeNonce || schedulerNonce), where the
// context differs for the node's and the scheduler's proof so that neither can
// be replayed as the other. The token itself never crosses the wire.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace cortado::control {

inline constexpr size_t kNonceSize = 32;
inline constexpr size_t kProofSize = 32;

enum class Prover { kNode, kScheduler };

// kNonceSize random bytes from OpenSSL's CSPRNG; throws Error(kInternal) when
// it cannot be had.
std::string makeNonce();

// The raw kProofSize-byte HMAC that `who` sends.
std::string authProof(std::string_view token, Prover who, std::string_view nodeNonce,
                      std::string_view schedulerNonce);

// Constant-time comparison (CRYPTO_memcmp); false when the lengths differ.
bool proofMatches(std::string_view expected, std::string_view got);

std::string toHex(std::string_view bytes);
// nullopt unless `hex` is exactly 2*expectedBytes hex digits.
std::optional<std::string> fromHex(std::string_view hex, size_t expectedBytes);

}  // namespace cortado::control
