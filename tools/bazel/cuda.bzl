"""CUDA rules for tensorplay (Bazel 4.2.3, offline, nvcc from the local toolkit).

Bazel 4 has no CUDA support, so `.cu` files are compiled by a small rule that runs
nvcc once per file and hands the `.o` files to the native cc rules (cc_binary and
cc_test accept objects in `srcs`). No relocatable device code: each `.cu` is a
self-contained translation unit, so no device-link step is needed.

nvcc is `${CUDA_PATH:-/usr/local/cuda}/bin/nvcc` (.bazelrc passes CUDA_PATH through
with --action_env). It runs with the default shell environment so that it finds
g++ on PATH. Every compile uses

    -c -std=c++20 --extended-lambda -lineinfo -O2 -Xcompiler -fPIC <GPU targets>

then `-Xcompiler <flag>` for each host-compiler flag of the build setting
//tools/bazel:nvcc_host_copts (empty by default; `--config=sanitize` in .bazelrc sets
it), then the include paths (-I / -isystem) and defines of the deps' CcInfo, then
`defines`, then `copts`. The CUDA include tree is not declared as inputs (nvcc adds
it itself).

GPU targets come from the build setting //tools/bazel:cuda_archs, a comma list
(default sm_90):

    bazel build --//tools/bazel:cuda_archs=sm_80,sm_90 //...
    build --//tools/bazel:cuda_archs=sm_80,sm_90                # the same in .bazelrc
    build --@tensorplay//tools/bazel:cuda_archs=sm_80,sm_90     # from another workspace

Each sm_XX becomes `-gencode arch=compute_XX,code=sm_XX` (machine code), and the
highest one also `-gencode arch=compute_XX,code=compute_XX` (PTX, which newer GPUs
compile when they load the program; of sm_90 and sm_90a, the PTX of sm_90). A target
whose `copts` choose GPU targets themselves (-arch, -gencode, -code or their long
forms) gets none of these.

Public macros / rules (load("//tools/bazel:cuda.bzl", ...)):

  cuda_objects(name, srcs, hdrs = [], deps = [], copts = [], defines = [])
      Rule: one nvcc action per .cu, outputs <name>/<file>.o. Example:
          cuda_objects(name = "kernels", srcs = ["a.cu", "b.cu"], deps = ["//:tensorplay"])

  cuda_library(name, srcs = [], hdrs = [], deps = [], copts = [], defines = [], **kwargs)
      cuda_objects + cc_library (objects as srcs, hdrs exported). Example:
          cuda_library(name = "helpers", srcs = ["helpers.cu"], hdrs = ["helpers.hpp"],
                       deps = ["//:tensorplay"])

  cuda_binary(name, srcs, deps = [], hdrs = [], copts = [], defines = [], linkopts = [], **kwargs)
      cuda_objects + cc_binary. Example (a benchmark):
          cuda_binary(name = "launch_bench", srcs = ["launch_bench.cu"],
                      deps = ["//:tensorplay", "//tools/bazel:benchmark_main"])

  cuda_test(name, srcs, deps = [], hdrs = [], copts = [], defines = [], linkopts = [],
            compile_outcomes = None, env = {}, data = [], **kwargs)
      cuda_objects + cc_test (linkstatic) linked with //test:boost_main (Boost.Test's
      main, JUnit XML for Bazel). Test .cu files include <boost/test/unit_test.hpp>
      only. Example:
          cuda_test(name = "graph_test", srcs = ["graph_test.cu"], deps = ["//:tensorplay"])

  header_check_test(name, hdrs, deps = [], copts = [], strip_include_prefix = "")
      Test rule: for each header, generates <name>_src/<include path>.cu containing
      `#include <include path>` (twice: the second include checks the include
      guard / #pragma once) and compiles it with nvcc. The build (and therefore
      `bazel test //...`) fails if one header does not compile on its own; the test
      binary itself only reports success and writes a JUnit file with 0 cases, so it
      adds nothing to the case counts. Example (root BUILD.bazel):
          header_check_test(name = "header_check",
                            hdrs = glob(["tensorplay/**/*.hpp"]), deps = [":tensorplay"])

  cuda_compile_outcomes(name, src, cases, deps = [], copts = [], defines = [])
      Rule for compile-fail tests. For each case C it runs
          nvcc <flags> -DTENSORPLAY_COMPILE_CASE_C=1 -c <src> -o /dev/null
      and never fails: it writes <name>/C.log whose first line is `exit=<nvcc exit
      code>`, followed by nvcc's complete output (stdout + stderr). Add a case such
      as "none" to check that `src` compiles when no case is enabled.

How a test reads the compile-outcome logs
-----------------------------------------
Pass the rule to cuda_test's `compile_outcomes`; the macro adds it to `data` and sets

    TENSORPLAY_COMPILE_OUTCOMES_DIR=<package>/<name>     (e.g. test/static_checks_outcomes)

in the test's environment. Bazel runs tests from the runfiles root, so the relative
path works; the test opens "$TENSORPLAY_COMPILE_OUTCOMES_DIR/<case>.log". On the GPU
machine (no Bazel) tools/gpu/build copies the logs to .gpu/data/<package>/<name>/ and
tools/gpu/run sets the same variable to that folder for the tests that need it.

    # test/BUILD.bazel
    cuda_compile_outcomes(
        name = "static_checks_outcomes",
        src = "static_checks.cu",          # #if TENSORPLAY_COMPILE_CASE_bad_arity ... #endif
        cases = ["none", "bad_arity", "non_trivial_arg"],
        deps = ["//:tensorplay"],
    )
    cuda_test(
        name = "static_checks_test",
        srcs = ["static_checks_test.cu"],
        compile_outcomes = ":static_checks_outcomes",
    )

    // static_checks_test.cu
    static std::string outcome(const std::string& c) {
        const char* dir = std::getenv("TENSORPLAY_COMPILE_OUTCOMES_DIR");
        BOOST_TEST_REQUIRE(dir != nullptr);
        std::ifstream in(std::string(dir) + "/" + c + ".log");
        BOOST_TEST_REQUIRE(in.good());
        return std::string(std::istreambuf_iterator<char>(in), {});
    }
    BOOST_AUTO_TEST_CASE(bad_arity) {
        auto log = outcome("bad_arity");
        BOOST_TEST(log.rfind("exit=0\n", 0) != 0);          // nvcc failed
        BOOST_TEST(log.find("expected static_assert text") != std::string::npos);
    }
"""

