// BackendBuffer: one allocation of a backend's memory, freed with it. The forward pass keeps its
// activations, per-step metadata and (on device backends) weights in these.
// PinnedHostBuffer: host memory pinned for a backend's queued copies, unpinned with it.
#pragma once

#include <cstddef>
#include <memory>

#include "common/status.h"
#include "engine/backend.h"

namespace pdserve::engine {

class BackendBuffer {
 public:
  BackendBuffer() = default;
  BackendBuffer(const BackendBuffer&) = delete;
  BackendBuffer& operator=(const BackendBuffer&) = delete;
  // The allocation moves; `other` is left empty.
  BackendBuffer(BackendBuffer&& other) noexcept : backend_(other.backend_), ptr_(other.ptr_), bytes_(other.bytes_) {
    other.ptr_ = nullptr;
    other.bytes_ = 0;
  }
  BackendBuffer& operator=(BackendBuffer&& other) noexcept {
    if (this != &other) {
      reset();
      backend_ = other.backend_;
      ptr_ = other.ptr_;
      bytes_ = other.bytes_;
      other.ptr_ = nullptr;
      other.bytes_ = 0;
    }
    return *this;
  }
  ~BackendBuffer() { reset(); }

  // Makes room for at least `bytes` on `backend` (zeroed when it grows; contents are lost then).
  Status reserve(Backend* backend, size_t bytes) {
    if (ptr_ != nullptr && bytes <= bytes_) return absl::OkStatus();
    reset();
    PD_ASSIGN_OR_RETURN(ptr_, backend->allocate(bytes));
    backend_ = backend;
    bytes_ = bytes;
    return absl::OkStatus();
  }
  // Makes room for at least `bytes` keeping the contents (the new part zeroed): for state that
  // lives across steps, like the repetition penalty's bitmaps.
  Status grow_keeping(Backend* backend, size_t bytes) {
    if (ptr_ != nullptr && bytes <= bytes_) return absl::OkStatus();
    PD_ASSIGN_OR_RETURN(void* grown, backend->allocate(bytes));
    Status copied = ptr_ != nullptr ? backend->copy_to_device(grown, ptr_, bytes_) : absl::OkStatus();
    if (copied.ok()) copied = backend->synchronize();  // The copy reads the old allocation.
    if (!copied.ok()) {
      backend->deallocate(grown);
      return copied;
    }
    reset();
    ptr_ = grown;
    backend_ = backend;
    bytes_ = bytes;
    return absl::OkStatus();
  }
  void reset() {
    if (ptr_ != nullptr) backend_->deallocate(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  size_t bytes() const { return bytes_; }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }

 private:
  Backend* backend_ = nullptr;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Host memory that a device backend's queued copies (Backend::copy_to_host_queued) fill without
// waiting for them: pinned on the backend when it is allocated, unpinned when it goes. A backend
// whose memory is the host's needs no pinning; one that cannot pin leaves it pageable (its queued
// copies then wait), and pinned() says so. The backend outlives it, and its owner waits for the
// copies into it before it goes.
class PinnedHostBuffer {
 public:
  PinnedHostBuffer() = default;
  PinnedHostBuffer(const PinnedHostBuffer&) = delete;
  PinnedHostBuffer& operator=(const PinnedHostBuffer&) = delete;
  ~PinnedHostBuffer() { reset(); }

  // `bytes` of zeroed host memory in place of the previous, pinned on `backend` unless its memory
  // is the host's or it cannot pin.
  void allocate(Backend* backend, size_t bytes) {
    reset();
    data_ = std::make_unique<std::byte[]>(bytes);
    if (!backend->host_memory() && backend->pin_host_memory(data_.get(), bytes).ok()) pinned_on_ = backend;
  }
  // Whether a device backend pinned it.
  bool pinned() const { return pinned_on_ != nullptr; }
  template <typename T>
  T* as() const {
    return reinterpret_cast<T*>(data_.get());
  }

 private:
  void reset() {
    if (pinned_on_ != nullptr) pinned_on_->unpin_host_memory(data_.get());
    pinned_on_ = nullptr;
    data_.reset();
  }
  Backend* pinned_on_ = nullptr;
  std::unique_ptr<std::byte[]> data_;
};

}  // namespace pdserve::engine
