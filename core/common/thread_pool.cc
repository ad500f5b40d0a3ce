#include "core/common/thread_pool.h"

#include <exception>
#include <latch>

namespace cortado {

ThreadPool::ThreadPool(size_t threads) {
  threads_.reserve(threads);
  for (size_t i = 0; i < threads; ++i) threads_.emplace_back([this] { loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadPool::post(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    queue_.push_back(std::move(fn));
  }
  cv_.notify_one();
}

void ThreadPool::loop() {
  for (;;) {
    std::function<void()> fn;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      fn = std::move(queue_.front());
      queue_.pop_front();
    }
    fn();
  }
}

void ThreadPool::parallelFor(size_t n, size_t minChunk,
                             const std::function<void(size_t, size_t)>& fn) {
  if (n == 0) return;
  size_t parts = std::min(threads_.size() + 1, std::max<size_t>(1, n / std::max<size_t>(1, minChunk)));
  if (parts <= 1) {
    fn(0, n);
    return;
  }
  size_t per = (n + parts - 1) / parts;
  std::latch done(static_cast<ptrdiff_t>(parts - 1));
  std::mutex errMu;
  std::exception_ptr err;
  for (size_t p = 1; p < parts; ++p) {
    size_t b = p * per, e = std::min(n, b + per);
    post([&, b, e] {
      try {
        if (b < e) fn(b, e);
      } catch (...) {
        std::lock_guard<std::mutex> lk(errMu);
        err = std::current_exception();
      }
      done.count_down();
    });
  }
  try {
    fn(0, std::min(n, per));
  } catch (...) {
    std::lock_guard<std::mutex> lk(errMu);
    if (!err) err = std::current_exception();
  }
  done.wait();
  if (err) std::rethrow_exception(err);
}

}  // namespace cortado
