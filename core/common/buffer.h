// Buffer: a contiguous byte range with shared ownership. Transports send and
// receive Buffers without copying: a Buffer may own heap memory, or borrow
// memory kept alive by an arbitrary owner (a zmq_msg_t, a UCX receive, a
// tensor held by the caller).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>

namespace cortado {

class Buffer {
 public:
  Buffer() = default;
  // Copies share the memory. A moved-from Buffer is empty (no data, size
  // 0), never a view of memory it no longer keeps alive.
  Buffer(const Buffer&) = default;
  Buffer& operator=(const Buffer&) = default;
  Buffer(Buffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)),
        size_(std::exchange(o.size_, 0)),
        owner_(std::move(o.owner_)) {}
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
      owner_ = std::move(o.owner_);
    }
    return *this;
  }

  // A new zero-filled heap buffer of `size` bytes (64-byte aligned).
  static Buffer allocate(size_t size);
  // A new heap buffer holding a copy of [data, data+size).
  static Buffer copyOf(const void* data, size_t size);
  // Borrows [data, data+size); `owner` keeps the memory alive until every
  // Buffer that refers to it is gone. The caller must not write the memory
  // while a transport is sending it.
  static Buffer wrap(void* data, size_t size, std::shared_ptr<void> owner) {
    Buffer b;
    b.data_ = static_cast<uint8_t*>(data);
    b.size_ = size;
    b.owner_ = std::move(owner);
    return b;
  }

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  // True when no other Buffer (and no transport) refers to this memory.
  bool unique() const { return owner_.use_count() == 1; }
  template <typename T>
  T* as() const {
    return reinterpret_cast<T*>(data_);
  }
  // A view of [offset, offset+len) sharing this buffer's owner.
  Buffer slice(size_t offset, size_t len) const {
    Buffer b = *this;
    b.data_ = data_ + offset;
    b.size_ = len;
    return b;
  }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::shared_ptr<void> owner_;
};

inline Buffer Buffer::allocate(size_t size) {
  Buffer b;
  if (size == 0) return b;
  void* p = ::operator new(size, std::align_val_t(64));
  std::memset(p, 0, size);
  b.owner_ = std::shared_ptr<void>(p, [](void* q) { ::operator delete(q, std::align_val_t(64)); });
  b.data_ = static_cast<uint8_t*>(p);
  b.size_ = size;
  return b;
}

inline Buffer Buffer::copyOf(const void* data, size_t size) {
  Buffer b = allocate(size);
  if (size) std::memcpy(b.data_, data, size);
  return b;
}

}  // namespace cortado
