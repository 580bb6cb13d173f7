// tensorplay/graph.hpp: the one header users include. It includes the public headers, nothing else.
//
//     #include <tensorplay/graph.hpp>
//
// error.hpp          cuda_error, usage_error
// config.hpp         the tunable numbers, each with its reason
// stream.hpp         StreamRef, Stream, current_stream, StreamGuard
// tensor.hpp         tensor_traits, Tensor / ContiguousTensor / ScalarPredicate, TensorView
// pool.hpp           Pool, PoolId, graph_pool_handle
// device_tensor.hpp  DeviceTensor
// graph/options.hpp  CaptureErrorMode, GraphOptions, CaptureOptions, UpdateResult, DotFlags
// graph/graph.hpp    Graph: capture, replay, update, retain, conditional nodes, stage_and_launch
// graph/rebind.hpp   RebindResult: what Graph::rebind (GraphBuckets, PiecewiseGraph too) changed
// graph/conditional_scope.hpp   ConditionalScope, IfScope, WhileScope
// graph/make_graphed.hpp        make_graphed
// graph/piecewise.hpp           PiecewiseGraph: captured segments with eager steps between them
// graph/buckets.hpp             GraphBuckets, BucketOptions, Overflow: one capture per batch size
// graph/device_group.hpp        DeviceGroupGraph: one Graph per device, captured together
//
// Not included here (each needs a library of its own): <tensorplay/thrust.hpp> (PoolAllocator),
// <tensorplay/cublas.hpp>, <tensorplay/nccl.hpp>.
//
// Include tiers, lowest first: version.hpp, config.hpp, error.hpp (depend on nothing of ours);
// detail/ (includes only the tier below); the public headers and graph/ (include anything
// below them). Nothing includes a header of a higher tier.
#pragma once

#include <tensorplay/version.hpp>

#include <tensorplay/config.hpp>
#include <tensorplay/device_tensor.hpp>
#include <tensorplay/error.hpp>
#include <tensorplay/graph/buckets.hpp>
#include <tensorplay/graph/conditional_scope.hpp>
#include <tensorplay/graph/device_group.hpp>
#include <tensorplay/graph/graph.hpp>
#include <tensorplay/graph/make_graphed.hpp>
#include <tensorplay/graph/options.hpp>
#include <tensorplay/graph/piecewise.hpp>
#include <tensorplay/graph/rebind.hpp>
#include <tensorplay/pool.hpp>
#include <tensorplay/random.hpp>
#include <tensorplay/stream.hpp>
#include <tensorplay/tensor.hpp>