_NVCC_FLAGS = [
    "-c",
    "-std=c++20",
    "--extended-lambda",
    "-lineinfo",
    "-O2",
    "-Xcompiler",
    "-fPIC",
]

HostCoptsInfo = provider(
    doc = "Host-compiler flags that every nvcc compile passes on with -Xcompiler.",
    fields = {"flags": "list of strings, one flag each"},
)

def _host_copts_impl(ctx):
    return [HostCoptsInfo(flags = [f for f in ctx.build_setting_value if f])]

# A comma-separated list on the command line (so a flag must not contain a comma: write
# -fsanitize=address,-fsanitize=undefined, not -fsanitize=address,undefined). Each flag
# goes to nvcc as `-Xcompiler <flag>` (nvcc would split a comma inside one flag too).
host_copts_setting = rule(
    implementation = _host_copts_impl,
    build_setting = config.string_list(flag = True),
    doc = "Build setting: extra host-compiler flags for every nvcc compile.",
)

# $1.. are the arguments; Bazel passes an empty $0 for run_shell with arguments.
# nvcc names its temporary files after its process id. In Bazel's linux-sandbox every action
# runs as pid 2 of its own pid namespace while /tmp is shared, so two nvcc actions at once
# collided ("cannot open source file /tmp/tmpxft_00000002_..."): each gets its own TMPDIR.
_NVCC = 'TMPDIR="$(mktemp -d "${TMPDIR:-/tmp}/nvcc.XXXXXXXX")" && trap \'rm -rf "$TMPDIR"\' EXIT && export TMPDIR && "${CUDA_PATH:-/usr/local/cuda}/bin/nvcc"'

# ---------------------------------------------------------------------------
# GPU targets: the build setting //tools/bazel:cuda_archs

CudaArchsInfo = provider(
    doc = "The GPU targets of the nvcc compiles, from //tools/bazel:cuda_archs.",
    fields = {"gencode": "nvcc flags: -gencode arch=compute_XX,code=... per target"},
)

# nvcc options that choose GPU targets; a target whose copts use one gets no defaults.
_ARCH_OPTIONS = ["-arch", "--gpu-architecture", "-gencode", "--generate-code", "-code", "--gpu-code"]

