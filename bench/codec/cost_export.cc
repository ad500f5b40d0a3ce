#include "cost_export.h"

#include <sys/utsname.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "compressor/registry.h"
#include "core/common/thread_pool.h"

namespace cortado::bench {
namespace {

using compressor::EncodeContext;

template <typename Fn>
double medianSeconds(int reps, Fn&& fn) {
  return medianOf(reps, [&] {
    auto a = std::chrono::steady_clock::now();
    fn();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
  });
}

// Least squares of seconds = alpha + beta * bytes with weights 1/seconds^2,
// i.e. minimizing relative error, so small sizes (alpha) and large sizes
// (beta) both fit; alpha and beta are kept non-negative (the planner refuses
// negative terms).
std::pair<double, double> fit(const std::vector<std::pair<double, double>>& pts) {
  double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (auto [x, y] : pts) {
    double w = 1.0 / std::max(y * y, 1e-18);
    sw += w;
    sx += w * x;
    sy += w * y;
    sxx += w * x * x;
    sxy += w * x * y;
  }
  double det = sw * sxx - sx * sx;
  double beta = det != 0 ? (sw * sxy - sx * sy) / det : 0;
  double alpha = (sy - beta * sx) / sw;
  if (alpha < 0) {  // refit through the origin
    alpha = 0;
    beta = sxy / sxx;
  }
  if (beta < 0) {  // flat within the noise (a GPU's launch-bound decode): a constant
    beta = 0;
    alpha = sy / sw;
  }
  return {alpha, beta};
}

std::string machine() {
  utsname u{};
  uname(&u);
  return std::string(u.sysname) + " " + u.release + " " + u.machine + ", " +
         std::to_string(std::thread::hardware_concurrency()) + " cores";
}

// The CPU codecs on the calling thread and `pool`.
CostMeasure cpuMeasure(size_t maxElements, ThreadPool* pool) {
  auto registry = std::make_shared<compressor::Registry>();
  compressor::registerCpuCodecs(*registry);
  auto x = std::make_shared<std::vector<float>>(maxElements);
  auto out = std::make_shared<std::vector<float>>(maxElements);
  std::mt19937_64 rng(1);
  std::normal_distribution<float> dist;
  for (auto& v : *x) v = dist(rng);
  return [registry, x, out, pool](const std::string& spec, size_t n, int reps) {
    auto codec = registry->create(spec);
    EncodeContext ctx;
    ctx.pool = pool;
    std::vector<std::byte> payload(codec->payloadBytes(n));
    CostPoint p;
    p.spec = codec->spec();
    p.payloadBytes = payload.size();
    p.encode = medianSeconds(reps, [&] { codec->encode(x->data(), n, payload, ctx); });
    p.decode = medianSeconds(reps, [&] { codec->decode(payload, out->data(), n, ctx); });
    p.decompressAdd = medianSeconds(reps, [&] { codec->decompressAdd(payload, out->data(), n, 1.0f, ctx); });
    return p;
  };
}

}  // namespace

bool takeFlag(int& argc, char** argv, const std::string& name, std::string* value) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind(name + "=", 0) == 0) {
      *value = a.substr(name.size() + 1);
      std::copy(argv + i + 1, argv + argc, argv + i);
      --argc;
      return true;
    }
  }
  return false;
}

size_t takeThreadsFlag(int& argc, char** argv) {
  std::string v;
  if (takeFlag(argc, argv, "--threads", &v)) return size_t(std::max(1, std::stoi(v)));
  return std::max(1u, std::thread::hardware_concurrency());
}

void takeCostFlags(int& argc, char** argv, CostExportOptions& o, std::vector<std::string> defaultSpecs) {
  std::string v;
  if (takeFlag(argc, argv, "--cost_max_elements", &v)) o.maxElements = std::stoull(v);
  if (takeFlag(argc, argv, "--cost_reps", &v)) o.reps = std::stoi(v);
  if (!takeFlag(argc, argv, "--cost_codecs", &v)) {
    o.specs = std::move(defaultSpecs);
    return;
  }
  for (size_t p = 0; p <= v.size();) {
    size_t q = v.find(';', p);
    if (q == std::string::npos) q = v.size();
    if (q > p) o.specs.push_back(v.substr(p, q - p));
    p = q + 1;
  }
}

double medianOf(int reps, const std::function<double()>& fn) {
  std::vector<double> t;
  fn();  // warm-up: page faults, caches, lazy initialization
  for (int r = 0; r < std::max(1, reps); ++r) t.push_back(fn());
  std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
  return t[t.size() / 2];
}

int runCostExport(const CostExportOptions& o) {
  const CostMeasure measure = o.measure ? o.measure : cpuMeasure(o.maxElements, o.pool);
  nlohmann::json entries = nlohmann::json::array();
  for (const auto& spec : o.specs) {
    nlohmann::json enc = nlohmann::json::array(), dec = nlohmann::json::array(),
                   add = nlohmann::json::array();
    std::vector<std::pair<double, double>> pe, pd, pa;
    std::string canonical = spec;
    for (size_t n = 1024; n <= o.maxElements; n *= 4) {
      // Fewer repetitions for big sizes keep the sweep to a few seconds per codec.
      int reps = n >= (1 << 22) ? std::max(3, o.reps / 4) : o.reps;
      const CostPoint p = measure(spec, n, reps);
      canonical = p.spec;
      double bytes = 4.0 * n;
      auto point = [&](double s) {
        return nlohmann::json{{"elements", n}, {"input_bytes", 4 * n},
                              {"payload_bytes", p.payloadBytes}, {"seconds", s}};
      };
      enc.push_back(point(p.encode));
      dec.push_back(point(p.decode));
      add.push_back(point(p.decompressAdd));
      pe.emplace_back(bytes, p.encode);
      pd.emplace_back(bytes, p.decode);
      pa.emplace_back(bytes, p.decompressAdd);
    }
    auto entry = [&](const char* op, const nlohmann::json& pts, const auto& raw) {
      auto [alpha, beta] = fit(raw);
      entries.push_back({{"codec", canonical}, {"device", o.device}, {"op", op},
                         {"alpha", alpha}, {"beta", beta}, {"points", pts}});
    };
    entry("encode", enc, pe);
    entry("decode", dec, pd);
    entry("decompress_add", add, pa);
    std::cerr << "measured " << canonical << " (" << o.device << ")\n";
  }
  char date[32];
  std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y-%m-%d", std::gmtime(&now));
  nlohmann::json doc = {{"schema", "cortado.codec_costs.v1"},
                        {"date", date},
                        {"machine", o.machine.empty() ? machine() : o.machine},
                        {"threads", o.device == "cpu" && o.pool ? o.pool->size() + 1 : 1},
                        {"model", "seconds = alpha + beta * input_bytes"},
                        {"entries", entries}};
  std::ofstream f(o.path);
  if (!f) {
    std::cerr << "cannot write " << o.path << "\n";
    return 1;
  }
  f << doc.dump(2) << "\n";
  std::cerr << "wrote " << entries.size() << " cost fits to " << o.path << "\n";
  return 0;
}

}  // namespace cortado::bench
