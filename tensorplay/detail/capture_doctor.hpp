// tensorplay/detail/capture_doctor.hpp: when a capture breaks, which call broke it and who made it.
//
// Every place where tensorplay notices a broken capture (capture_end, the end of a conditional
// body, a replay or retain into a capture, a refused cudaStreamBeginCapture) throws through
// here. The doctor reads what was seen since the capture began (capture_doctor_evidence.hpp: the
// driver's error log, and CUPTI's records when it watches) and what the registry knows of the
// captures (capture_registry.hpp: where each began, on which thread, in which mode), and
// builds a capture_error:
//   - the culprit is the first call since the capture began that failed with a capture error
//     (not cudaErrorStreamCaptureInvalidated, which only repeats that an earlier call broke it),
//     on the capturing thread first, else on another thread (only a global capture can be
//     broken from another thread by an unsafe call), named as the runtime API spells it;
//   - a capture ended behind tensorplay's back (cudaStreamEndCapture reports a stream that is not
//     capturing) names cudaStreamEndCapture (and, with CUPTI, the thread that ended it);
//   - the driver's message is the culprit's log lines, the sentence before its "Returning ...";
//   - a call from another thread that was capturing names that thread's capture; a call refused
//     because another thread's global capture is open names that capture (its file:line if it
//     is tensorplay's).
// Nothing here runs unless a capture failed.
#pragma once

#include <tensorplay/config.hpp>
#include <tensorplay/detail/capture_registry.hpp>
#include <tensorplay/error.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tensorplay::detail {

//! Statuses that mean "the capture is broken": capture_error rather than cuda_error.
constexpr bool is_capture_failure(cudaError_t status) noexcept {
  return status == cudaErrorStreamCaptureInvalidated || breaks_capture(status);
}

class CaptureDoctor {
 public:
  //! What is known of the failure of the capture that began on `origin` (open, or ended moments
  //! ago), whose innermost open body was sequence `body` (0: none), noticed by a call from `where`.
  static capture_error::Facts examine(cudaStream_t origin, CaptureSeq body, bool ended_behind_our_back,
                                      const tensorplay::source_location& where);

  //! What is known when cudaStreamBeginCapture refused to begin: the driver's words and the
  //! captures open at the time (with their mode and file:line).
  static capture_error::Facts examine_refused_begin();

 private:
  template <class Pred>
  static const CaptureRecord* find(const std::vector<CaptureRecord>& records, Pred pred) {
    const CaptureRecord* found = nullptr;
    for (const CaptureRecord& r : records) {
      if (!pred(r)) continue;
      if (r.closed == CaptureRecord::still_open) return &r;  // the open one, if any
      found = &r;                                          // else the one that ended last
    }
    return found;
  }

  // A record that says a call broke a capture: its status (log: parsed), 0 when it does not.
  static int breaking_status(const Evidence& e);

  // Failures of a capture's own begin or end (a fork not joined, the wrong stream) break no other
  // capture; an end from a thread that may not end it does (cudaErrorStreamCaptureWrongThread).
  static bool own_end_or_begin(std::string_view function, int status);

  // The first breaking record on the capturing thread, else the first on another thread that
  // can break it. For a capture tensorplay does not know, the latest.
  static const Evidence* choose_culprit(const std::vector<Evidence>& seen, const CaptureRecord* capture);

  // The runtime call's name: CUPTI's runtime record of the same call when there is one (it
  // follows the driver's log lines on the same thread), else the driver function's runtime name.
  static std::string name_of(const Evidence& culprit, const std::vector<Evidence>& seen);

  // The log lines of one failing call: the sentences just before its "Returning ..." line on
  // the same thread, then that line.
  static std::string message_of(const Evidence& returning, const std::vector<Evidence>& seen);

  // "Capture was invalidated by a prior API call": what every later call on a broken capture logs.
  static bool is_aftermath(std::string_view text);

  // What the driver said about the capture's own end, when no call broke it (a fork not joined,
  // a stream that is not capturing any more): the last end's lines on the capturing thread.
  static std::string last_end_message(const std::vector<Evidence>& seen, const CaptureRecord* capture);

