// tensorplay/nccl/communicator.hpp: Communicator (one owner of an ncclComm_t) and init_clique.
#pragma once

#include <tensorplay/detail/device_guard.hpp>
#include <tensorplay/nccl/error.hpp>
#include <tensorplay/error.hpp>
#include <tensorplay/version.hpp>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace tensorplay {
namespace nccl {

// ---- communicators ------------------------------------------------------------------------

//! Owns one `ncclComm_t`; ncclCommDestroy on destruction. Move-only; share it with
//! std::shared_ptr (what init_clique and init_rank return, and what graphs retain).
//!
//! Destroy a communicator only after every graph holding its work is gone (NCCL waits for them,
//! forever if they live on): let the graphs hold it (capture(), retain(), Graph::retain) and
//! this is so whatever the order in which you drop things.
class Communicator {
 public:
  //! Takes ownership of `comm` (which may be null).
  explicit Communicator(ncclComm_t comm) noexcept : comm_(comm) {}
  Communicator(Communicator&& other) noexcept : comm_(std::exchange(other.comm_, nullptr)) {}
  Communicator& operator=(Communicator&& other) noexcept {
    Communicator moved(std::move(other));
    std::swap(comm_, moved.comm_);
    return *this;
  }
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  //! ncclCommDestroy (its result is ignored: a destructor cannot report it). The calling
  //! thread's current device is kept.
  ~Communicator() { reset(); }

  [[nodiscard]] ncclComm_t get() const noexcept { return comm_; }
  operator ncclComm_t() const noexcept { return comm_; }  // NOLINT: implicit by design, like StreamRef

  //! This communicator's rank. \throws nccl_error
  [[nodiscard]] int rank(tensorplay::source_location where = tensorplay::source_location::current()) const {
    int rank = 0;
    detail::check_nccl(ncclCommUserRank(comm_, &rank), "ncclCommUserRank", where);
    return rank;
  }
  //! Number of ranks. \throws nccl_error
  [[nodiscard]] int size(tensorplay::source_location where = tensorplay::source_location::current()) const {
    int count = 0;
    detail::check_nccl(ncclCommCount(comm_, &count), "ncclCommCount", where);
    return count;
  }
  //! The CUDA device this rank runs on. \throws nccl_error
  [[nodiscard]] int device(tensorplay::source_location where = tensorplay::source_location::current()) const {
    int device = 0;
    detail::check_nccl(ncclCommCuDevice(comm_, &device), "ncclCommCuDevice", where);
    return device;
  }

  //! Gives up ownership: the caller destroys the returned handle.
  [[nodiscard]] ncclComm_t release() noexcept { return std::exchange(comm_, nullptr); }

  //! ncclCommDestroy now (if a communicator is held).
  void reset() noexcept {
    if (comm_ == nullptr) return;
    detail::DeviceGuard keep;  // NCCL calls may switch the current device
    (void)ncclCommDestroy(std::exchange(comm_, nullptr));
  }

 private:
  ncclComm_t comm_ = nullptr;
};

//! One communicator per device of this process, rank i on devices[i] (ncclCommInitAll). Use
//! them from one thread with grouped calls (group(), or ncclGroupStart/ncclGroupEnd).
//! \throws usage_error for an empty list; nccl_error when NCCL refuses.
[[nodiscard]] inline std::vector<std::shared_ptr<Communicator>> init_clique(
    std::span<const int> devices, tensorplay::source_location where = tensorplay::source_location::current()) {
  if (devices.empty()) detail::throw_usage("nccl::init_clique: the device list is empty");
  std::vector<ncclComm_t> raw(devices.size(), nullptr);
  std::vector<std::shared_ptr<Communicator>> comms;
  comms.reserve(raw.size());
  {
    detail::DeviceGuard keep;  // NCCL calls may switch the current device
    detail::check_nccl(ncclCommInitAll(raw.data(), static_cast<int>(devices.size()), devices.data()),
                       "ncclCommInitAll", where);
  }
  std::size_t owned = 0;
  try {
    for (; owned < raw.size(); ++owned) comms.push_back(std::make_shared<Communicator>(raw[owned]));
  } catch (...) {  // out of memory: the handles not yet owned are destroyed here
    for (std::size_t i = owned; i < raw.size(); ++i) (void)ncclCommDestroy(raw[i]);
    throw;
  }
  return comms;
}

}  // namespace nccl
}  // namespace tensorplay
