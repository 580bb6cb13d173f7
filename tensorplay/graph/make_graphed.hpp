// tensorplay/graph/make_graphed.hpp: make_graphed, the C++ counterpart of PyTorch's
// make_graphed_callables.
#pragma once

#include <tensorplay/graph/graph.hpp>
#include <tensorplay/graph/options.hpp>
#include <tensorplay/stream.hpp>
#include <tensorplay/version.hpp>

#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>

namespace tensorplay {

struct MakeGraphedOptions {
  //! Eager runs of the body before capture (on a side stream, then synchronised), so that
  //! lazy initialisation (library handles, module loading) happens outside the capture.
  int warmup_runs = 1;
  GraphOptions graph = {};
};

//! A body captured once over its static inputs. Calling it with fresh inputs stages them onto
//! the static inputs, replays, and returns the static outputs (what the body returned).
template <class Output, class... S>
class Graphed {
 public:
  //! stage_and_launch on the current stream; returns the static outputs.
  template <class... I>
  decltype(auto) operator()(I&... inputs) {
    graph_.stage_and_launch(statics_, std::tie(inputs...));
    return outputs();
  }

  //! stage_and_launch on `stream`; returns the static outputs.
  template <class... I>
  decltype(auto) launch(StreamRef stream, I&... inputs) {
    graph_.stage_and_launch(statics_, std::tie(inputs...), stream);
    return outputs();
  }

  [[nodiscard]] Graph& graph() noexcept { return graph_; }

  //! What the body returned during capture (a value it returned is kept here).
  decltype(auto) outputs() {
    if constexpr (std::is_void_v<Output>) {
      return;
    } else if constexpr (std::is_reference_v<Output>) {
      return static_cast<Output>(**output_);  // a pointer to what the body returned
    } else {
      return static_cast<Output&>(*output_);
    }
  }

 private:
  template <class O, class F, class... T>
  friend Graphed<O, T...> make_graphed_impl(MakeGraphedOptions, F&, T&...);

  using Stored = std::conditional_t<std::is_void_v<Output>, int,
                                    std::conditional_t<std::is_reference_v<Output>, std::remove_reference_t<Output>*, Output>>;

  explicit Graphed(GraphOptions options, S&... statics) : graph_(std::move(options)), statics_(statics...) {}

  Graph graph_;
  std::tuple<S&...> statics_;
  std::optional<Stored> output_;
};

template <class Output, class F, class... S>
Graphed<Output, S...> make_graphed_impl(MakeGraphedOptions options, F& body, S&... statics) {
  {
    Stream side;
    StreamGuard guard(side);
    for (int i = 0; i < options.warmup_runs; ++i) (void)body(statics...);
    side.synchronize();
  }
  Graphed<Output, S...> graphed(std::move(options.graph), statics...);
  graphed.graph_.capture([&] {
    if constexpr (std::is_void_v<Output>) {
      body(statics...);
    } else if constexpr (std::is_reference_v<Output>) {
      graphed.output_.emplace(&body(statics...));
    } else {
      graphed.output_.emplace(body(statics...));
    }
  });
  return graphed;
}

//! Captures `body(static_inputs...)` once and returns a callable that, given fresh inputs,
//! stage_and_launches them and returns the static outputs. The static inputs must outlive it.
//!
//!     auto step = tensorplay::make_graphed([](auto& x) -> auto& { scale(x); return out; }, static_x);
//!     auto& y = step(fresh_x);   // copies fresh_x onto static_x, replays, returns out
template <class F, class... S>
auto make_graphed(F&& body, S&... static_inputs) {
  using Output = std::invoke_result_t<F&, S&...>;
  return make_graphed_impl<Output>(MakeGraphedOptions{}, body, static_inputs...);
}

template <class F, class... S>
auto make_graphed(MakeGraphedOptions options, F&& body, S&... static_inputs) {
  using Output = std::invoke_result_t<F&, S&...>;
  return make_graphed_impl<Output>(std::move(options), body, static_inputs...);
}

}  // namespace tensorplay
