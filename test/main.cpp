// Boost.Test main for every tensorplay test binary (//test:boost_main).
//
// Compiled ONCE by g++: the header-only "included" variant of Boost.Test is slow to
// compile (~15 s through nvcc), so test .cu files include <boost/test/unit_test.hpp>
// only and link this object. The resulting binaries need no Boost library.
//
// Besides the usual human-readable output on stdout, a JUnit XML report is written
//   * to $XML_OUTPUT_FILE when it is set (Bazel sets it for `bazel test`; Bazel then
//     keeps the file as bazel-testlogs/<pkg>/<test>/test.xml), else
//   * to $TENSORPLAY_JUNIT_DIR/<binary name>.xml when that variable is set (the GPU
//     machine, no Bazel: see tools/gpu/run).
// Skipped cases (e.g. a precondition saying there is no GPU) appear as <skipped/>.
// Bazel's --test_filter (TESTBRIDGE_TEST_ONLY) is mapped to --run_test.
// With TENSORPLAY_CRASH_STACK set (tools/gpu/run sets it for the sanitizer runs; Boost's
// --catch_system_errors=no comes with it), a crash (SIGSEGV, SIGBUS, SIGILL, SIGFPE) prints the
// faulting thread, the fault address and the stack as module+offset lines, then ends the process
// with the signal: Boost's own handler names only the last checkpoint, and its longjmp out of a
// fault inside the driver or a tool can leave the process hanging at exit. tools/probes/symbolize
// turns the lines into functions and source lines with the unstripped binaries of .gpu/bin.
#define BOOST_TEST_MODULE tensorplay
#define BOOST_TEST_NO_MAIN
#include <boost/test/included/unit_test.hpp>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <execinfo.h>
#include <string>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <vector>

namespace {

std::string env(const char* name) {
    const char* v = std::getenv(name);
    return v ? std::string(v) : std::string();
}

std::string junit_path(const char* argv0) {
    if (std::string f = env("XML_OUTPUT_FILE"); !f.empty()) return f;
    std::string dir = env("TENSORPLAY_JUNIT_DIR");
    if (dir.empty()) return {};
    ::mkdir(dir.c_str(), 0777);  // one level; the caller creates parents
    std::string base = argv0;
    if (auto slash = base.rfind('/'); slash != std::string::npos) base.erase(0, slash + 1);
    return dir + "/" + base + ".xml";
}

// ---- crash stacks (TENSORPLAY_CRASH_STACK) ----------------------------------------------------
// Only async-signal-safe calls in the handler, backtrace() aside (loaded once before any crash).

void write_text(const char* text) {
    for (std::size_t left = std::strlen(text); left > 0;) {
        const ssize_t n = ::write(2, text, left);
        if (n <= 0) return;
        text += n;
        left -= static_cast<std::size_t>(n);
    }
}

void write_number(unsigned long long value, int base) {
    char digits[32];
    int i = 31;
    digits[i] = '\0';
    do {
        digits[--i] = "0123456789abcdef"[value % static_cast<unsigned>(base)];
        value /= static_cast<unsigned>(base);
    } while (value != 0 && i > 0);
    if (base == 16) write_text("0x");
    write_text(digits + i);
}

void crash_handler(int sig, siginfo_t* info, void*) {
    write_text("\ntensorplay test: signal ");
    write_number(static_cast<unsigned>(sig), 10);
    write_text(" (");
    write_text(sig == SIGSEGV ? "SIGSEGV" : sig == SIGBUS ? "SIGBUS" : sig == SIGILL ? "SIGILL" : "SIGFPE");
    write_text(") at address ");
    write_number(reinterpret_cast<unsigned long long>(info->si_addr), 16);
    const long thread = ::syscall(SYS_gettid);
    write_text(" on thread ");
    write_number(static_cast<unsigned long long>(thread), 10);
    write_text(thread == ::getpid() ? " (the main thread)" : " (not the main thread)");
    write_text("; stack, innermost first (tools/probes/symbolize reads it):\n");
    void* frames[64];
    const int n = ::backtrace(frames, 64);
    ::backtrace_symbols_fd(frames, n, 2);
    write_text("tensorplay test: end of stack\n");
    std::signal(sig, SIG_DFL);
    std::raise(sig);
}

void install_crash_stacks() {
    static char alternate_stack[64 * 1024];  // main thread only (per-thread): its overflow still prints
    stack_t ss{};
    ss.ss_sp = alternate_stack;
    ss.ss_size = sizeof alternate_stack;
    ::sigaltstack(&ss, nullptr);
    void* warm[1];
    ::backtrace(warm, 1);  // loads libgcc's unwinder now, not inside the handler
    struct sigaction sa{};
    sa.sa_sigaction = crash_handler;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE}) ::sigaction(sig, &sa, nullptr);
}

}  // namespace

int main(int argc, char* argv[]) {
    const bool crash_stacks = !env("TENSORPLAY_CRASH_STACK").empty();
    if (crash_stacks) install_crash_stacks();
    std::vector<std::string> extra;
    // An explicit --logger / -f / --log_format on the command line wins.
    bool user_logger = false, user_report = false, user_color = false, user_catch = false;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        if (a.rfind("--logger", 0) == 0 || a.rfind("--log_format", 0) == 0 ||
            a.rfind("--log_sink", 0) == 0 || a.rfind("--log_level", 0) == 0 || a == "-f" ||
            a == "-k" || a == "-l")
            user_logger = true;
        if (a.rfind("--report_level", 0) == 0 || a == "-r") user_report = true;
        if (a.rfind("--color_output", 0) == 0 || a == "-x") user_color = true;
        if (a.rfind("--catch_system_errors", 0) == 0 || a == "-s") user_catch = true;
    }
    // The short report names the passed / failed / skipped counts.
    if (!user_report && env("BOOST_TEST_REPORT_LEVEL").empty()) extra.push_back("--report_level=short");
    // No ANSI colours in log files (Bazel's test.log, the GPU suite's logs).
    if (!user_color && env("BOOST_TEST_COLOR_OUTPUT").empty() && !::isatty(1))
        extra.push_back("--color_output=no");
    if (std::string xml = junit_path(argv[0]); !xml.empty() && !user_logger) {
        // Boost 1.74 syntax: format,level,sink for each logger, ':'-separated.
        extra.push_back("--logger=HRF,warning,stdout:JUNIT,warning," + xml);
    }
    // Boost's handler would replace the crash handler during every test case.
    if (crash_stacks && !user_catch && env("BOOST_TEST_CATCH_SYSTEM_ERRORS").empty())
        extra.push_back("--catch_system_errors=no");
    if (std::string only = env("TESTBRIDGE_TEST_ONLY"); !only.empty())
        extra.push_back("--run_test=" + only);

    std::vector<char*> args(argv, argv + argc);
    for (auto& e : extra) args.push_back(e.data());
    args.push_back(nullptr);
    return boost::unit_test::unit_test_main(&init_unit_test_suite, static_cast<int>(args.size() - 1),
                                            args.data());
}
