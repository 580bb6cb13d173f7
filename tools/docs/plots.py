#!/usr/bin/env python3
"""Bar charts for docs/performance.md from one GPU run's bench.json.

Usage:
    python3 tools/docs/plots.py BENCH_JSON [OUT_DIR]      (OUT_DIR defaults to docs/img)

Needs: Python 3.8+ and matplotlib (`python3 -m pip install matplotlib`); nothing else.
The repository's build does not need it, so it is not installed by any tools/ script.

BENCH_JSON is the file tools/gpu/run --bench writes to $OUT: {"<binary>": <Google Benchmark
JSON>, ...}. Only the runs with run_type "aggregate" and aggregate_name "median" are read, and
only their user counters named "<variant>_us" (the medians of the paired measurements that
bench::compare in bench/bench_util.hpp reports). The charts (PNG, ~100 dpi, well under 100 KB):

    replay_ratio.png     replay(stream), replay() and capture + instantiate / raw CUDA, per graph size
    stage_and_launch.png host submit of stage_and_launch against the other ways to stage inputs
    eager_vs_graph.png   eager against graph: buckets (10,000 random steps) and NCCL steps (2 GPUs)

A chart whose benchmark is missing from BENCH_JSON is skipped with a message, not invented.
bench/nccl's second run (NCCL_GRAPH_MIXING_SUPPORT=0) is printed to bench.log only, so the NCCL
chart shows NCCL's default (mixing on).
"""

import json
import os
import sys

try:
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt
except ImportError:
    sys.exit("tools/docs/plots.py needs matplotlib: python3 -m pip install matplotlib")


def medians(bench_json):
    """{binary: {benchmark name without the aggregate suffix: {variant: microseconds}}}."""
    out = {}
    for binary, result in bench_json.items():
        rows = {}
        for b in result.get("benchmarks", []):
            if b.get("run_type") != "aggregate" or b.get("aggregate_name") != "median":
                continue
            name = b.get("run_name") or b["name"]
            # "launch/0/iterations:100/manual_time" -> "launch/0"
            name = "/".join(p for p in name.split("/") if ":" not in p and p != "manual_time")
            rows[name] = {k[: -len("_us")]: v for k, v in b.items() if k.endswith("_us") and isinstance(v, (int, float))}
        out[binary] = rows
    return out


def need(m, binary, *names):
    """The rows asked for, or None (with a message) when one is missing."""
    rows = m.get(binary, {})
    missing = [n for n in names if n not in rows or not rows[n]]
    if missing:
        print(f"skipped: {binary} lacks {', '.join(missing)}", file=sys.stderr)
        return None
    return [rows[n] for n in names]


def bars(ax, groups, series, values, colors=None, fmt="%.3g"):
    """Grouped bars: values[s][g] for series s in group g, each labelled with its value."""
    n = len(series)
    width = 0.8 / n
    for s, label in enumerate(series):
        xs = [g + (s - (n - 1) / 2) * width for g in range(len(groups))]
        drawn = ax.bar(xs, values[s], width, label=label, color=None if colors is None else colors[s])
        ax.bar_label(drawn, fmt=fmt, fontsize=6, padding=1)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups)


def replay_ratio(m, out):
    sizes = [1, 10, 100, 1000]
    launch = need(m, "replay_bench", *[f"launch/{i}" for i in range(4)])
    capture = need(m, "replay_bench", *[f"capture/{i}" for i in range(4)])
    if launch is None or capture is None:
        return None
    series = ["replay(stream) / raw cudaGraphLaunch", "replay() / raw cudaGraphLaunch", "capture + instantiate / raw"]
    values = [
        [r["replay_stream"] / r["raw"] for r in launch],
        [r["replay_current"] / r["raw"] for r in launch],
        [r["ours"] / r["raw"] for r in capture],
    ]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    bars(ax, [f"{k} kernel{'s' if k > 1 else ''}" for k in sizes], series, values, fmt="%.3f")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.axhline(1.05, color="gray", linestyle="--", linewidth=0.8, label="target 1.05x (replay(stream), capture)")
    ax.axhline(1.10, color="gray", linestyle=":", linewidth=0.8, label="target 1.10x (replay())")
    ax.set_ylim(0.85, 1.15)
    ax.set_ylabel("tensorplay / raw CUDA (host time)")
    ax.set_title("bench/replay: ratio to raw CUDA, same run, paired")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.09), ncol=2, frameon=False)
    return save(fig, out, "replay_ratio.png")


