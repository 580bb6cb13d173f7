#!/usr/bin/env python3
"""PyTorch's way of staging fresh inputs, on the workload of bench/stage: static.copy_(x) for
every input, then g.replay(). Host submit cost for 4 and 32 inputs of 256 KiB, and launch to
completion for 4, medians. Run on the GPU machine next to bench/stage (same run).

Also 4 inputs of 64 MiB that change at every step (two sets in turn), as bench/rebind measures
rebind + replay against stage_and_launch: device time per step (CUDA events) and host submit
per step (8 steps per sample). PyTorch has no way to point a captured graph at other memory, so
copying is its only way."""
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


LARGE_FLOATS = 16 * 1024 * 1024  # 64 MiB
LARGE_SUBMIT_BATCH = 8
LARGE_REPEATS = 20


def measure_large(stream):
    statics = [torch.zeros(LARGE_FLOATS, device="cuda") for _ in range(4)]
    sets = [[torch.full((LARGE_FLOATS,), float(s + 1), device="cuda") for _ in range(4)] for s in range(2)]
    out = torch.zeros(1, device="cuda")
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    graph.capture_begin()
    out.copy_(statics[0][:1] + statics[1][:1] + statics[2][:1] + statics[3][:1])
    graph.capture_end()
    turn = [0]

    def step():
        fresh = sets[turn[0] % 2]
        turn[0] += 1
        for s, x in zip(statics, fresh):
            s.copy_(x)
        graph.replay()

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    device = []
    for _ in range(LARGE_REPEATS):
        begin = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        begin.record(stream)
        step()
        end.record(stream)
        end.synchronize()
        device.append(begin.elapsed_time(end) * 1e-3)
    submit = []
    for _ in range(LARGE_REPEATS):
        start = time.perf_counter()
        for _ in range(LARGE_SUBMIT_BATCH):
            step()
        submit.append((time.perf_counter() - start) / LARGE_SUBMIT_BATCH)
        stream.synchronize()
    assert torch.equal(statics[0], sets[(turn[0] - 1) % 2][0])
    return statistics.median(device) * 1e6, statistics.median(submit) * 1e6


def main() -> int:
    if not torch.cuda.is_available():
        print("no GPU: nothing to measure")
        return 0
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        results = {n: measure(n, stream) for n in (4, 32)}
        large_device_us, large_submit_us = measure_large(stream)
    print(f"\n== PyTorch {torch.__version__}: static.copy_(x) per input + g.replay() (medians) ==")
    for n, (submit_us, completion_us) in results.items():
        print(f"  torch {n:2d} x 256 KiB: host submit {submit_us:10.3f} us   launch to completion {completion_us:10.3f} us")
    print(f"  torch  4 x 64 MiB, fresh at every step: device time per step {large_device_us:10.3f} us"
          f"   host submit per step {large_submit_us:10.3f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
