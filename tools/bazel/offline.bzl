"""Local stand-ins for the repositories Bazel 4.2.3 would otherwise download.

Bazel's implicit WORKSPACE suffix declares `rules_cc`, `rules_java` and
`remote_coverage_tools` with `maybe(http_archive, ...)`. A repository of the same
name declared earlier in our WORKSPACE wins, so these stand-ins remove every
download:

  * rules_cc: `cc/defs.bzl` forwards to the native C++ rules (loaded by the
    auto-configured C++ toolchain in @local_config_cc and by @bazel_tools).
  * rules_java: `java/defs.bzl` forwards to the native Java rules (read by
    @bazel_tools//tools/jdk during toolchain resolution).
  * remote_coverage_tools: two empty filegroups, the implicit coverage
    dependencies of every test. `bazel coverage` does not work; nothing else is
    lost.
"""

load(":cuda_toolkit.bzl", "cuda_toolkit_repository")

def _stub_repository_impl(repository_ctx):
    for path, content in repository_ctx.attr.files.items():
        repository_ctx.file(path, content, executable = False)

_stub_repository = repository_rule(
    implementation = _stub_repository_impl,
    attrs = {"files": attr.string_dict(mandatory = True)},
    local = True,
)

def _forwarders(names):
    # One `name = native.name` binding per native rule.
    return "\n".join(["%s = native.%s" % (n, n) for n in names]) + "\n"

_RULES_CC_DEFS = _forwarders([
    "cc_binary",
    "cc_import",
    "cc_library",
    "cc_proto_library",
    "cc_test",
    "cc_toolchain",
    "cc_toolchain_suite",
    "fdo_prefetch_hints",
    "fdo_profile",
    "objc_import",
    "objc_library",
])

_RULES_JAVA_DEFS = _forwarders([
    "java_binary",
    "java_import",
    "java_library",
    "java_lite_proto_library",
    "java_package_configuration",
    "java_plugin",
    "java_proto_library",
    "java_runtime",
    "java_test",
    "java_toolchain",
])

def tensorplay_offline_stubs():
    """Declares the stand-in repositories. Call first thing in WORKSPACE.

    A repository that the WORKSPACE already declared (e.g. a real rules_cc) is
    left alone.
    """
    if not native.existing_rule("rules_cc"):
        _stub_rules_cc()
    if not native.existing_rule("rules_java"):
        _stub_rules_java()
    if not native.existing_rule("remote_coverage_tools"):
        _stub_coverage_tools()

def tensorplay_repositories(cuda_path = "/usr/local/cuda"):
    """For another workspace using @tensorplay: stand-ins plus @cuda.

        local_repository(name = "tensorplay", path = "/path/to/tensorplay")
        load("@tensorplay//tools/bazel:offline.bzl", "tensorplay_repositories")
        tensorplay_repositories()
    """
    tensorplay_offline_stubs()
    if not native.existing_rule("cuda"):
        cuda_toolkit_repository(name = "cuda", path = cuda_path)

def _stub_rules_cc():
    _stub_repository(
        name = "rules_cc",
        files = {
            "WORKSPACE": 'workspace(name = "rules_cc")\n',
            "BUILD.bazel": "",
            "cc/BUILD.bazel": "\n".join([
                'package(default_visibility = ["//visibility:public"])',
                'alias(name = "toolchain_type", actual = "@bazel_tools//tools/cpp:toolchain_type")',
                "",
            ]),
            "cc/defs.bzl": _RULES_CC_DEFS,
        },
    )

def _stub_rules_java():
    _stub_repository(
        name = "rules_java",
        files = {
            "WORKSPACE": 'workspace(name = "rules_java")\n',
            "BUILD.bazel": "",
            "java/BUILD.bazel": "",
            "java/defs.bzl": _RULES_JAVA_DEFS,
        },
    )

def _stub_coverage_tools():
    _stub_repository(
        name = "remote_coverage_tools",
        files = {
            "WORKSPACE": 'workspace(name = "remote_coverage_tools")\n',
            "BUILD.bazel": "\n".join([
                'package(default_visibility = ["//visibility:public"])',
                'filegroup(name = "coverage_report_generator", srcs = [])',
                'filegroup(name = "lcov_merger", srcs = [])',
                "",
            ]),
        },
    )
