// test/compile_outcomes.hpp: reading the logs of a cuda_compile_outcomes target
// (tools/bazel/cuda.bzl) from a compile-fail test: one log per case, first line exit=<code>.
#pragma once

#include <boost/test/unit_test.hpp>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace tp_test {

struct CompileOutcome {
  int exit_code = -1;
  std::string output;  // nvcc's stdout and stderr
};

inline CompileOutcome compile_outcome(const std::string& name) {
  const char* dir = std::getenv("TENSORPLAY_COMPILE_OUTCOMES_DIR");
  BOOST_REQUIRE_MESSAGE(dir != nullptr, "TENSORPLAY_COMPILE_OUTCOMES_DIR is not set");
  std::ifstream in(std::string(dir) + "/" + name + ".log");
  BOOST_REQUIRE_MESSAGE(in.good(), "no outcome log for case " << name);
  std::string first;
  std::getline(in, first);
  BOOST_REQUIRE(first.rfind("exit=", 0) == 0);
  std::stringstream rest;
  rest << in.rdbuf();
  return {std::stoi(first.substr(5)), rest.str()};
}

//! The case compiled (the "none" case of a file: the file itself is valid).
inline void expect_compiles(const std::string& name) {
  const CompileOutcome o = compile_outcome(name);
  BOOST_TEST(o.exit_code == 0, o.output.substr(0, 2000));
}

//! The case failed to compile, and nvcc's output says `message`.
inline void expect_failure_saying(const std::string& name, const std::string& message) {
  const CompileOutcome o = compile_outcome(name);
  BOOST_TEST(o.exit_code != 0, "case " << name << " compiled");
  BOOST_TEST(o.output.find(message) != std::string::npos, "case " << name << " output:\n" << o.output.substr(0, 2000));
}

}  // namespace tp_test
