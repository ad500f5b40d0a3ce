// Per-family registration of the CPU codecs; registerCpuCodecs (registry.h)
// calls them all. Private to compressor/.
#pragma once

#include "compressor/registry.h"

namespace cortado::compressor::cpu {

void registerCastCodecs(Registry& r);    // fp16, bf16
void registerSignCodecs(Registry& r);    // onebit, signsgd, efsignsgd
void registerSparseCodecs(Registry& r);  // topk, dgc, randomk
void registerQuantCodecs(Registry& r);   // qsgd, terngrad, natural
void registerPowerSgd(Registry& r);      // powersgd

}  // namespace cortado::compressor::cpu
