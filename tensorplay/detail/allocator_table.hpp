// tensorplay/detail/allocator_table.hpp: the blocks handed out through PoolAllocator, found again
// by address when Thrust deallocates them.
#pragma once

#include <tensorplay/config.hpp>
#include <tensorplay/detail/capture_context.hpp>

#include <cuda_runtime_api.h>

#include <mutex>
#include <unordered_map>
#include <utility>

namespace tensorplay::detail {

//! Blocks handed out through PoolAllocator, found again by address on deallocate.
class AllocatorTable {
 public:
  TENSORPLAY_PROCESS_WIDE static AllocatorTable& instance() {
    static auto* table = new AllocatorTable;
    return *table;
  }
  void insert(PoolBlock block) {
    void* ptr = block.ptr();
    std::lock_guard lock(mutex_);
    blocks_.emplace(ptr, std::move(block));
  }
  //! Removes and returns the block at `ptr`; destroying the result frees it.
  PoolBlock extract(void* ptr) noexcept {
    std::lock_guard lock(mutex_);
    auto it = blocks_.find(ptr);
    if (it == blocks_.end()) return {};
    PoolBlock block = std::move(it->second);
    blocks_.erase(it);
    return block;
  }
  bool record_use(const void* ptr, cudaStream_t stream) {
    std::lock_guard lock(mutex_);
    auto it = blocks_.find(const_cast<void*>(ptr));
    if (it == blocks_.end()) return false;
    it->second.record_use(stream);
    return true;
  }

 private:
  std::mutex mutex_;
  std::unordered_map<void*, PoolBlock> blocks_;
};

}  // namespace tensorplay::detail
