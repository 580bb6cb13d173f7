// tensorplay/nccl/unique_id.hpp: the id that the ranks of a communicator share, passed through a file, and init_rank.
#pragma once

#include <tensorplay/detail/device_guard.hpp>
#include <tensorplay/nccl/communicator.hpp>
#include <tensorplay/nccl/error.hpp>
#include <tensorplay/error.hpp>
#include <tensorplay/version.hpp>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <system_error>
#include <thread>

namespace tensorplay {
namespace nccl {

// ---- one rank per process: the unique id --------------------------------------------------

//! The id that every rank of a communicator passes to ncclCommInitRank: 128 plain bytes, made
//! by one rank (generate()) and sent to the others by any channel (a file: write_unique_id and
//! read_unique_id; MPI, a socket, a key-value store: bytes() and from_bytes()). Across hosts,
//! only the channel changes.
class UniqueId {
 public:
  static constexpr std::size_t byte_count = NCCL_UNIQUE_ID_BYTES;

  //! All zero bytes (not a usable id).
  UniqueId() noexcept = default;

  //! A new id (ncclGetUniqueId), on the rank that starts the communicator. \throws nccl_error
  [[nodiscard]] static UniqueId generate(tensorplay::source_location where = tensorplay::source_location::current()) {
    UniqueId id;
    detail::check_nccl(ncclGetUniqueId(&id.id_), "ncclGetUniqueId", where);
    return id;
  }

  //! The id whose bytes are `bytes`. \throws usage_error unless there are exactly byte_count.
  [[nodiscard]] static UniqueId from_bytes(std::span<const std::byte> bytes) {
    if (bytes.size() != byte_count)
      detail::throw_usage("nccl::UniqueId::from_bytes: an NCCL unique id has " + std::to_string(byte_count) +
                          " bytes, not " + std::to_string(bytes.size()));
    UniqueId id;
    std::memcpy(id.id_.internal, bytes.data(), byte_count);
    return id;
  }

  [[nodiscard]] std::span<const std::byte, byte_count> bytes() const noexcept {
    return std::span<const std::byte, byte_count>(reinterpret_cast<const std::byte*>(id_.internal), byte_count);
  }
  [[nodiscard]] const ncclUniqueId& get() const noexcept { return id_; }

  friend bool operator==(const UniqueId& a, const UniqueId& b) noexcept {
    return std::memcmp(a.id_.internal, b.id_.internal, byte_count) == 0;
  }

 private:
  ncclUniqueId id_{};
};

//! Writes `id` to `path` so that a reader never sees part of it: into a temporary file beside
//! `path`, then renamed onto it (atomic on one POSIX file system).
//! \throws std::system_error or std::filesystem::filesystem_error when the file cannot be written.
inline void write_unique_id(const UniqueId& id, const std::filesystem::path& path) {
  static std::atomic<unsigned> serial{0};
  std::filesystem::path temp = path;
  temp += ".tmp." + std::to_string(::getpid()) + "." + std::to_string(serial.fetch_add(1));
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(id.bytes().data()), static_cast<std::streamsize>(UniqueId::byte_count));
    out.close();
    if (!out) {
      std::error_code ignored;
      std::filesystem::remove(temp, ignored);
      throw std::system_error(errno != 0 ? errno : EIO, std::generic_category(),
                              "tensorplay: nccl::write_unique_id: cannot write " + temp.string());
    }
  }
  std::filesystem::rename(temp, path);  // throws filesystem_error
}

//! Waits until `path` holds a unique id (written by write_unique_id, perhaps by another process
//! or host sharing the file system) and returns it. Polls every millisecond or so.
//! \throws std::system_error with std::errc::timed_out when none appears within `timeout`.
[[nodiscard]] inline UniqueId read_unique_id(const std::filesystem::path& path, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::array<std::byte, UniqueId::byte_count> bytes{};
  for (auto pause = std::chrono::microseconds(200);; pause = std::min(pause * 2, std::chrono::microseconds(5000))) {
    std::ifstream in(path, std::ios::binary);
    if (in && in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size())) &&
        in.peek() == std::ifstream::traits_type::eof())
      return UniqueId::from_bytes(bytes);
    if (std::chrono::steady_clock::now() >= deadline)
      throw std::system_error(std::make_error_code(std::errc::timed_out),
                              "tensorplay: nccl::read_unique_id: no unique id appeared at " + path.string() + " within " +
                                  std::to_string(timeout.count()) + " ms");
    std::this_thread::sleep_for(pause);
  }
}

//! Rank 0 makes a new id and writes it to `path`; every other rank waits for it there.
//! \throws as generate(), write_unique_id() and read_unique_id().
[[nodiscard]] inline UniqueId exchange_unique_id(const std::filesystem::path& path, int rank,
                                                 std::chrono::milliseconds timeout,
                                                 tensorplay::source_location where = tensorplay::source_location::current()) {
  if (rank != 0) return read_unique_id(path, timeout);
  UniqueId id = UniqueId::generate(where);
  write_unique_id(id, path);
  return id;
}

//! The communicator of `rank` among `nranks`, on `device` (ncclCommInitRank; one rank per
//! process, or per thread). Every rank calls it with the same id; it returns once all have.
//! The calling thread's current device is kept.
//! \throws usage_error for a rank outside [0, nranks); nccl_error when NCCL refuses.
[[nodiscard]] inline std::shared_ptr<Communicator> init_rank(const UniqueId& id, int nranks, int rank, int device,
                                                             tensorplay::source_location where = tensorplay::source_location::current()) {
  if (nranks < 1 || rank < 0 || rank >= nranks)
    detail::throw_usage("nccl::init_rank: rank " + std::to_string(rank) + " is outside [0, " + std::to_string(nranks) + ")");
  detail::DeviceGuard keep(device, where);  // the caller's device comes back (NCCL calls may switch it too)
  ncclComm_t comm = nullptr;
  detail::check_nccl(ncclCommInitRank(&comm, nranks, id.get(), rank), "ncclCommInitRank", where);
  return std::make_shared<Communicator>(comm);
}

}  // namespace nccl
}  // namespace tensorplay
