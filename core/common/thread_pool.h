// A fixed pool of threads running posted closures in FIFO order. Used for
// parallel summation and CPU codecs. Owned by whoever creates it; no globals.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace cortado {

class ThreadPool {
 public:
  explicit ThreadPool(size_t threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  size_t size() const { return threads_.size(); }
  void post(std::function<void()> fn);
  // Runs fn(begin, end) over [0, n) split into at most size()+1 parts, the
  // caller taking one; returns when all are done. Exceptions propagate.
  void parallelFor(size_t n, size_t minChunk, const std::function<void(size_t, size_t)>& fn);

 private:
  void loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace cortado
