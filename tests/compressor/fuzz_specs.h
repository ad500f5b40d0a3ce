// The codecs the payload-decoding fuzzer drives; the first input byte picks
// one, so payloads of one codec also reach the others' decoders.
#pragma once

#include <array>

namespace cortado::compressor::fuzz {

inline constexpr std::array<const char*, 14> kSpecs = {
    "fp16",          "bf16",          "onebit",          "signsgd",  "efsignsgd",
    "topk:ratio=0.1", "dgc:ratio=0.1", "randomk:ratio=0.1", "qsgd:levels=1", "qsgd:levels=7",
    "qsgd:levels=100", "terngrad",    "natural",         "powersgd:rank=2"};

}  // namespace cortado::compressor::fuzz
