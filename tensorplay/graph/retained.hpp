// tensorplay/graph/retained.hpp: objects that live as long as a graph (Graph::retain).
//
// Each object becomes a CUDA user object. The Graph holds one reference, and every graph it
// captures (and every executable CUDA makes from those) holds its own: CUDA releases the object
// once the Graph dropped it and the last graph, executable and launch that can use it are gone.
// The destructor then runs on the library's reaper thread (reaper.hpp), never on CUDA's.
#pragma once

#include <tensorplay/detail/handles.hpp>
#include <tensorplay/detail/reaper.hpp>
#include <tensorplay/error.hpp>
#include <tensorplay/version.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

namespace tensorplay::detail {

class RetainedObjects {
 public:
  //! Takes `object` (moved), and retains it on `graph` too when there is one.
  template <class T>
  void add(T&& object, cudaGraph_t graph, const tensorplay::source_location& where) {
    UserObjectRef ref = make(std::forward<T>(object), where);
    if (graph != nullptr) TENSORPLAY_CHECK(cudaGraphRetainUserObject(graph, ref.get(), 1, 0), where);
    objects_.push_back(std::move(ref));
  }

  //! Retains every object on `graph` (a new capture of the same Graph, or an outer graph).
  void retain_on(cudaGraph_t graph, const tensorplay::source_location& where) const {
    for (const UserObjectRef& ref : objects_) TENSORPLAY_CHECK(cudaGraphRetainUserObject(graph, ref.get(), 1, 0), where);
  }

  //! Retains the objects added after the first `first` on `graph`.
  void retain_since(std::size_t first, cudaGraph_t graph, const tensorplay::source_location& where) const {
    for (std::size_t i = first; i < objects_.size(); ++i)
      TENSORPLAY_CHECK(cudaGraphRetainUserObject(graph, objects_[i].get(), 1, 0), where);
  }

  //! Retains a copy of `value` on `graph` only (the graph gets the one reference).
  template <class T>
  static void retain_copy(const T& value, cudaGraph_t graph, const tensorplay::source_location& where) {
    UserObjectRef ref = make(T(value), where);
    TENSORPLAY_CHECK(cudaGraphRetainUserObject(graph, ref.get(), 1, cudaGraphUserObjectMove), where);
    (void)ref.release();  // moved into the graph
  }

  //! Drops the Graph's references (the objects live on while graphs and launches hold them).
  void clear() noexcept { objects_.clear(); }
  [[nodiscard]] std::size_t size() const noexcept { return objects_.size(); }

 private:
  template <class T>
  static UserObjectRef make(T&& object, const tensorplay::source_location& where) {
    using Value = std::remove_cvref_t<T>;
    auto box = std::make_unique<RetainedValue<Value>>(std::forward<T>(object));
    cudaUserObject_t handle = nullptr;
    TENSORPLAY_CHECK(cudaUserObjectCreate(&handle, box.get(), &Reaper::enqueue, 1, cudaUserObjectNoDestructorSync), where);
    (void)box.release();  // CUDA owns it now: the reaper deletes it
    Reaper::instance();   // started before CUDA can call back
    return UserObjectRef(handle);
  }

  std::vector<UserObjectRef> objects_;
};

}  // namespace tensorplay::detail
