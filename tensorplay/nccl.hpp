// tensorplay/nccl.hpp: NCCL collectives in captured graphs: communicators that live as long as
// the graphs using them, the unique id that ranks share, and captures that say what to do when
// CUDA refuses NCCL's work inside a conditional body.
//
// Not included by <tensorplay/graph.hpp>: it needs <nccl.h> and the NCCL library (Bazel:
// deps = ["@tensorplay//:nccl"]; CMake: tensorplay::nccl). docs/multi_gpu.md shows the whole use.
//
//     namespace tp = tensorplay;
//     tp::DeviceGroupGraph group({0, 1});
//     auto comms = tp::nccl::init_clique(group.devices());     // one communicator per device
//     warm_up(comms);                                           // one eager step: NCCL connects lazily
//     tp::nccl::capture(group, comms, [&](std::span<const tp::StreamRef> s) {
//       for (std::size_t i = 0; i < s.size(); ++i) {
//         tp::StreamGuard on(s[i]);                             // a kernel needs its device current
//         grad<<<blocks, threads, 0, s[i]>>>(...);
//       }
//       tp::nccl::group([&] {
//         for (std::size_t i = 0; i < s.size(); ++i)
//           ncclAllReduce(g[i], g[i], n, ncclFloat, ncclSum, comms[i]->get(), s[i]);
//       });
//       /* update kernels, as the gradient kernels */
//     });
//     group.replay(streams);                                    // each graph keeps its communicator
//
// Lifetimes. ncclCommDestroy waits for every graph executable holding the communicator's work to
// be destroyed (NCCL 2.28 hangs otherwise): a communicator must outlive its graphs. capture() and
// retain() make each graph hold its communicator (Graph::retain): the communicator is destroyed
// once the user's handles are gone and the graphs, their executables and their last launches are
// done, on tensorplay's reaper thread (ncclCommDestroy may call CUDA there). So graphs, groups and
// communicator handles may be dropped in any order, also while replays are in flight.
#pragma once

#include <tensorplay/error.hpp>
#include <tensorplay/graph/device_group.hpp>
#include <tensorplay/graph/executable.hpp>
#include <tensorplay/graph/graph.hpp>
#include <tensorplay/graph/options.hpp>
#include <tensorplay/stream.hpp>
#include <tensorplay/version.hpp>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

namespace tensorplay {

//! An NCCL call failed.
//!
//! `what()` names the call, the NCCL result (name and description), NCCL's own last error text
//! when it has one, and the file:line of the code that asked tensorplay to make the call.
//! NCCL reports `ncclResult_t`, not `cudaError_t`, so this is not a `cuda_error`.
//! Example: `ncclCommInitAll failed: ncclInvalidArgument (invalid argument (run with
//! NCCL_DEBUG=WARN for details)) at main.cu:42`.
class nccl_error : public std::runtime_error {
 public:
  nccl_error(ncclResult_t status, std::string_view call, tensorplay::source_location where)
      : std::runtime_error(describe(status, call, where)), status_(status), where_(where) {}

  //! The result the failing call returned.
  [[nodiscard]] ncclResult_t status() const noexcept { return status_; }
  //! Where the caller asked for the failing call.
  [[nodiscard]] const tensorplay::source_location& where() const noexcept { return where_; }

  //! The enumerator's name: "ncclInvalidUsage".
  [[nodiscard]] static constexpr std::string_view name(ncclResult_t status) noexcept {
    switch (status) {
      case ncclSuccess: return "ncclSuccess";
      case ncclUnhandledCudaError: return "ncclUnhandledCudaError";
      case ncclSystemError: return "ncclSystemError";
      case ncclInternalError: return "ncclInternalError";
      case ncclInvalidArgument: return "ncclInvalidArgument";
      case ncclInvalidUsage: return "ncclInvalidUsage";
      case ncclRemoteError: return "ncclRemoteError";
      case ncclInProgress: return "ncclInProgress";
      default: return "ncclResult_t(unknown)";
    }
  }

 private:
  static std::string describe(ncclResult_t status, std::string_view call, tensorplay::source_location where) {
    // NCCL's last error may come from another call (its documentation says so): labelled as such.
    std::string more;
    if (const char* last = ncclGetLastError(nullptr); last != nullptr && *last != '\0') {
      more = "; NCCL's last error: ";
      more += last;
    }
    return detail::failed_call_text(call, name(status), ncclGetErrorString(status), more, where);
  }

