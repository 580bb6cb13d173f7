// tensorplay/graph.hpp: the one header users include. It includes the public headers, nothing else.
//
//     #include <tensorplay/graph.hpp>
//
// error.hpp          cuda_error, usage_error
// stream.hpp         StreamRef, Stream, current_stream, StreamGuard
// tensor.hpp         tensor_traits, Tensor / ContiguousTensor / ScalarPredicate, TensorView
// pool.hpp           Pool, PoolId, graph_pool_handle, PoolAllocator, record_stream
// device_tensor.hpp  DeviceTensor
// graph/options.hpp  CaptureErrorMode, GraphOptions, CaptureOptions
// graph/graph.hpp    Graph: capture, replay, conditional nodes, stage_and_launch
// graph/conditional_scope.hpp   ConditionalScope, IfScope, WhileScope
// graph/make_graphed.hpp        make_graphed
#pragma once

#include <tensorplay/version.hpp>

#include <tensorplay/device_tensor.hpp>
#include <tensorplay/error.hpp>
#include <tensorplay/graph/conditional_scope.hpp>
#include <tensorplay/graph/graph.hpp>
#include <tensorplay/graph/make_graphed.hpp>
#include <tensorplay/graph/options.hpp>
#include <tensorplay/pool.hpp>
#include <tensorplay/stream.hpp>
#include <tensorplay/tensor.hpp>
