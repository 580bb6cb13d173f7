// tensorplay/detail/thread_id.hpp: which thread, as std::thread::id tells it, without <thread>.
//
// <thread> brings <stop_token> and <semaphore> into every translation unit that includes
// tensorplay; the capture registry and the capture doctor only compare threads.
#pragma once

#include <tensorplay/config.hpp>

#include <pthread.h>

namespace tensorplay::detail {

//! What std::thread::id holds on POSIX: a pthread_t compared with == (the default, 0, names no
//! thread).
struct ThreadId {
  pthread_t value = 0;
  friend bool operator==(ThreadId, ThreadId) = default;
};

//! The calling thread.
TENSORPLAY_DECL ThreadId this_thread_id() noexcept;

}  // namespace tensorplay::detail

// ---- definitions: inline, or compiled once in src/library.cpp (config.hpp) ------------------

#if TENSORPLAY_DEFINE_BODIES

namespace tensorplay::detail {

TENSORPLAY_DECL ThreadId this_thread_id() noexcept { return {pthread_self()}; }

}  // namespace tensorplay::detail
#endif  // TENSORPLAY_DEFINE_BODIES