  ncclResult_t status_;
  tensorplay::source_location where_;
};

namespace detail {

//! Throws `nccl_error` when `status` is not ncclSuccess.
inline void check_nccl(ncclResult_t status, const char* call, const tensorplay::source_location& where) {
  if (status != ncclSuccess) [[unlikely]]
    throw nccl_error(status, call, where);
}

//! Restores this thread's current device on destruction (NCCL calls may switch it).
class KeepCurrentDevice {
 public:
  KeepCurrentDevice() noexcept {
    if (cudaGetDevice(&device_) != cudaSuccess) {
      (void)cudaGetLastError();
      device_ = -1;
    }
  }
  KeepCurrentDevice(const KeepCurrentDevice&) = delete;
  KeepCurrentDevice& operator=(const KeepCurrentDevice&) = delete;
  ~KeepCurrentDevice() {
    if (device_ >= 0) (void)cudaSetDevice(device_);
  }

 private:
  int device_ = -1;
};

}  // namespace detail

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
    detail::KeepCurrentDevice keep;
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
    detail::KeepCurrentDevice keep;
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
  detail::KeepCurrentDevice keep;
  TENSORPLAY_CHECK(cudaSetDevice(device), where);
  ncclComm_t comm = nullptr;
  detail::check_nccl(ncclCommInitRank(&comm, nranks, id.get(), rank), "ncclCommInitRank", where);
  return std::make_shared<Communicator>(comm);
}

// ---- grouped calls --------------------------------------------------------------------------

//! ncclGroupStart(), f(), ncclGroupEnd(): collectives issued by `f` (to several communicators
//! from one thread, say) are issued together. If `f` throws, the group is still ended (NCCL's
//! per-thread group state must not stay open) and the exception propagates; inside a capture,
//! what the group issued is abandoned with the capture.
//! \throws nccl_error when NCCL refuses to start or end the group.
template <class F>
void group(F&& f, tensorplay::source_location where = tensorplay::source_location::current()) {
  detail::check_nccl(ncclGroupStart(), "ncclGroupStart", where);
  try {
    f();
  } catch (...) {
    (void)ncclGroupEnd();
    throw;
  }
  detail::check_nccl(ncclGroupEnd(), "ncclGroupEnd", where);
}

// ---- graphs that hold communicators ---------------------------------------------------------

//! Makes each device's graph of `group` hold comms[i] (the communicator of devices()[i]) until
//! that graph, its executables and their last launches are gone. capture() does this for you;
//! call it yourself after group.capture() (reset() and a failed capture drop what graphs hold).
//! \throws usage_error when comms.size() differs from the group's size, a communicator is null,
//!         or comms[i] runs on another device than devices()[i].
inline void retain(DeviceGroupGraph& group, std::span<const std::shared_ptr<Communicator>> comms,
                   tensorplay::source_location where = tensorplay::source_location::current()) {
  if (comms.size() != group.size())
    detail::throw_usage("nccl::retain: " + std::to_string(comms.size()) + " communicator(s) for " +
                        std::to_string(group.size()) + " device(s); give one per device, in the order of devices()");
  for (std::size_t i = 0; i < comms.size(); ++i) {
    if (!comms[i] || comms[i]->get() == nullptr)
      detail::throw_usage("nccl::retain: communicator " + std::to_string(i) + " is null");
    if (const int device = comms[i]->device(where); device != group.devices()[i])
      detail::throw_usage("nccl::retain: communicator " + std::to_string(i) + " runs on device " +
                          std::to_string(device) + ", the group's graph " + std::to_string(i) + " on device " +
                          std::to_string(group.devices()[i]));
  }
  for (std::size_t i = 0; i < comms.size(); ++i) group.graph(group.devices()[i]).retain(comms[i], where);
}