def _parse_arch(arch, setting):
    """'sm_90' -> ('90', 90); 'sm_90a' -> ('90a', 90). Fails on anything else."""
    name = arch[len("sm_"):] if arch.startswith("sm_") else ""
    digits = name[:-1] if name[-1:] in ("a", "f") else name
    if len(digits) < 2 or not digits.isdigit():
        fail("%s: '%s' is not a GPU target such as sm_90 (expected a comma list, e.g. sm_80,sm_90)" % (setting, arch))
    return name, int(digits)

def _gencode_flags(value, setting):
    """nvcc flags for a comma list of sm_XX: machine code for each, PTX for the highest."""
    parsed = [_parse_arch(a, setting) for a in _uniq([a.strip() for a in value.split(",") if a.strip()])]
    if not parsed:
        fail("%s is empty: give at least one GPU target, e.g. sm_90" % setting)
    flags = []
    highest = parsed[0]
    for name, number in parsed:
        flags += ["-gencode", "arch=compute_%s,code=sm_%s" % (name, name)]

        # Of two with one number, the plain one (its PTX runs on every newer GPU; sm_90a's does not).
        if number > highest[1] or (number == highest[1] and name.isdigit()):
            highest = (name, number)
    flags += ["-gencode", "arch=compute_%s,code=compute_%s" % (highest[0], highest[0])]
    return flags

def _cuda_archs_impl(ctx):
    return [CudaArchsInfo(gencode = _gencode_flags(ctx.build_setting_value, "--" + str(ctx.label)))]

cuda_archs_setting = rule(
    implementation = _cuda_archs_impl,
    build_setting = config.string(flag = True),
    doc = "The GPU targets of every nvcc compile: a comma list such as sm_80,sm_90.",
)

def _chooses_archs(copts):
    for opt in copts:
        for o in _ARCH_OPTIONS:
            if opt == o or opt.startswith(o + "="):
                return True
    return False

# ---------------------------------------------------------------------------
# Compiles

_COMMON_ATTRS = {
    "hdrs": attr.label_list(
        allow_files = True,
        doc = "Headers the sources include (inputs of every compile).",
    ),
    "deps": attr.label_list(
        providers = [CcInfo],
        doc = "cc_library-like deps: include paths, defines and headers.",
    ),
    "copts": attr.string_list(doc = "Extra nvcc flags, after the defaults."),
    "defines": attr.string_list(doc = "Extra -D for these compiles only."),
    "_cuda_archs": attr.label(
        default = Label("//tools/bazel:cuda_archs"),
        providers = [CudaArchsInfo],
    ),
    "_host_copts": attr.label(
        default = Label("//tools/bazel:nvcc_host_copts"),
        providers = [HostCoptsInfo],
    ),
}

def _uniq(items):
    seen = {}
    out = []
    for i in items:
        if i not in seen:
            seen[i] = True
            out.append(i)
    return out

def _compilation_context(ctx):
    infos = [d[CcInfo] for d in ctx.attr.deps]
    return cc_common.merge_cc_infos(cc_infos = infos).compilation_context

def _flags(ctx, cc, extra_defines = []):
    """nvcc flags (without -c/-o/source) for a compile in `ctx`."""
    flags = list(_NVCC_FLAGS)
    if not _chooses_archs(ctx.attr.copts):
        flags += ctx.attr._cuda_archs[CudaArchsInfo].gencode
    for f in ctx.attr._host_copts[HostCoptsInfo].flags:
        flags += ["-Xcompiler", f]

    # The package's own workspace root (so `#include "pkg/x.hpp"` works as with
    # the cc rules), then the deps' include paths in Bazel's order.
    root = ctx.label.workspace_root or "."
    own = [root, ctx.bin_dir.path + ("/" + ctx.label.workspace_root if ctx.label.workspace_root else "")]
    for d in _uniq(own + cc.quote_includes.to_list() + cc.includes.to_list()):
        flags += ["-I", d]
    for d in _uniq(cc.system_includes.to_list()):
        flags += ["-isystem", d]
    for d in _uniq(cc.defines.to_list() + ctx.attr.defines + extra_defines):
        flags.append("-D" + d)
    flags += ctx.attr.copts
    return flags

def _inputs(ctx, cc, srcs):
    return depset(srcs + ctx.files.hdrs, transitive = [cc.headers])

def _out_stem(ctx, src):
    """Path of `src` relative to the package, without extension, for outputs."""
    path = src.short_path
    pkg = ctx.label.package + "/" if ctx.label.package else ""
    if src.owner and src.owner.workspace_root == ctx.label.workspace_root and path.startswith(pkg):
        path = path[len(pkg):]
    else:
        path = "_ext/" + path.replace("../", "")
    return path[:-len(src.extension) - 1] if src.extension else path

