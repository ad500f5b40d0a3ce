// Builds codecs by spec string, e.g. "topk:ratio=0.01" or "qsgd:levels=15".
// Registration is explicit (registerCpuCodecs, registerCudaCodecs); the
// registry is an ordinary object that a main or a test owns. Unknown names,
// unknown parameters and out-of-range values throw kInvalidArgument with a
// message that lists what is valid.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "compressor/codec.h"

namespace cortado::compressor {

// One numeric parameter of a codec. Booleans are integers in [0, 1].
struct ParamDef {
  std::string name;
  double defaultValue = 0;
  double min = 0;
  double max = 0;
  bool integer = false;
  std::string help;
};

// A parsed spec: "name" or "name:key=value,key=value".
struct CodecSpec {
  std::string name;
  std::vector<std::pair<std::string, std::string>> params;  // in spec order
  // Throws kInvalidArgument on syntax errors (empty name, missing '=', duplicate key).
  static CodecSpec parse(std::string_view text);
};

// Validated parameter values with defaults filled in.
class Params {
 public:
  Params(std::string codecName, std::vector<ParamDef> defs, std::map<std::string, double> values)
      : name_(std::move(codecName)), defs_(std::move(defs)), values_(std::move(values)) {}
  double get(const std::string& key) const;
  int64_t getInt(const std::string& key) const { return static_cast<int64_t>(get(key)); }
  bool getBool(const std::string& key) const { return get(key) != 0; }
  // "name:k1=v1,k2=v2" with every parameter in declaration order.
  std::string canonical() const;

 private:
  std::string name_;
  std::vector<ParamDef> defs_;
  std::map<std::string, double> values_;
};

using CodecFactory = std::function<std::unique_ptr<Codec>(const Params&)>;

struct CodecInfo {
  std::string name;  // lower case, as in specs
  std::string help;  // one line: what it sends
  std::vector<ParamDef> params;
};

class Registry {
 public:
  // Throws kInvalidArgument when (name, device) is already registered.
  void add(Device device, CodecInfo info, CodecFactory factory);
  bool has(std::string_view name, Device device = Device::kCpu) const;
  std::vector<std::string> names(Device device = Device::kCpu) const;
  const CodecInfo& info(std::string_view name, Device device = Device::kCpu) const;
  // Validates the spec against the codec's parameters and builds it.
  CodecPtr create(std::string_view spec, Device device = Device::kCpu) const;
  // The spec with defaults filled in and values normalized (what create()'s
  // codec reports as spec()); workers and servers compare these.
  std::string canonical(std::string_view spec, Device device = Device::kCpu) const;
  // Multi-line listing of every codec and its parameters.
  std::string help(Device device = Device::kCpu) const;

 private:
  struct Entry {
    CodecInfo info;
    CodecFactory factory;
  };
  const Entry& find(std::string_view name, Device device) const;
  Params parseParams(const Entry& e, const CodecSpec& spec) const;
  std::map<std::pair<Device, std::string>, Entry, std::less<>> entries_;
};

// Registers fp16, bf16, onebit, signsgd, efsignsgd, topk, randomk, dgc, qsgd,
// terngrad, natural and powersgd for Device::kCpu.
void registerCpuCodecs(Registry& registry);

}  // namespace cortado::compressor
