// tensorplay/nccl/graphs.hpp: grouped calls, graphs that hold communicators, and collectives inside conditional bodies.
#pragma once

#include <tensorplay/graph/device_group.hpp>
#include <tensorplay/graph/detail/executable.hpp>
#include <tensorplay/graph/graph.hpp>
#include <tensorplay/graph/options.hpp>
#include <tensorplay/nccl/communicator.hpp>
#include <tensorplay/nccl/error.hpp>
#include <tensorplay/stream.hpp>
#include <tensorplay/error.hpp>
#include <tensorplay/version.hpp>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace tensorplay {
namespace nccl {

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

//! Runs `f`; turns a conditional-body refusal, while graph mixing support is on, into the
//! usage_error of require_graph_mixing_off (with the original text appended).
template <class F>
void explaining_conditional_refusal(F&& f) {
  // Work CUDA does not allow in a conditional body: refused when the body closed
  // (conditional_body_error), or at instantiation (instantiate_error, "node operation not supported").
  auto explain = [](const std::exception& e) {
    if (!nccl::graph_mixing_support()) return;
    try {
      nccl::require_graph_mixing_off();
    } catch (const usage_error& explained) {
      throw usage_error(std::string(explained.what()) + ". What CUDA refused: " + e.what());
    }
  };
  try {
    f();
  } catch (const conditional_body_error& e) {
    explain(e);
    throw;
  } catch (const instantiate_error& e) {
    if (e.result() == cudaGraphInstantiateNodeOperationNotSupported) explain(e);
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
