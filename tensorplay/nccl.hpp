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
//
// The parts, one job each: nccl/error.hpp (nccl_error), nccl/communicator.hpp (Communicator,
// init_clique), nccl/unique_id.hpp (UniqueId through a file, init_rank), nccl/graphs.hpp
// (group, retain, capture, collectives in conditional bodies).
#pragma once

#include <tensorplay/nccl/communicator.hpp>
#include <tensorplay/nccl/error.hpp>
#include <tensorplay/nccl/graphs.hpp>
#include <tensorplay/nccl/unique_id.hpp>
