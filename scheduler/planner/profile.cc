#include "scheduler/planner/profile.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <random>

#include "core/common/error.h"

namespace cortado::planner {

using nlohmann::json;

double ModelProfile::backwardUs() const {
  double t = 0;
  for (const auto& x : tensors) t += x.backwardUs;
  return t;
}

double ModelProfile::totalBytes() const {
  double b = 0;
  for (const auto& x : tensors) b += x.bytes();
  return b;
}

ModelProfile ModelProfile::fromJson(const json& j) {
  try {
    CORTADO_ENFORCE(j.value("format", "") == "cortado-profile", ErrorCode::kInvalidArgument,
                    "not a cortado profile (\"format\" must be \"cortado-profile\")");
    ModelProfile p;
    p.model = j.at("model").get<std::string>();
    p.source = j.value("source", "");
    p.forwardUs = j.value("forward_us", 0.0);
    for (const json& t : j.at("tensors")) {
      TensorProfile x;
      x.name = t.at("name").get<std::string>();
      x.elements = t.at("elements").get<int64_t>();
      x.dtypeBytes = t.value("dtype_bytes", 4);
      x.backwardUs = t.at("backward_us").get<double>();
      CORTADO_ENFORCE(x.elements > 0 && x.backwardUs >= 0 && x.dtypeBytes > 0,
                      ErrorCode::kInvalidArgument,
                      "profile '{}', tensor '{}': elements and dtype_bytes must be > 0 and "
                      "backward_us >= 0",
                      p.model, x.name);
      p.tensors.push_back(std::move(x));
    }
    CORTADO_ENFORCE(!p.tensors.empty(), ErrorCode::kInvalidArgument, "profile '{}' has no tensors",
                    p.model);
    return p;
  } catch (const json::exception& e) {
    throw Error(ErrorCode::kInvalidArgument, fmt::format("malformed profile: {}", e.what()));
  }
}

ModelProfile ModelProfile::load(const std::string& path) {
  std::ifstream in(path);
  CORTADO_ENFORCE(in.good(), ErrorCode::kInvalidArgument, "cannot open profile '{}'", path);
  try {
    return fromJson(json::parse(in));
  } catch (const json::exception& e) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("profile '{}' is not valid JSON: {}", path, e.what()));
  }
}

json ModelProfile::toJson() const {
  json ts = json::array();
  for (const auto& t : tensors)
    ts.push_back({{"name", t.name}, {"elements", t.elements}, {"dtype_bytes", t.dtypeBytes},
                  {"backward_us", t.backwardUs}});
  return json{{"format", "cortado-profile"}, {"model", model}, {"source", source},
              {"forward_us", forwardUs},
              {"tensors", std::move(ts)}};
}

std::vector<std::string> bundledModels() {
  return {"vgg16", "resnet50", "resnet101", "bert-base", "gpt2", "lstm"};
}

ModelProfile loadModel(const std::string& nameOrPath, const std::string& dataDir) {
  if (nameOrPath.size() > 5 && nameOrPath.ends_with(".json")) return ModelProfile::load(nameOrPath);
  for (const auto& m : bundledModels())
    if (m == nameOrPath) return ModelProfile::load(dataDir + "/profiles/" + m + ".json");
  std::string valid;
  for (const auto& m : bundledModels()) valid += (valid.empty() ? "" : ", ") + m;
  throw Error(ErrorCode::kInvalidArgument,
              fmt::format("unknown model '{}' (valid: {}, or a profile .json file)", nameOrPath,
                          valid));
}

ModelProfile syntheticModel(int tensors, uint64_t seed, int64_t minElements, int64_t maxElements,
                            double nsPerElement) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(std::log(double(minElements)),
                                           std::log(double(maxElements)));
  ModelProfile p;
  p.model = fmt::format("synthetic-{}", tensors);
  p.source = fmt::format("synthetic, seed {}", seed);
  for (int i = 0; i < tensors; ++i) {
    TensorProfile t;
    t.name = fmt::format("t{}", i);
    t.elements = int64_t(std::exp(u(rng)));
    t.backwardUs = 5.0 + t.elements * nsPerElement / 1000.0;
    p.tensors.push_back(std::move(t));
  }
  return p;
}

}  // namespace cortado::planner
