#include "core/common/dtype.h"

#include "core/common/error.h"

namespace cortado {

size_t dtypeSize(DType t) {
  switch (t) {
    case DType::kUInt8:
    case DType::kInt8: return 1;
    case DType::kFloat16:
    case DType::kBFloat16: return 2;
    case DType::kFloat32:
    case DType::kInt32: return 4;
    case DType::kFloat64:
    case DType::kInt64: return 8;
  }
  throw Error(ErrorCode::kInvalidArgument, fmt::format("invalid dtype {}", static_cast<int>(t)));
}

const char* dtypeName(DType t) {
  switch (t) {
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kUInt8: return "uint8";
    case DType::kInt8: return "int8";
  }
  return "invalid";
}

DType parseDType(std::string_view n) {
  if (n == "float32" || n == "fp32" || n == "f32" || n == "float") return DType::kFloat32;
  if (n == "float64" || n == "fp64" || n == "f64" || n == "double") return DType::kFloat64;
  if (n == "float16" || n == "fp16" || n == "f16" || n == "half") return DType::kFloat16;
  if (n == "bfloat16" || n == "bf16") return DType::kBFloat16;
  if (n == "int32" || n == "i32") return DType::kInt32;
  if (n == "int64" || n == "i64") return DType::kInt64;
  if (n == "uint8" || n == "u8") return DType::kUInt8;
  if (n == "int8" || n == "i8") return DType::kInt8;
  throw Error(ErrorCode::kInvalidArgument,
              fmt::format("unknown dtype '{}': valid are float32, float64, float16, bfloat16, "
                          "int32, int64, uint8, int8",
                          n));
}

bool isValidDType(uint8_t raw) { return raw < kNumDTypes; }

bool isFloating(DType t) {
  return t == DType::kFloat32 || t == DType::kFloat64 || t == DType::kFloat16 ||
         t == DType::kBFloat16;
}

}  // namespace cortado
