#include "compressor/cpu/cpu_codecs.h"
#include "compressor/registry.h"

namespace cortado::compressor {

void registerCpuCodecs(Registry& registry) {
  cpu::registerCastCodecs(registry);
  cpu::registerSignCodecs(registry);
  cpu::registerSparseCodecs(registry);
  cpu::registerQuantCodecs(registry);
  cpu::registerPowerSgd(registry);
}

}  // namespace cortado::compressor
