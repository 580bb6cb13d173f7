// tensorplay/graph/detail/retained.hpp: what a Graph's graphs and executables keep alive (Graph::retain,
// and the pool its captures allocated from).
//
// One bundle per Graph (until reset()): the objects it retained and its pool. Every outer graph
// the Graph is replayed into holds the bundle through one CUDA user object, and so does every
// graph the Graph captures once it retained an object, and every executable CUDA compiles from
// those graphs. The bundle dies when the Graph dropped it and the last graph, executable and
// launch holding it are gone. Objects retained after the first join the bundle, which the
// executables already hold: only the first retain after compiling costs a compile (CUDA gives an
// executable references only to what its graph held when it was compiled). A graph with nothing
// retained holds no user object, because CUDA takes a reference at every launch of an executable
// that holds one (about 2 us of host time per cudaGraphLaunch on the H200); its own pool lives
// as long as the Graph, and a dying pool's cudaFree waits for the launches still running.
// When CUDA releases the last reference, the destructor runs on the library's reaper thread
// (reaper.hpp), never on CUDA's, so it may call CUDA.
#pragma once

#include <tensorplay/config.hpp>
#include <tensorplay/detail/handles.hpp>
#include <tensorplay/error.hpp>
#include <tensorplay/version.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <mutex>
#include <type_traits>
#include <utility>
#include <vector>

namespace tensorplay::detail {

class PoolImpl;

template <class T>
struct is_shared_ptr : std::false_type {};
template <class T>
struct is_shared_ptr<std::shared_ptr<T>> : std::true_type {};

class KeepAlive {
 public:
  // The bundle is made on first use: most Graphs retain nothing and are never replayed into
  // another capture. A moved-from KeepAlive is empty too, and usable.

  //! Keeps `object` (a shared_ptr, or any move-only value, moved) for the bundle's lifetime.
  template <class T>
  void add(T&& object) {
    using Value = std::remove_cvref_t<T>;
    std::shared_ptr<const void> held;
    if constexpr (is_shared_ptr<Value>::value)
      held = std::forward<T>(object);
    else
      held = std::make_shared<Value>(std::forward<T>(object));
    Bundle& bundle = made();
    std::lock_guard lock(bundle.mutex);
    bundle.objects.push_back(std::move(held));
  }

  //! The pool the Graph's captures allocate from (the bundle keeps it for its executables).
  void set_pool(std::shared_ptr<PoolImpl> pool);

  //! Gives `graph` (a new capture of the Graph, before it is compiled) a reference to the bundle.
  void retain_on(cudaGraph_t graph, const tensorplay::source_location& where) const;

  //! Gives the capture running on `stream` (an outer graph this Graph is replayed into, or the
  //! capture that holds its conditional body) a reference to the bundle.
  void retain_on_capture(cudaStream_t stream, const tensorplay::source_location& where) const;

  //! Drops the Graph's reference and starts an empty bundle (the old one lives on while graphs,
  //! executables and launches hold it).
  void clear() noexcept;
  //! Whether the Graph's graphs and executables must hold the bundle: it holds retained objects.
  [[nodiscard]] bool needed() const;
  [[nodiscard]] std::size_t size() const;

 private:
  struct Bundle {
    mutable std::mutex mutex;
    std::vector<std::shared_ptr<const void>> objects;
    std::shared_ptr<PoolImpl> pool;
  };

  Bundle& made() const;

  // A CUDA user object holding one reference to the bundle.
  [[nodiscard]] UserObjectRef make_ref(const tensorplay::source_location& where) const;

  mutable std::shared_ptr<Bundle> bundle_;  // null until first used
};

}  // namespace tensorplay::detail

// ---- definitions: inline, or compiled once in src/library.cpp (config.hpp) ------------------

#if TENSORPLAY_DEFINE_BODIES
#include <tensorplay/detail/capture_retain.hpp>
#include <tensorplay/detail/reaper.hpp>

namespace tensorplay::detail {

TENSORPLAY_DECL void KeepAlive::set_pool(std::shared_ptr<PoolImpl> pool) {
  if (!bundle_ && !pool) return;
  Bundle& bundle = made();
  std::lock_guard lock(bundle.mutex);
  bundle.pool = std::move(pool);
}

TENSORPLAY_DECL void KeepAlive::retain_on(cudaGraph_t graph, const tensorplay::source_location& where) const {
  UserObjectRef ref = make_ref(where);
  TENSORPLAY_CHECK(cudaGraphRetainUserObject(graph, ref.get(), 1, cudaGraphUserObjectMove), where);
  (void)ref.release();  // moved into the graph
}

TENSORPLAY_DECL void KeepAlive::retain_on_capture(cudaStream_t stream, const tensorplay::source_location& where) const {
  detail::retain_on_capture(stream, make_ref(where).release(), where);
}

TENSORPLAY_DECL void KeepAlive::clear() noexcept { bundle_.reset(); }

TENSORPLAY_DECL bool KeepAlive::needed() const { return size() != 0; }

TENSORPLAY_DECL std::size_t KeepAlive::size() const {
  if (!bundle_) return 0;
  std::lock_guard lock(bundle_->mutex);
  return bundle_->objects.size();
}

TENSORPLAY_DECL auto KeepAlive::made() const -> Bundle& {
  if (!bundle_) bundle_ = std::make_shared<Bundle>();
  return *bundle_;
}

TENSORPLAY_DECL UserObjectRef KeepAlive::make_ref(const tensorplay::source_location& where) const {
  made();
  auto box = std::make_unique<RetainedValue<std::shared_ptr<Bundle>>>(std::shared_ptr<Bundle>(bundle_));
  cudaUserObject_t handle = nullptr;
  TENSORPLAY_CHECK(cudaUserObjectCreate(&handle, box.get(), &Reaper::enqueue, 1, cudaUserObjectNoDestructorSync), where);
  (void)box.release();  // CUDA owns it now: the reaper deletes it
  Reaper::instance();   // started before CUDA can call back
  return UserObjectRef(handle);
}

}  // namespace tensorplay::detail
#endif  // TENSORPLAY_DEFINE_BODIES
