"""Module extension for MODULE.bazel (bzlmod, Bazel >= 6): @cuda, the local CUDA toolkit.

Not loaded by Bazel 4 (module_extension does not exist there), and not tested: only
Bazel 4.2.3 is available offline here. WORKSPACE builds make @cuda with the same
repository rule (cuda_toolkit.bzl), through tensorplay_repositories() in offline.bzl.

    cuda = use_extension("@tensorplay//tools/bazel:extensions.bzl", "cuda")
    cuda.toolkit(path = "/opt/cuda")   # optional; default /usr/local/cuda
    use_repo(cuda, "cuda")
"""

load(":cuda_toolkit.bzl", "cuda_toolkit_repository")

_DEFAULT_PATH = "/usr/local/cuda"

_toolkit = tag_class(
    attrs = {"path": attr.string(default = _DEFAULT_PATH, doc = "The CUDA toolkit's folder.")},
    doc = "Where the CUDA toolkit is. The root module's tag wins, then the first other one.",
)

def _cuda_impl(module_ctx):
    # module_ctx.modules lists the root module first.
    paths = [tag.path for module in module_ctx.modules for tag in module.tags.toolkit]
    cuda_toolkit_repository(name = "cuda", path = paths[0] if paths else _DEFAULT_PATH)

cuda = module_extension(
    implementation = _cuda_impl,
    tag_classes = {"toolkit": _toolkit},
    doc = "Defines @cuda: the CUDA toolkit installed on the machine (tools/bazel/cuda.BUILD).",
)
