#include "core/control/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "core/common/error.h"

namespace cortado::control {

namespace {
constexpr std::string_view kNodeContext = "cortado control v1: node proves the job token";
constexpr std::string_view kSchedulerContext =
    "cortado control v1: scheduler proves the job token";
}  // namespace

std::string makeNonce() {
  std::string n(kNonceSize, '\0');
  CORTADO_ENFORCE(RAND_bytes(reinterpret_cast<unsigned char*>(n.data()), kNonceSize) == 1,
                  ErrorCode::kInternal, "RAND_bytes failed: cannot make an authentication nonce");
  return n;
}

std::string authProof(std::string_view token, Prover who, std::string_view nodeNonce,
                      std::string_view schedulerNonce) {
  std::string msg(who == Prover::kNode ? kNodeContext : kSchedulerContext);
  msg.push_back('\0');
  msg.append(nodeNonce);
  msg.append(schedulerNonce);
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int outLen = 0;
  unsigned char* r = HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()),
                          reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), out,
                          &outLen);
  CORTADO_ENFORCE(r != nullptr && outLen == kProofSize, ErrorCode::kInternal,
                  "HMAC-SHA256 failed while computing the job-token proof");
  return std::string(reinterpret_cast<const char*>(out), outLen);
}

bool proofMatches(std::string_view expected, std::string_view got) {
  if (expected.size() != got.size()) return false;
  return CRYPTO_memcmp(expected.data(), got.data(), expected.size()) == 0;
}

std::string toHex(std::string_view bytes) {
  static const char* kDigits = "0123456789abcdef";
  std::string s;
  s.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    s.push_back(kDigits[c >> 4]);
    s.push_back(kDigits[c & 15]);
  }
  return s;
}

std::optional<std::string> fromHex(std::string_view hex, size_t expectedBytes) {
  if (hex.size() != expectedBytes * 2) return std::nullopt;
  auto val = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out(expectedBytes, '\0');
  for (size_t i = 0; i < expectedBytes; ++i) {
    int hi = val(hex[2 * i]), lo = val(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out[i] = static_cast<char>((hi << 4) | lo);
  }
  return out;
}

}  // namespace cortado::control
