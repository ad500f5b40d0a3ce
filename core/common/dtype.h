// Element types that Cortado moves and sums, their sizes and their names.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace cortado {

enum class DType : uint8_t {
  kFloat32 = 0,
  kFloat64 = 1,
  kFloat16 = 2,
  kBFloat16 = 3,
  kInt32 = 4,
  kInt64 = 5,
  kUInt8 = 6,
  kInt8 = 7,
};
inline constexpr int kNumDTypes = 8;

size_t dtypeSize(DType t);
const char* dtypeName(DType t);
// Parses "float32"/"fp32"/"f32", "float16"/"fp16"/"half", "bfloat16"/"bf16", ...
// Throws Error listing the valid names when the name is unknown.
DType parseDType(std::string_view name);
bool isValidDType(uint8_t raw);
bool isFloating(DType t);

}  // namespace cortado
