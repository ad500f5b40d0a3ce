// cortado._C.Gravac: GraVAC's per-worker compressor (compressor/
// gravac_compressor.h) for the Python layer (cortado/gravac.py). Tensors
// arrive as addresses (a torch tensor's data_ptr() or a NumPy array's
// ctypes.data) and element counts; the caller keeps them alive and
// contiguous for the call. Encoding and decoding run without the GIL. The
// object does no communication: the Python layer reduces the sums and moves
// the messages with push_pull.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>

#include "compressor/gravac_compressor.h"
#include "compressor/registry.h"
#include "core/common/error.h"

namespace py = pybind11;

namespace cortado::python {
namespace {

using compressor::GravacCompressor;
using compressor::GravacOptions;
using compressor::GravacStep;
using compressor::GravacSums;

template <typename T>
T* address(uintptr_t p) {
  return reinterpret_cast<T*>(p);  // NOLINT(performance-no-int-to-ptr)
}

}  // namespace

GravacOptions gravacOptions(const std::string& codec, double minRatio, double maxRatio, double step,
                            const std::string& policy, uint64_t window, double epsilon,
                            double omega, double alpha, uint64_t seed) {
  GravacOptions o;
  o.codec = codec;
  o.minRatio = minRatio;
  o.maxRatio = maxRatio;
  o.step = step;
  o.policy = compressor::parseGravacPolicy(policy);
  o.window = window;
  o.epsilon = epsilon;
  o.omega = omega;
  o.alpha = alpha;
  o.seed = seed;
  return o;
}

py::dict gravacStepDict(const GravacStep& s) {
  py::dict d;
  d["iteration"] = s.iteration;
  d["level"] = compressor::gravacLevelName(s.level);
  d["ratio"] = s.ratio;
  d["min_ratio"] = s.minRatio;
  d["candidate_ratio"] = s.candidateRatio;
  d["gain_min"] = s.gainMin;
  d["gain_candidate"] = s.gainCandidate;
  d["next_min_ratio"] = s.nextMinRatio;
  d["next_candidate_ratio"] = s.nextCandidateRatio;
  d["saturated"] = s.saturated;
  return d;
}

void bindGravac(py::module_& m, const compressor::Registry& registry) {
  py::class_<GravacCompressor>(m, "Gravac",
                               "GraVAC's adaptive compression on one worker: error feedback, the "
                               "two-level encode and the controller (compressor/gravac.h).")
      .def(py::init([&registry](const std::string& codec, double minRatio, double maxRatio,
                                double step, const std::string& policy, uint64_t window,
                                double epsilon, double omega, double alpha, uint64_t seed,
                                int workers, double samples) {
             return std::make_unique<GravacCompressor>(
                 registry,
                 gravacOptions(codec, minRatio, maxRatio, step, policy, window, epsilon, omega,
                               alpha, seed),
                 workers, samples);
           }),
           py::arg("codec") = "dgc", py::arg("min_ratio") = 10.0, py::arg("max_ratio") = 1000.0,
           py::arg("step") = 2.0, py::arg("policy") = "exponential", py::arg("window") = 500,
           py::arg("epsilon") = 0.9, py::arg("omega") = 0.01, py::arg("alpha") = 0.0,
           py::arg("seed") = 0, py::arg("workers") = 1, py::arg("samples_per_iteration") = 1.0)
      .def(
          "prepare",
          [](GravacCompressor& g, uint64_t key, uintptr_t grad, size_t n, uint64_t seed) {
            py::gil_scoped_release nogil;
            compressor::EncodeContext ctx;
            ctx.seed = seed;
            g.prepare(key, address<const float>(grad), n, ctx);
          },
          py::arg("key"), py::arg("grad"), py::arg("count"), py::arg("seed"),
          "Folds the float32 gradient at address `grad` into the key's error feedback and "
          "encodes it at the minimum and the candidate ratio. `seed`: the round, equal on "
          "every worker.")
      .def(
          "local_sums",
          [](const GravacCompressor& g) {
            GravacSums s = g.localSums();
            return py::make_tuple(s.compensated, s.minimum, s.candidate);
          },
          "(sum |g_ef|^2, sum |g_min|^2, sum |g_c|^2) over the tensors prepared this iteration.")
      .def(
          "decide",
          [](GravacCompressor& g, double compensated, double minimum, double candidate,
             double previousSeconds) {
            GravacStep s;
            {
              py::gil_scoped_release nogil;
              s = g.decide({compensated, minimum, candidate}, previousSeconds);
            }
            return gravacStepDict(s);
          },
          py::arg("compensated"), py::arg("minimum"), py::arg("candidate"),
          py::arg("previous_seconds"),
          "The controller's step on the sums reduced over all workers and the previous "
          "iteration's agreed duration; commits every prepared tensor. Returns the decision.")
      .def(
          "message_bytes",
          [](const GravacCompressor& g, uint64_t key) { return g.message(key).size(); },
          py::arg("key"), "Bytes of what the key sends this iteration.")
      .def(
          "copy_message",
          [](const GravacCompressor& g, uint64_t key, uintptr_t out, size_t capacity) {
            auto msg = g.message(key);
            if (msg.size() > capacity)
              throw Error(ErrorCode::kInvalidArgument,
                          fmt::format("GraVAC copy_message: tensor key {} sends {} bytes, the "
                                      "buffer holds {}",
                                      key, msg.size(), capacity));
            std::memcpy(address<std::byte>(out), msg.data(), msg.size());
            return msg.size();
          },
          py::arg("key"), py::arg("out"), py::arg("capacity"),
          "Copies the key's message to address `out`; returns its size.")
      .def(
          "decompress_add",
          [](const GravacCompressor& g, uint64_t key, uintptr_t message, size_t bytes,
             uintptr_t sum, float alpha) {
            py::gil_scoped_release nogil;
            g.decompressAdd(key,
                            std::span<const std::byte>(address<const std::byte>(message), bytes),
                            address<float>(sum), alpha);
          },
          py::arg("key"), py::arg("message"), py::arg("bytes"), py::arg("sum"),
          py::arg("alpha") = 1.0f,
          "sum += alpha * decoded message (one worker's, or a sum of summable ones).")
      .def(
          "residual",
          [](const GravacCompressor& g, uint64_t key) {
            auto r = g.residual(key);
            return std::vector<float>(r.begin(), r.end());
          },
          py::arg("key"), "The key's error-feedback residual (a copy; empty when unknown).")
      .def_property_readonly(
          "level", [](const GravacCompressor& g) { return compressor::gravacLevelName(g.level()); })
      .def_property_readonly("min_ratio",
                             [](const GravacCompressor& g) { return g.controller().minRatio(); })
      .def_property_readonly(
          "candidate_ratio",
          [](const GravacCompressor& g) { return g.controller().candidateRatio(); })
      .def_property_readonly("saturated",
                             [](const GravacCompressor& g) { return g.controller().saturated(); })
      .def_property_readonly("iteration",
                             [](const GravacCompressor& g) { return g.controller().iteration(); })
      .def_property_readonly("alpha",
                             [](const GravacCompressor& g) { return g.controller().alpha(); })
      .def_property_readonly("momentum", &GravacCompressor::momentum)
      .def_property_readonly("summable",
                             [](const GravacCompressor& g) { return g.codec().summable(); })
      .def_property_readonly(
          "throughputs", [](const GravacCompressor& g) { return g.controller().throughputs(); },
          "{CF: mean compression throughput (samples/s x gain)} recorded so far.");
}

}  // namespace cortado::python