//! Waits until the handles in `comms` are the only ones left: the graphs that held these
//! communicators are gone and CUDA has released them (which happens shortly after the last
//! graph, executable and launch, on another thread). Call it before the end of main so that the
//! communicators are destroyed there, not by tensorplay's reaper thread while the process exits.
//! Returns false if some graph still holds one after `timeout`.
[[nodiscard]] inline bool wait_until_released(std::span<const std::shared_ptr<Communicator>> comms,
                                              std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    bool released = true;
    for (const auto& comm : comms) released = released && (!comm || comm.use_count() == 1);
    if (released) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// ---- collectives inside conditional bodies ----------------------------------------------------

//! NCCL's graph mixing support, as NCCL will see it: on unless the environment variable
//! NCCL_GRAPH_MIXING_SUPPORT reads as 0 (NCCL's default is 1; it parses the value with strtoll
//! and reads it once per process, at its first collective: change it before creating
//! communicators). NCCL copies NCCL_CONF_FILE, ~/.nccl.conf and /etc/nccl.conf into the
//! environment when it initialises, so this also sees those once a communicator exists.
[[nodiscard]] inline bool graph_mixing_support() noexcept {
  const char* text = std::getenv("NCCL_GRAPH_MIXING_SUPPORT");
  if (text == nullptr || *text == '\0') return true;
  errno = 0;
  const long long value = std::strtoll(text, nullptr, 0);
  return errno != 0 || value != 0;
}

//! Collectives inside a conditional body (if_, while_, ...) need NCCL's graph mixing support
//! off: with it on, NCCL adds event nodes to every captured collective, and CUDA allows no event
//! node in a conditional body. Call this before capturing such a graph.
//! \throws usage_error, saying what to set, when graph_mixing_support() is true.
inline void require_graph_mixing_off() {
  if (!graph_mixing_support()) return;
  detail::throw_usage(
      "NCCL collectives inside a conditional body need NCCL_GRAPH_MIXING_SUPPORT=0 in the environment before NCCL "
      "initialises (before the first communicator of the process is created): with NCCL's graph mixing support on, "
      "every captured collective brings event nodes, which CUDA does not allow in a conditional body. With it off, "
      "do not let eager NCCL calls and graph launches on one communicator overlap");
}

}  // namespace nccl

namespace detail {

//! True when `what` is tensorplay's report of work that CUDA does not allow in a conditional
//! body: refused when the body closed (graph/conditional_builder.hpp) or at instantiation
//! (graph/executable.hpp names CUDA's instantiation result).
inline bool is_conditional_body_refusal(std::string_view what) {
  return what.find("a conditional body may hold only") != std::string_view::npos ||
         what.find("inside a conditional body") != std::string_view::npos ||
         what.find(instantiate_result_name(cudaGraphInstantiateNodeOperationNotSupported)) != std::string_view::npos;
}

//! Runs `f`; turns a conditional-body refusal, while graph mixing support is on, into the
//! usage_error of require_graph_mixing_off (with the original text appended).
template <class F>
void explaining_conditional_refusal(F&& f) {
  auto explain = [](const std::exception& e) {
    if (!nccl::graph_mixing_support() || !is_conditional_body_refusal(e.what())) return;
    try {
      nccl::require_graph_mixing_off();
    } catch (const usage_error& explained) {
      throw usage_error(std::string(explained.what()) + ". What CUDA refused: " + e.what());
    }
  };
  try {
    f();
  } catch (const usage_error& e) {
    explain(e);
    throw;
  } catch (const cuda_error& e) {
    explain(e);
    throw;
  }
}

}  // namespace detail

namespace nccl {

//! group.capture(body) (either body form of DeviceGroupGraph), then retain(group, comms). When
//! CUDA refuses collectives inside a conditional body because NCCL's graph mixing support is on,
//! the error is a usage_error that says to set NCCL_GRAPH_MIXING_SUPPORT=0. On any throw the
//! group is left reset, holding nothing.
//! \throws what DeviceGroupGraph::capture and retain() throw.
template <class F>
void capture(DeviceGroupGraph& group, std::span<const std::shared_ptr<Communicator>> comms, F&& body,
             tensorplay::source_location where = tensorplay::source_location::current()) {
  detail::explaining_conditional_refusal([&] { group.capture(body, where); });
  try {
    retain(group, comms, where);
  } catch (...) {
    group.reset();  // a graph with NCCL work must not outlive its communicator
    throw;
  }
}

//! graph.capture(body, options), then graph.retain(comm): one rank per process (or thread).
//! Conditional-body refusals are explained as for the DeviceGroupGraph form. On any throw the
//! graph is left reset.
template <class F>
void capture(Graph& graph, std::shared_ptr<Communicator> comm, F&& body, const CaptureOptions& options = {},
             tensorplay::source_location where = tensorplay::source_location::current()) {
  if (!comm || comm->get() == nullptr) detail::throw_usage("nccl::capture: the communicator is null");
  detail::explaining_conditional_refusal([&] { graph.capture(body, options, where); });
  try {
    graph.retain(std::move(comm), where);
  } catch (...) {
    graph.reset();
    throw;
  }
}

}  // namespace nccl
}  // namespace tensorplay