  // CUPTI's record of a cudaStreamEndCapture on `origin` that succeeded: the capture's end by
  // someone else (tensorplay's own end of a live capture never gets here).
  static const Evidence* foreign_end(const std::vector<Evidence>& seen, cudaStream_t origin);

  static std::string mode_name(cudaStreamCaptureMode mode);

  static std::string location(const tensorplay::source_location& where);

  // "the thread-local capture begun at a.cu:12" (or "a tensorplay capture" without a location).
  static std::string describe(const CaptureRecord& r);

  // Where the capture and its innermost body began (left out where that is the caller's line,
  // which ends the message anyway), and the other capture that took part.
  static std::string context_of(const CaptureRecord* capture, const CaptureRecord* inner, const Evidence* culprit,
                                const std::vector<CaptureRecord>& records, const tensorplay::source_location& caller);

  // Whether the log lines before the culprit say the conflict was with another thread's capture.
  static bool mentions_other_thread(const Evidence& culprit);
};

//! Throws capture_error when `status` says the capture is broken (or, with `ended_behind_our_back`,
//! that the stream had stopped capturing before tensorplay ended it), else cuda_error. `origin` is
//! the capture's origin stream, `body` the sequence of its innermost open body (0: none). Callable
//! before or after the capture is unregistered (the registry keeps the last ended ones).
[[noreturn]] TENSORPLAY_DECL void throw_capture_failure(cudaError_t status, const char* call, cudaStream_t origin, CaptureSeq body,
                                               const tensorplay::source_location& where, bool ended_behind_our_back = false);

//! The end of a capture or body failed with `status`: capture_error when the capture was broken,
//! or when the stream was no longer capturing (ended by other code: cudaErrorIllegalState).
[[noreturn]] TENSORPLAY_DECL void throw_end_failure(cudaError_t status, const char* call, cudaStream_t origin, CaptureSeq body,
                                           const tensorplay::source_location& where);

//! Throws for the capture running on `stream` (a tensorplay capture or body, or anyone's capture),
//! which was found broken.
[[noreturn]] TENSORPLAY_DECL void throw_capture_failure_on(cudaError_t status, const char* call, cudaStream_t stream,
                                                  const tensorplay::source_location& where);

//! cudaStreamBeginCapture refused with `status`: capture_error naming the captures open, when
//! the status is a capture error; else cuda_error.
[[noreturn]] TENSORPLAY_DECL void throw_begin_failure(cudaError_t status, const char* call, const tensorplay::source_location& where);

}  // namespace tensorplay::detail

// ---- definitions: inline, or compiled once in src/library.cpp (config.hpp) ------------------

#if TENSORPLAY_DEFINE_BODIES
#include <tensorplay/detail/capture_doctor_cupti.hpp>
#include <tensorplay/detail/capture_doctor_evidence.hpp>
#include <tensorplay/detail/capture_doctor_log.hpp>
#include <tensorplay/detail/capture_doctor_names.hpp>
#include <tensorplay/detail/cuda_api.hpp>