def _compile(ctx, cc, src, stem, extra_defines = []):
    """Runs nvcc on `src`; returns [<name>/<stem>.o].

    Compiled with -fPIC, named .o: the cc rules link objects from `srcs` whatever
    their PIC mode (a .pic.o copy as well would be linked twice).
    """
    obj = ctx.actions.declare_file("%s/%s.o" % (ctx.label.name, stem))
    args = ctx.actions.args()
    args.add_all(_flags(ctx, cc, extra_defines))
    args.add_all(["-o", obj.path, src.path])
    ctx.actions.run_shell(
        outputs = [obj],
        inputs = _inputs(ctx, cc, [src]),
        command = _NVCC + ' "$@"',
        arguments = [args],
        use_default_shell_env = True,
        mnemonic = "NvccCompile",
        progress_message = "nvcc %s" % src.short_path,
    )
    return [obj]

# ---------------------------------------------------------------------------
# cuda_objects

def _cuda_objects_impl(ctx):
    cc = _compilation_context(ctx)
    objs = []
    for src in ctx.files.srcs:
        objs += _compile(ctx, cc, src, _out_stem(ctx, src))
    return [DefaultInfo(files = depset(objs))]

cuda_objects = rule(
    implementation = _cuda_objects_impl,
    attrs = dict(_COMMON_ATTRS, srcs = attr.label_list(
        allow_files = [".cu"],
        mandatory = True,
        doc = "The .cu files; one nvcc action each.",
    )),
    doc = "Compiles .cu files with nvcc into .o files for cc_* rules' srcs.",
)

# ---------------------------------------------------------------------------
# Macros over cuda_objects + native cc rules

def cuda_library(name, srcs = [], hdrs = [], deps = [], copts = [], defines = [], **kwargs):
    """cuda_objects + cc_library: compiled .cu objects plus exported headers."""
    lib_srcs = []
    if srcs:
        _private_objects(name, srcs, hdrs, deps, copts, defines, kwargs)
        lib_srcs = [":" + name + "_cu"]
    native.cc_library(
        name = name,
        srcs = lib_srcs,
        hdrs = hdrs,
        deps = deps,
        **kwargs
    )

def _private_objects(name, srcs, hdrs, deps, copts, defines, kwargs):
    """The `<name>_cu` cuda_objects target behind cuda_library, cuda_binary and cuda_test."""
    cuda_objects(
        name = name + "_cu",
        srcs = srcs,
        hdrs = hdrs,
        deps = deps,
        copts = copts,
        defines = defines,
        visibility = ["//visibility:private"],
        tags = kwargs.get("tags", []),
    )

def cuda_binary(name, srcs, deps = [], hdrs = [], copts = [], defines = [], linkopts = [], **kwargs):
    """cuda_objects + cc_binary. `bazel run` works as for any cc_binary."""
    _private_objects(name, srcs, hdrs, deps, copts, defines, kwargs)
    native.cc_binary(
        name = name,
        srcs = [":" + name + "_cu"],
        deps = deps + [Label("@cuda//:cudart_static")],
        linkopts = linkopts,
        **kwargs
    )

def _runfiles_dir(label):
    """Runfiles-relative folder of a cuda_compile_outcomes target's logs."""
    if label.startswith(":"):
        return (native.package_name() + "/" + label[1:]).lstrip("/")
    if label.startswith("//"):
        pkg, _, name = label[2:].partition(":")
        if not name:
            name = pkg.rpartition("/")[2]
        return (pkg + "/" + name).lstrip("/")
    fail("compile_outcomes must be a label in this repository (':x' or '//pkg:x'), got " + label)

def cuda_test(
        name,
        srcs,
        deps = [],
        hdrs = [],
        copts = [],
        defines = [],
        linkopts = [],
        compile_outcomes = None,
        env = {},
        data = [],
        **kwargs):
    """cuda_objects + cc_test with Boost.Test's main (//test:boost_main).

    Linked statically (linkstatic = True) so the executable depends only on libc,
    libm, libstdc++ and libgcc_s and can be copied to the GPU machine.
    compile_outcomes: a cuda_compile_outcomes label; see the top of this file.
    """
    env = dict(env)
    data = list(data)
    if compile_outcomes:
        data.append(compile_outcomes)
        env["TENSORPLAY_COMPILE_OUTCOMES_DIR"] = _runfiles_dir(compile_outcomes)
    _private_objects(name, srcs, hdrs, deps, copts, defines, kwargs)
    native.cc_test(
        name = name,
        srcs = [":" + name + "_cu"],
        deps = deps + [
            Label("//test:boost_main"),
            Label("@cuda//:cudart_static"),
        ],
        linkopts = linkopts,
        linkstatic = True,
        env = env,
        data = data,
        **kwargs
    )

