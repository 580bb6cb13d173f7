// tensorplay/graph/conditional_scope.hpp: ConditionalScope, IfScope, WhileScope.
#pragma once

#include <tensorplay/graph/detail/conditional_builder.hpp>
#include <tensorplay/graph/graph.hpp>
#include <tensorplay/stream.hpp>
#include <tensorplay/tensor.hpp>
#include <tensorplay/version.hpp>

#include <concepts>
#include <cstddef>
#include <exception>
#include <memory>
#include <type_traits>
#include <utility>

namespace tensorplay {

//! Opens a conditional body in its constructor and closes it in its destructor, also during
//! stack unwinding. A WhileScope re-reads its predicate at the end of the body (when the scope
//! ends normally), as while_ does.
//!
//!     { tensorplay::WhileScope loop(graph, not_converged);
//!       iterate<<<blocks, threads, 0, loop.stream()>>>(x.data(), not_converged.data()); }
//!
//! A predicate tensor must outlive the scope; a device callable is copied. With a
//! ConditionalHandle (Graph::conditional_handle) the user's kernels set the handle, and a
//! WhileScope's body must set it to 0 to stop.
template <ConditionalKind K>
class ConditionalScope {
 public:
  template <class P>
  ConditionalScope(Graph& graph, const P& pred, tensorplay::source_location where = tensorplay::source_location::current())
      : graph_(&graph), uncaught_(std::uncaught_exceptions()), where_(where) {
    if constexpr (std::same_as<P, ConditionalHandle>) {
      // The user's kernels set the handle, also at the end of a while body.
      if constexpr (K == ConditionalKind::If) graph.begin_capture_to_if_node(pred, where);
      else graph.begin_capture_to_while_node(pred, where);
    } else {
      static_assert(detail::check_predicate_type<P>());
      if constexpr (K == ConditionalKind::If) {
        graph.begin_capture_to_if_node(pred, where);
      } else {
        graph.begin_capture_to_while_node(pred, where);
        // A tensor predicate is read where it lives (it must outlive the scope); a callable is copied.
        using Held = std::conditional_t<ScalarPredicate<P>, const P*, P>;
        if constexpr (ScalarPredicate<P>) refresh_ = std::make_unique<Refresh<Held>>(&pred);
        else refresh_ = std::make_unique<Refresh<Held>>(pred);
      }
    }
    depth_ = graph.conditional_depth();
    stream_ = graph.capture_stream();
  }
  ConditionalScope(const ConditionalScope&) = delete;
  ConditionalScope& operator=(const ConditionalScope&) = delete;

  //! Closes the body. A failure (CUDA invalidated the capture) cannot be thrown from here: the
  //! capture stays open, so work issued after the scope is captured and discarded, never run,
  //! and capture_end throws the error.
  ~ConditionalScope() {
    const bool unwinding = std::uncaught_exceptions() > uncaught_;
    graph_->close_scope(depth_, [&] { if (refresh_ && !unwinding) refresh_->run(*graph_, where_); }, where_);
  }

  //! The body's capture stream (also the current stream while the body is open).
  [[nodiscard]] StreamRef stream() const noexcept { return stream_; }

 private:
  Graph* graph_;
  int uncaught_;
  tensorplay::source_location where_;
  std::size_t depth_ = 0;
  StreamRef stream_{};
  // What a WhileScope re-reads at the end of its body.
  struct RefreshBase {
    virtual ~RefreshBase() = default;
    virtual void run(Graph& graph, const tensorplay::source_location& where) = 0;
  };
  template <class Held>
  struct Refresh final : RefreshBase {
    explicit Refresh(Held held) : pred(std::move(held)) {}
    void run(Graph& graph, const tensorplay::source_location& where) override {
      if constexpr (std::is_pointer_v<Held>) graph.set_conditional_handle_for_current_node(*pred, where);
      else graph.set_conditional_handle_for_current_node(pred, where);
    }
    Held pred;
  };
  std::unique_ptr<RefreshBase> refresh_;
};

using IfScope = ConditionalScope<ConditionalKind::If>;
using WhileScope = ConditionalScope<ConditionalKind::While>;

}  // namespace tensorplay
