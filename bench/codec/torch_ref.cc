#include "torch_ref.h"

#include <chrono>

#ifdef CORTADO_BENCH_TORCH
#include <ATen/Parallel.h>
#include <torch/torch.h>
#endif

namespace cortado::bench {

#ifdef CORTADO_BENCH_TORCH
bool torchAvailable() { return true; }

double torchTopkOnce(const float* x, size_t n, size_t k) {
  auto t = torch::from_blob(const_cast<float*>(x), {static_cast<int64_t>(n)}, torch::kFloat32);
  auto start = std::chrono::steady_clock::now();
  auto r = torch::topk(t.abs(), static_cast<int64_t>(k));
  auto end = std::chrono::steady_clock::now();
  (void)r;
  return std::chrono::duration<double>(end - start).count();
}

int torchThreads() { return at::get_num_threads(); }
#else
bool torchAvailable() { return false; }
double torchTopkOnce(const float*, size_t, size_t) { return 0; }
int torchThreads() { return 0; }
#endif

}  // namespace cortado::bench
