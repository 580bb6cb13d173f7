// tensorplay/detail/capture_doctor_evidence.hpp: what the capture doctor saw, in the order it
// happened: the driver's error-log messages and (when CUPTI watches) the API calls that failed
// with a capture error, each with the thread it came from.
//
// One ring for the whole process. Every record gets the next index of one counter, so that a
// capture can remember where the ring stood when it began (mark(), one atomic load) and later
// ask for what came after. Records arrive only when something fails: nothing here runs on a
// path that succeeds.
#pragma once

#include <tensorplay/config.hpp>
#include <tensorplay/detail/thread_id.hpp>

#include <cuda_runtime_api.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace tensorplay::detail {

//! The statuses with which a call breaks a capture (cudaError_t and CUresult share them), except
//! cudaErrorStreamCaptureInvalidated, which only says that an earlier call broke it.
constexpr bool breaks_capture(int status) noexcept {
  return status == cudaErrorStreamCaptureUnsupported || status == cudaErrorStreamCaptureMerge ||
         status == cudaErrorStreamCaptureUnmatched || status == cudaErrorStreamCaptureUnjoined ||
         status == cudaErrorStreamCaptureIsolation || status == cudaErrorStreamCaptureImplicit ||
         status == cudaErrorCapturedEvent || status == cudaErrorStreamCaptureWrongThread;
}

//! Who reported a record.
enum class EvidenceSource : unsigned char { DriverLog, RuntimeApi, DriverApi };

struct Evidence {
  std::uint64_t index = 0;         // position in the process's sequence of records
  ThreadId thread;                 // the thread whose call produced it (callbacks run on it)
  EvidenceSource source = EvidenceSource::DriverLog;
  int status = 0;                  // API records: what the call returned (cudaError_t, CUresult alike)
  cudaStream_t stream = nullptr;   // API records of cudaStreamEndCapture: its stream
  std::string text;                // a log message, or the API function's name
};

class CaptureEvidence {
 public:
  //! A broken capture logs two to four messages; 256 records keep those of the last ~60
  //! failures, more than can happen while one capture is open, at 256 small strings of memory.
  static constexpr std::size_t capacity = 256;

  TENSORPLAY_PROCESS_WIDE static CaptureEvidence& instance();

  //! The index the next record will get.
  [[nodiscard]] std::uint64_t mark() const noexcept;

  //! Adds a record from the calling thread. Never throws (a record lost to memory is dropped).
  void add(EvidenceSource source, int status, cudaStream_t stream, std::string_view text) noexcept;

  //! The records with index in [from, to) that the ring still holds, oldest first.
  [[nodiscard]] std::vector<Evidence> between(std::uint64_t from, std::uint64_t to) const;

 private:
  CaptureEvidence() = default;

  mutable std::mutex mutex_;
  std::atomic<std::uint64_t> next_{0};
  std::array<Evidence, capacity> ring_{};
};

}  // namespace tensorplay::detail

// ---- definitions: inline, or compiled once in src/library.cpp (config.hpp) ------------------

#if TENSORPLAY_DEFINE_BODIES

namespace tensorplay::detail {

TENSORPLAY_DECL CaptureEvidence& CaptureEvidence::instance() {
  static auto* evidence = new CaptureEvidence;  // leaked on purpose: callbacks may run during exit
  return *evidence;
}

TENSORPLAY_DECL std::uint64_t CaptureEvidence::mark() const noexcept { return next_.load(std::memory_order_acquire); }

TENSORPLAY_DECL void CaptureEvidence::add(EvidenceSource source, int status, cudaStream_t stream, std::string_view text) noexcept {
  try {
    std::lock_guard lock(mutex_);
    const std::uint64_t index = next_.load(std::memory_order_relaxed);
    Evidence& slot = ring_[index % capacity];
    slot.index = index;
    slot.thread = this_thread_id();
    slot.source = source;
    slot.status = status;
    slot.stream = stream;
    slot.text.assign(text);
    next_.store(index + 1, std::memory_order_release);
  } catch (...) {
  }
}

TENSORPLAY_DECL std::vector<Evidence> CaptureEvidence::between(std::uint64_t from, std::uint64_t to) const {
  std::lock_guard lock(mutex_);
  const std::uint64_t next = next_.load(std::memory_order_relaxed);
  if (to > next) to = next;
  if (next > capacity && from < next - capacity) from = next - capacity;
  std::vector<Evidence> out;
  for (std::uint64_t i = from; i < to; ++i) out.push_back(ring_[i % capacity]);
  return out;
}

}  // namespace tensorplay::detail
#endif  // TENSORPLAY_DEFINE_BODIES