def stage(m, out):
    rows = need(m, "stage_bench", "submit4", "submit32")
    if rows is None:
        return None
    variants = [
        ("bare_replay", "bare replay(stream), no staging"),
        ("stage_and_launch", "stage_and_launch"),
        ("separate_kernel", "copy kernel alone + replay"),
        ("memcpy_batch", "cudaMemcpyBatchAsync + replay"),
        ("memcpy_loop", "cudaMemcpyAsync per input + replay"),
    ]
    values = [[r[key] for r in rows] for key, _ in variants]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    bars(ax, ["4 x 256 KiB", "32 x 256 KiB"], [label for _, label in variants], values)
    ax.set_yscale("log")
    ticks = [1, 2, 5, 10, 20, 50, 100, 200]
    ax.set_yticks(ticks)
    ax.set_yticklabels([str(t) for t in ticks])
    ax.set_ylim(0.8, 400)
    ax.set_ylabel("host submit per call, us (log)")
    ax.set_title("bench/stage: staging inputs, then replaying a 1-kernel graph")
    ax.legend(fontsize=7, loc="upper left")
    return save(fig, out, "stage_and_launch.png")


def eager_vs_graph(m, out):
    buckets = need(m, "buckets_bench", "end_to_end")
    nccl = need(m, "nccl_bench", "complete/0", "complete/1", "complete/2")
    if buckets is None and nccl is None:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.4), gridspec_kw={"width_ratios": [1, 2]})
    if buckets is not None:
        r = buckets[0]
        ax = axes[0]
        drawn = ax.bar(["eager", "GraphBuckets"], [r["eager"] / 1e6, r["buckets"] / 1e6], color=["tab:gray", "tab:blue"])
        ax.bar_label(drawn, fmt="%.2f s", fontsize=7, padding=1)
        ax.set_ylabel("seconds, launch to completion")
        ax.set_title(f"bench/buckets: 10,000 steps\n{r['eager'] / r['buckets']:.2f}x", fontsize=9)
    else:
        axes[0].set_axis_off()
    if nccl is not None:
        ax = axes[1]
        values = [[r["eager"] for r in nccl], [r["graph"] for r in nccl], [r["raw"] for r in nccl]]
        bars(ax, ["4 KiB", "64 KiB", "4 MiB"], ["eager", "DeviceGroupGraph", "raw cudaGraphLaunch"], values,
             colors=["tab:gray", "tab:blue", "tab:orange"], fmt="%.0f")
        ax.set_ylabel("us per step, launch to completion")
        ax.set_title("bench/nccl: 16 all-reduces + 16 kernels, 2 GPUs\n(NCCL default: graph mixing on)", fontsize=9)
        ax.legend(fontsize=7)
    else:
        axes[1].set_axis_off()
    return save(fig, out, "eager_vs_graph.png")


def save(fig, out, name):
    fig.tight_layout()
    path = os.path.join(out, name)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    print(f"{path}: {os.path.getsize(path) // 1024} KiB")
    return path


def main(argv):
    if len(argv) not in (2, 3) or argv[1] in ("-h", "--help"):
        sys.exit(__doc__)
    with open(argv[1]) as fh:
        m = medians(json.load(fh))
    out = argv[2] if len(argv) == 3 else os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs", "img"))
    os.makedirs(out, exist_ok=True)
    written = [p for p in (replay_ratio(m, out), stage(m, out), eager_vs_graph(m, out)) if p]
    if not written:
        sys.exit("no chart written: BENCH_JSON has none of the benchmarks these charts need")


if __name__ == "__main__":
    main(sys.argv)
