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
#define BOOST_TEST_MODULE tensorplay
#define BOOST_TEST_NO_MAIN
#include <boost/test/included/unit_test.hpp>

#include <cstdlib>
#include <string>
#include <sys/stat.h>
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

}  // namespace

int main(int argc, char* argv[]) {
    std::vector<std::string> extra;
    // An explicit --logger / -f / --log_format on the command line wins.
    bool user_logger = false, user_report = false, user_color = false;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        if (a.rfind("--logger", 0) == 0 || a.rfind("--log_format", 0) == 0 ||
            a.rfind("--log_sink", 0) == 0 || a.rfind("--log_level", 0) == 0 || a == "-f" ||
            a == "-k" || a == "-l")
            user_logger = true;
        if (a.rfind("--report_level", 0) == 0 || a == "-r") user_report = true;
        if (a.rfind("--color_output", 0) == 0 || a == "-x") user_color = true;
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
    if (std::string only = env("TESTBRIDGE_TEST_ONLY"); !only.empty())
        extra.push_back("--run_test=" + only);

    std::vector<char*> args(argv, argv + argc);
    for (auto& e : extra) args.push_back(e.data());
    args.push_back(nullptr);
    return boost::unit_test::unit_test_main(&init_unit_test_suite, static_cast<int>(args.size() - 1),
                                            args.data());
}
