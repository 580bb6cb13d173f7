"""@cuda: the CUDA toolkit installed on the machine, as a Bazel repository.

    load("@tensorplay//tools/bazel:cuda_toolkit.bzl", "cuda_toolkit_repository")
    cuda_toolkit_repository(name = "cuda")                      # /usr/local/cuda
    cuda_toolkit_repository(name = "cuda", path = "/opt/cuda")  # another toolkit

Like new_local_repository, it links every entry of the toolkit's folder into the
repository. Its BUILD file is tools/bazel/cuda.BUILD with the toolkit's path filled
in, so that the shared libraries carry an rpath to the toolkit they were linked
against. Used by WORKSPACE (tensorplay_repositories in offline.bzl) and by MODULE.bazel
(extensions.bzl).
"""

def _cuda_toolkit_repository_impl(repository_ctx):
    root = repository_ctx.path(repository_ctx.attr.path)
    if not root.exists:
        fail("CUDA toolkit not found at %s: install it there or pass path = ..." % root)
    for entry in root.readdir():
        repository_ctx.symlink(entry, entry.basename)
    repository_ctx.template(
        "BUILD.bazel",
        repository_ctx.attr._build_file,
        substitutions = {"%{cuda_path}": str(root)},
        executable = False,
    )

cuda_toolkit_repository = repository_rule(
    implementation = _cuda_toolkit_repository_impl,
    attrs = {
        "path": attr.string(default = "/usr/local/cuda", doc = "The toolkit's folder (with bin/, include/, lib64/)."),
        "_build_file": attr.label(default = Label("//tools/bazel:cuda.BUILD"), allow_single_file = True),
    },
    local = True,
    doc = "The CUDA toolkit at `path`, with the targets of tools/bazel/cuda.BUILD.",
)
