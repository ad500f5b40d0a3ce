#include "scheduler/planner/profile.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <optional>
#include <random>
#include <type_traits>

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

bool ModelProfile::hasSparse() const {
  for (const auto& x : tensors)
    if (x.sparse()) return true;
  return false;
}

namespace {

constexpr const char* kFormatHint =
    " (the format: docs/planner.md, \"Computation\"; a bundled name or "
    "scheduler/planner/tools/measure_profile.py gives a valid one)";

// `key` of the object `j` as a T, or an Error saying where, which field, and
// what it is instead. Optional fields give `fallback` when absent.
template <typename T>
T field(const json& j, const char* key, const std::string& where, const char* what,
        std::optional<T> fallback = std::nullopt) {
  auto it = j.find(key);
  if (it == j.end()) {
    if (fallback) return *fallback;
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{}: field \"{}\" is missing; it must be {}{}", where, key, what,
                            kFormatHint));
  }
  bool ok = false;
  if constexpr (std::is_same_v<T, std::string>) {
    ok = it->is_string();
  } else if constexpr (std::is_integral_v<T>) {
    ok = it->is_number_integer();
  } else {
    ok = it->is_number();
  }
  if (!ok)
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{}: field \"{}\" is {} ({}), it must be {}{}", where, key,
                            it->type_name(), it->dump().substr(0, 40), what, kFormatHint));
  return it->get<T>();
}

}  // namespace

ModelProfile ModelProfile::fromJson(const json& j) {
  CORTADO_ENFORCE(j.is_object() && j.value("format", "") == "cortado-profile",
                  ErrorCode::kInvalidArgument,
                  "not a cortado profile (\"format\" must be \"cortado-profile\"){}", kFormatHint);
  ModelProfile p;
  p.model = field<std::string>(j, "model", "profile", "a string, the model's name");
  const std::string where = fmt::format("profile '{}'", p.model);
  p.source = field<std::string>(j, "source", where, "a string", std::string());
  p.forwardUs = field<double>(j, "forward_us", where, "a number of microseconds", 0.0);
  CORTADO_ENFORCE(std::isfinite(p.forwardUs) && p.forwardUs >= 0, ErrorCode::kInvalidArgument,
                  "{}: forward_us is {}, it must be >= 0", where, p.forwardUs);
  if (auto c = j.find("contiguous_gradients"); c != j.end()) {
    CORTADO_ENFORCE(c->is_boolean(), ErrorCode::kInvalidArgument,
                    "{}: field \"contiguous_gradients\" is {} ({}), it must be true or false{}",
                    where, c->type_name(), c->dump().substr(0, 40), kFormatHint);
    p.contiguousGradients = c->get<bool>();
  }
  auto ts = j.find("tensors");
  CORTADO_ENFORCE(ts != j.end() && ts->is_array(), ErrorCode::kInvalidArgument,
                  "{}: field \"tensors\" is {}, it must be an array of tensors{}", where,
                  ts == j.end() ? "missing" : ts->type_name(), kFormatHint);
  for (size_t i = 0; i < ts->size(); ++i) {
    const json& t = (*ts)[i];
    std::string at = fmt::format("{}, tensor {}", where, i);
    CORTADO_ENFORCE(t.is_object(), ErrorCode::kInvalidArgument, "{} is {}, it must be an object{}",
                    at, t.type_name(), kFormatHint);
    TensorProfile x;
    x.name = field<std::string>(t, "name", at, "a string");
    at = fmt::format("{} ('{}')", at, x.name);
    x.elements = field<int64_t>(t, "elements", at, "an integer > 0");
    x.dtypeBytes = field<int>(t, "dtype_bytes", at, "an integer > 0", 4);
    x.backwardUs = field<double>(t, "backward_us", at, "a number of microseconds >= 0");
    CORTADO_ENFORCE(x.elements > 0 && x.dtypeBytes > 0 && std::isfinite(x.backwardUs) &&
                        x.backwardUs >= 0,
                    ErrorCode::kInvalidArgument,
                    "{}: elements ({}) and dtype_bytes ({}) must be > 0 and backward_us ({}) >= 0",
                    at, x.elements, x.dtypeBytes, x.backwardUs);
    if (t.contains("density")) {
      x.density = field<double>(t, "density", at, "a number in (0, 1]");
      CORTADO_ENFORCE(std::isfinite(x.density) && x.density > 0 && x.density <= 1,
                      ErrorCode::kInvalidArgument,
                      "{}: density is {}, it must be in (0, 1]: the fraction of the tensor one "
                      "worker's gradient holds non-zero (leave it out for a dense tensor)",
                      at, x.density);
    }
    if (t.contains("overlap")) {
      CORTADO_ENFORCE(x.density > 0, ErrorCode::kInvalidArgument,
                      "{}: overlap is given without a density; give \"density\" too, or leave "
                      "both out for a dense tensor",
                      at);
      x.overlap = field<double>(t, "overlap", at, "a number in [density, 1]");
      CORTADO_ENFORCE(std::isfinite(x.overlap) && x.overlap >= x.density && x.overlap <= 1,
                      ErrorCode::kInvalidArgument,
                      "{}: overlap is {}, it must be in [density, 1] = [{}, 1]: 1 when every "
                      "worker has the same non-zero indices, the density when they are uniform "
                      "and independent (the default)",
                      at, x.overlap, x.density);
    }
    p.tensors.push_back(std::move(x));
  }
  CORTADO_ENFORCE(!p.tensors.empty(), ErrorCode::kInvalidArgument, "{} has no tensors", where);
  return p;
}

ModelProfile ModelProfile::load(const std::string& path) {
  std::ifstream in(path);
  CORTADO_ENFORCE(in.good(), ErrorCode::kInvalidArgument, "cannot open profile '{}'", path);
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("profile '{}' is not valid JSON: {}", path, e.what()));
  }
  try {
    return fromJson(j);
  } catch (const Error& e) {
    throw Error(ErrorCode::kInvalidArgument, fmt::format("{}: {}", path, e.what()));
  }
}

json ModelProfile::toJson() const {
  json ts = json::array();
  for (const auto& t : tensors) {
    ts.push_back({{"name", t.name}, {"elements", t.elements}, {"dtype_bytes", t.dtypeBytes},
                  {"backward_us", t.backwardUs}});
    if (t.density > 0) ts.back()["density"] = t.density;
    if (t.overlap > 0) ts.back()["overlap"] = t.overlap;
  }
  return json{{"format", "cortado-profile"}, {"model", model}, {"source", source},
              {"forward_us", forwardUs}, {"contiguous_gradients", contiguousGradients},
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