# ---------------------------------------------------------------------------
# header_check_test

def _include_path(ctx, hdr):
    path = hdr.short_path
    if path.startswith("../"):  # header of an external repository
        path = path.split("/", 2)[2]
    prefix = ctx.attr.strip_include_prefix.strip("/")
    if prefix:
        if not path.startswith(prefix + "/"):
            fail("%s is not under strip_include_prefix %s" % (hdr.short_path, prefix))
        path = path[len(prefix) + 1:]
    return path

def _header_check_impl(ctx):
    cc = _compilation_context(ctx)
    objs = []
    for hdr in ctx.files.hdrs:
        inc = _include_path(ctx, hdr)
        src = ctx.actions.declare_file("%s_src/%s.cu" % (ctx.label.name, inc))

        # Included twice: the second include must be a no-op (include guard or
        # #pragma once).
        ctx.actions.write(src, "#include <%s>\n#include <%s>\n" % (inc, inc))
        objs += _compile(ctx, cc, src, inc)

    script = ctx.actions.declare_file(ctx.label.name + ".sh")
    ctx.actions.write(script, is_executable = True, content = """#!/bin/bash
# Generated by header_check_test: the work happened at build time (every header
# was compiled on its own by nvcc). Report 0 test cases so that tools/test's
# Boost.Test counts are unaffected.
if [[ -n "${{XML_OUTPUT_FILE:-}}" ]]; then
  cat > "$XML_OUTPUT_FILE" <<'XML'
<?xml version="1.0" encoding="UTF-8"?>
<testsuites><testsuite name="{name}" tests="0" failures="0" errors="0" skipped="0"></testsuite></testsuites>
XML
fi
echo "{count} header(s) compiled on their own with nvcc."
""".format(name = ctx.label.name, count = len(ctx.files.hdrs)))
    return [DefaultInfo(
        executable = script,
        files = depset(objs + [script]),
        runfiles = ctx.runfiles(files = objs),
    )]

header_check_test = rule(
    implementation = _header_check_impl,
    test = True,
    attrs = dict(_COMMON_ATTRS, strip_include_prefix = attr.string(
        doc = "Prefix removed from a header's workspace-relative path to get its #include path.",
    )),
    doc = "Compiles every header of `hdrs` alone (#include <path>) with nvcc.",
)

# ---------------------------------------------------------------------------
# cuda_compile_outcomes

def _compile_outcomes_impl(ctx):
    cc = _compilation_context(ctx)
    src = ctx.file.src
    logs = []
    for case in ctx.attr.cases:
        log = ctx.actions.declare_file("%s/%s.log" % (ctx.label.name, case))
        args = ctx.actions.args()
        args.add(log.path)
        args.add_all(_flags(ctx, cc, ["TENSORPLAY_COMPILE_CASE_%s=1" % case]))
        args.add_all(["-o", "/dev/null", src.path])
        ctx.actions.run_shell(
            outputs = [log],
            inputs = _inputs(ctx, cc, [src]),
            # Never fails: the exit code is data for the test that reads the log.
            command = "\n".join([
                'log="$1"; shift',
                _NVCC + ' "$@" > "$log.out" 2>&1; rc=$?',
                '{ echo "exit=$rc"; cat "$log.out"; } > "$log"',
                'rm -f "$log.out"',
            ]),
            arguments = [args],
            use_default_shell_env = True,
            mnemonic = "NvccCompileOutcome",
            progress_message = "nvcc %s (case %s, expected to fail)" % (src.short_path, case),
        )
        logs.append(log)
    return [DefaultInfo(files = depset(logs), runfiles = ctx.runfiles(files = logs))]

cuda_compile_outcomes = rule(
    implementation = _compile_outcomes_impl,
    attrs = dict(
        _COMMON_ATTRS,
        src = attr.label(allow_single_file = [".cu"], mandatory = True),
        cases = attr.string_list(mandatory = True, allow_empty = False),
    ),
    doc = "Compiles `src` once per case; logs nvcc's exit code and output.",
)
