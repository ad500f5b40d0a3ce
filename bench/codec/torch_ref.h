// torch.topk on a tensor we own, behind a plain interface so that the
// benchmark itself does not compile libtorch's headers.
#pragma once

#include <cstddef>

namespace cortado::bench {

// True when this build links libtorch.
bool torchAvailable();
// Runs torch::topk(|x|, k) once (x wrapped without a copy; abs inside the
// timed region, as a Python user would write it) and returns its seconds.
double torchTopkOnce(const float* x, size_t n, size_t k);
// Threads torch's intra-op pool uses.
int torchThreads();

}  // namespace cortado::bench
