// test/odr_so.cu: a shared library that allocates tensorplay memory for its caller (see
// odr_so.hpp). Built with default and with hidden symbol visibility (test/BUILD.bazel).
#include "odr_so.hpp"

#include <tensorplay/graph.hpp>

#include <cstdio>
#include <exception>

namespace {
void record(OdrSoAllocation* out, int error, const char* what) {
  out->error = error;
  std::snprintf(out->message, sizeof out->message, "%s", what);
}
}  // namespace

void* odr_so_allocate_in_capture(std::size_t elements, OdrSoAllocation* out) {
  try {
    out->current_stream = tensorplay::current_stream().get();
    auto* tensor = new tensorplay::DeviceTensor<float>(elements);
    const tensorplay::PoolId id = tensor->pool().id();
    out->pool_device = id.device();
    out->pool_serial = id.serial();
    return tensor;
  } catch (const tensorplay::usage_error& e) {
    record(out, 1, e.what());
  } catch (const std::exception& e) {
    record(out, 2, e.what());
  }
  return nullptr;
}

void odr_so_release(void* tensor) { delete static_cast<tensorplay::DeviceTensor<float>*>(tensor); }
