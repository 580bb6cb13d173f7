#!/usr/bin/env python3
"""PyTorch's way of staging fresh inputs, on the workload of bench/stage: static.copy_(x) for
every input, then g.replay(). Host submit cost for 4 and 32 inputs of 256 KiB, and launch to
completion for 4, medians. Run on the GPU machine next to bench/stage (same run)."""
import statistics
import sys
import time

import torch

BATCH = 64
REPEATS = 100
FLOATS = 64 * 1024  # 256 KiB


def measure(n: int, stream):
    statics = [torch.zeros(FLOATS, device="cuda") for _ in range(n)]
    inputs = [torch.ones(FLOATS, device="cuda") for _ in range(n)]
    out = torch.zeros(n, device="cuda")
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    graph.capture_begin()
    for k in range(n):
        out[k : k + 1].add_(statics[k][:1])
    graph.capture_end()

    def stage():
        for s, x in zip(statics, inputs):
            s.copy_(x)
        graph.replay()

    for _ in range(5):
        stage()
    torch.cuda.synchronize()
    submit = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        for _ in range(BATCH):
            stage()
        submit.append((time.perf_counter() - start) / BATCH)
        stream.synchronize()
    completion = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        stage()
        stream.synchronize()
        completion.append(time.perf_counter() - start)
    assert torch.equal(statics[0], inputs[0])
    return statistics.median(submit) * 1e6, statistics.median(completion) * 1e6


def main() -> int:
    if not torch.cuda.is_available():
        print("no GPU: nothing to measure")
        return 0
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        results = {n: measure(n, stream) for n in (4, 32)}
    print(f"\n== PyTorch {torch.__version__}: static.copy_(x) per input + g.replay() (medians) ==")
    for n, (submit_us, completion_us) in results.items():
        print(f"  torch {n:2d} x 256 KiB: host submit {submit_us:10.3f} us   launch to completion {completion_us:10.3f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
