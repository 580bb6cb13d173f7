// tensorplay/detail/launch.hpp: checked kernel launches.
#pragma once

#include <tensorplay/error.hpp>

#include <cuda_runtime.h>

#include <source_location>
#include <utility>

namespace tensorplay::detail {

//! Launches `kernel<<<grid, block, 0, stream>>>(args...)` and throws cuda_error if the launch
//! is refused (the `<<<>>>` syntax would leave the error for an unrelated later call to find).
//! `programmatic`: the kernel may start before the previous kernel on the stream ends (it
//! must wait for it with cudaGridDependencySynchronize before reading its results).
template <class... Params, class... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream, const std::source_location& where,
            bool programmatic, Args&&... args) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  config.attrs = programmatic ? &attribute : nullptr;
  config.numAttrs = programmatic ? 1 : 0;
  check(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...), "cudaLaunchKernelEx (tensorplay kernel)", where);
}

}  // namespace tensorplay::detail