namespace tensorplay::detail {

TENSORPLAY_DECL capture_error::Facts CaptureDoctor::examine(cudaStream_t origin, CaptureSeq body, bool ended_behind_our_back,
    const tensorplay::source_location& where) {
  const std::vector<CaptureRecord> records = CaptureRegistry::instance().records();
  const CaptureRecord* capture = find(records, [&](const CaptureRecord& r) { return !r.body && r.origin == origin; });
  const CaptureRecord* inner =
      body == 0 ? nullptr : find(records, [&](const CaptureRecord& r) { return r.body && r.seq == body; });
  const std::uint64_t from = capture != nullptr ? capture->opened : 0;
  const std::vector<Evidence> seen = CaptureEvidence::instance().between(from, UINT64_MAX);

  capture_error::Facts facts;
  const Evidence* culprit = choose_culprit(seen, capture);
  if (culprit != nullptr) {
    facts.culprit = name_of(*culprit, seen);
    facts.from_other_thread = capture != nullptr && culprit->thread != capture->thread;
    if (culprit->source == EvidenceSource::DriverLog) facts.driver_message = message_of(*culprit, seen);
  } else if (const Evidence* end = foreign_end(seen, origin); end != nullptr) {
    facts.culprit = "cudaStreamEndCapture";  // CUPTI saw who ended it
    facts.from_other_thread = capture != nullptr && end->thread != capture->thread;
  } else if (ended_behind_our_back) {
    facts.culprit = "cudaStreamEndCapture";  // the stream stopped capturing before tensorplay ended it
  }
  if (facts.driver_message.empty()) facts.driver_message = last_end_message(seen, capture);

  facts.context = context_of(capture, inner, culprit, records, where);
  if (culprit != nullptr && breaking_status(*culprit) == cudaErrorStreamCaptureImplicit) {
    std::string advice =
        "the call went to the legacy default stream (stream 0: a kernel<<<grid, block>>> or an async call without a "
        "stream), which cannot be captured and may not wait for a capture; issue it on the stream passed to the body "
        "or on tensorplay::current_stream()";
    facts.context = facts.context.empty() ? advice : advice + "; " + facts.context;
  }
  return facts;
}

TENSORPLAY_DECL capture_error::Facts CaptureDoctor::examine_refused_begin() {
  capture_error::Facts facts;
  facts.culprit = "cudaStreamBeginCapture";
  const std::uint64_t now = CaptureEvidence::instance().mark();
  const std::vector<Evidence> seen = CaptureEvidence::instance().between(now > 8 ? now - 8 : 0, now);
  for (std::size_t k = seen.size(); k-- > 0;) {  // newest first
    const Evidence* it = &seen[k];
    if (it->thread != this_thread_id() || it->source != EvidenceSource::DriverLog) continue;
    if (parse_driver_return(it->text).code == 0) continue;
    facts.driver_message = message_of(*it, seen);
    break;
  }
  const std::vector<CaptureRecord> records = CaptureRegistry::instance().records();
  std::string others;
  for (const CaptureRecord& r : records) {
    if (r.body || r.closed != CaptureRecord::still_open) continue;
    if (!others.empty()) others += ", ";
    others += describe(r);
  }
  if (!others.empty()) facts.context = "captures open: " + others;
  return facts;
}

TENSORPLAY_DECL int CaptureDoctor::breaking_status(const Evidence& e) {
  if (e.source == EvidenceSource::DriverLog) {
    const DriverReturn r = parse_driver_return(e.text);
    if (!breaks_capture(r.code)) return 0;
    return own_end_or_begin(without_abi_suffix(r.function), r.code) ? 0 : r.code;
  }
  if (!breaks_capture(e.status)) return 0;
  return own_end_or_begin(without_abi_suffix(e.text), e.status) ? 0 : e.status;
}

TENSORPLAY_DECL bool CaptureDoctor::own_end_or_begin(std::string_view function, int status) {
  if (function.ends_with("StreamBeginCapture")) return true;
  return function.ends_with("StreamEndCapture") && status != cudaErrorStreamCaptureWrongThread;
}

TENSORPLAY_DECL const Evidence* CaptureDoctor::choose_culprit(const std::vector<Evidence>& seen, const CaptureRecord* capture) {
  // Driver-log records first (they carry the driver's message); CUPTI's where the log is silent.
  for (const bool log : {true, false}) {
    const Evidence* other_thread = nullptr;
    const Evidence* latest = nullptr;
    for (const Evidence& e : seen) {
      if ((e.source == EvidenceSource::DriverLog) != log) continue;
      const int status = breaking_status(e);
      if (status == 0) continue;
      latest = &e;
      if (capture == nullptr) continue;
      if (e.thread == capture->thread) return &e;
      // An unsafe call on another thread breaks only global captures; work on the legacy
      // stream and a captured event break the capture they touch, whatever its mode.
      const bool reaches = capture->mode == cudaStreamCaptureModeGlobal || status != cudaErrorStreamCaptureUnsupported;
      if (reaches && other_thread == nullptr) other_thread = &e;
    }
    if (capture == nullptr && latest != nullptr) return latest;
    if (other_thread != nullptr) return other_thread;
  }
  return nullptr;
}

TENSORPLAY_DECL std::string CaptureDoctor::name_of(const Evidence& culprit, const std::vector<Evidence>& seen) {
  if (culprit.source == EvidenceSource::RuntimeApi) return std::string(without_abi_suffix(culprit.text));
  const int status = culprit.source == EvidenceSource::DriverLog ? parse_driver_return(culprit.text).code : culprit.status;
  for (const Evidence& e : seen) {
    if (e.index <= culprit.index || e.index > culprit.index + 8) continue;
    if (e.source == EvidenceSource::RuntimeApi && e.thread == culprit.thread && e.status == status)
      return std::string(without_abi_suffix(e.text));
  }
  const std::string_view function =
      culprit.source == EvidenceSource::DriverLog ? parse_driver_return(culprit.text).function : std::string_view(culprit.text);
  return runtime_name_of(function);
}

TENSORPLAY_DECL std::string CaptureDoctor::message_of(const Evidence& returning, const std::vector<Evidence>& seen) {
  std::vector<const Evidence*> before;
  for (std::size_t k = seen.size(); k-- > 0;) {  // newest first
    const Evidence* it = &seen[k];
    if (it->index >= returning.index || it->thread != returning.thread || it->source != EvidenceSource::DriverLog) continue;
    if (returning.index - it->index > 4 || before.size() == 2) break;
    if (parse_driver_return(it->text).code != 0 || is_aftermath(it->text)) break;
    before.push_back(it);
  }
  std::string text;
  for (std::size_t k = before.size(); k-- > 0;) text += before[k]->text + "; ";
  return text + returning.text;
}

TENSORPLAY_DECL bool CaptureDoctor::is_aftermath(std::string_view text) { return text.find("invalidated by a prior") != std::string_view::npos; }

TENSORPLAY_DECL std::string CaptureDoctor::last_end_message(const std::vector<Evidence>& seen, const CaptureRecord* capture) {
  for (std::size_t k = seen.size(); k-- > 0;) {  // newest first
    const Evidence* it = &seen[k];
    if (it->source != EvidenceSource::DriverLog || (capture != nullptr && it->thread != capture->thread)) continue;
    const DriverReturn r = parse_driver_return(it->text);
    if (r.code == 0 || r.code == cudaErrorStreamCaptureInvalidated) continue;
    if (without_abi_suffix(r.function) != "cuStreamEndCapture") continue;
    return message_of(*it, seen);
  }
  return {};
}

TENSORPLAY_DECL const Evidence* CaptureDoctor::foreign_end(const std::vector<Evidence>& seen, cudaStream_t origin) {
  for (const Evidence& e : seen)
    if (e.source == EvidenceSource::RuntimeApi && e.status == 0 && e.stream == origin) return &e;
  for (const Evidence& e : seen)
    if (e.source == EvidenceSource::DriverApi && e.status == 0 && e.stream == origin) return &e;
  return nullptr;
}

TENSORPLAY_DECL std::string CaptureDoctor::mode_name(cudaStreamCaptureMode mode) {
  switch (mode) {
    case cudaStreamCaptureModeThreadLocal: return "thread-local";
    case cudaStreamCaptureModeRelaxed: return "relaxed";
    default: return "global";
  }
}

TENSORPLAY_DECL std::string CaptureDoctor::location(const tensorplay::source_location& where) {
  if (where.line() == 0) return {};
  return std::string(where.file_name()) + ":" + std::to_string(where.line());
}

TENSORPLAY_DECL std::string CaptureDoctor::describe(const CaptureRecord& r) {
  const std::string at = location(r.where);
  return "the " + mode_name(r.mode) + " capture " + (at.empty() ? "of tensorplay" : "begun at " + at);
}

TENSORPLAY_DECL std::string CaptureDoctor::context_of(const CaptureRecord* capture, const CaptureRecord* inner, const Evidence* culprit,
    const std::vector<CaptureRecord>& records, const tensorplay::source_location& caller) {
  std::string text;
  auto add = [&](const std::string& part) {
    if (part.empty()) return;
    if (!text.empty()) text += "; ";
    text += part;
  };
  const std::string called_at = location(caller);
  if (capture != nullptr) {
    const std::string at = location(capture->where);
    add(at.empty() || at == called_at ? std::string() : "capture begun at " + at);
  }
  if (inner != nullptr) {
    const std::string at = location(inner->where);
    add("innermost open body " + (at.empty() || at == called_at ? std::string() : "at " + at + " ") + "(depth " +
        std::to_string(inner->depth) + ")");
  }
  if (culprit == nullptr || capture == nullptr) return text;
  auto open_at = [&](const CaptureRecord& r) { return r.opened <= culprit->index && culprit->index < r.closed; };
  if (culprit->thread != capture->thread) {
    // The call came from a thread that had a capture of its own open: name it.
    for (const CaptureRecord& r : records)
      if (!r.body && r.thread == culprit->thread && open_at(r)) {
        add("the calling thread was capturing: " + describe(r));
        break;
      }
  } else if (culprit->source == EvidenceSource::DriverLog && mentions_other_thread(*culprit)) {
    // Refused on this thread because another thread's global capture was open: name it.
    std::string found;
    for (const CaptureRecord& r : records)
      if (!r.body && r.thread != capture->thread && r.mode == cudaStreamCaptureModeGlobal && open_at(r)) {
        found = describe(r) + " on another thread";
        break;
      }
    add(found.empty() ? "another thread's global capture, not one of tensorplay's, was open"
                      : "it conflicted with " + found);
  }
  return text;
}

TENSORPLAY_DECL bool CaptureDoctor::mentions_other_thread(const Evidence& culprit) {
  const std::vector<Evidence> seen =
      CaptureEvidence::instance().between(culprit.index >= 4 ? culprit.index - 4 : 0, culprit.index);
  for (const Evidence& e : seen)
    if (e.thread == culprit.thread && e.text.find("initiated from another thread") != std::string::npos) return true;
  return false;
}

TENSORPLAY_DECL void throw_capture_failure(cudaError_t status, const char* call, cudaStream_t origin, CaptureSeq body,
    const tensorplay::source_location& where, bool ended_behind_our_back) {
  (void)cudaGetLastError();
  if (!is_capture_failure(status) && !ended_behind_our_back) throw cuda_error(status, call, where);
  throw capture_error(status, call, where, CaptureDoctor::examine(origin, body, ended_behind_our_back, where));
}

TENSORPLAY_DECL void throw_end_failure(cudaError_t status, const char* call, cudaStream_t origin, CaptureSeq body,
    const tensorplay::source_location& where) {
  throw_capture_failure(status, call, origin, body, where, status == cudaErrorIllegalState);
}

TENSORPLAY_DECL void throw_capture_failure_on(cudaError_t status, const char* call, cudaStream_t stream,
    const tensorplay::source_location& where) {
  CaptureSeq seq = capture_seq_or_zero(stream);
  cudaStream_t origin = stream;
  CaptureSeq body = 0;
  if (seq != 0) {
    for (const CaptureRecord& r : CaptureRegistry::instance().records()) {
      if (r.seq != seq || r.closed != CaptureRecord::still_open) continue;
      origin = r.origin;
      if (r.body) body = seq;
      break;
    }
  }
  throw_capture_failure(status, call, origin, body, where);
}

TENSORPLAY_DECL void throw_begin_failure(cudaError_t status, const char* call, const tensorplay::source_location& where) {
  (void)cudaGetLastError();
  if (!is_capture_failure(status)) throw cuda_error(status, call, where);
  throw capture_error(status, call, where, CaptureDoctor::examine_refused_begin());
}

}  // namespace tensorplay::detail
#endif  // TENSORPLAY_DEFINE_BODIES
