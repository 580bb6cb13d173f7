#!/usr/bin/env python3
"""PyTorch's peer of bench/random: torch.cuda.CUDAGraph of 1 and 100 ops that draw random numbers
(torch.rand into a static buffer, the default CUDA generator registered with the graph as PyTorch
does by itself) against the same graph of ops that draw nothing (mul_). Host submit of g.replay()
and device time per replay (CUDA events around a batch), medians. Run on the GPU machine next to
bench/random (same run)."""
import statistics
import sys
import time

import torch

BATCH = 64
REPEATS = 200
N = 256  # elements per op: one block, as in bench/random


def capture(ops, body):
    graph = torch.cuda.CUDAGraph()
    body(ops)  # warm up: kernels loaded, allocator primed
    torch.cuda.synchronize()
    graph.capture_begin()
    body(ops)
    graph.capture_end()
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    return graph


def measure(graph, stream, repeats):
    submit, device = [], []
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(BATCH):
            graph.replay()
        submit.append((time.perf_counter() - start) / BATCH)
        stream.synchronize()
        begin.record(stream)
        for _ in range(BATCH):
            graph.replay()
        end.record(stream)
        end.synchronize()
        device.append(begin.elapsed_time(end) * 1e-3 / BATCH)
    return statistics.median(submit) * 1e6, statistics.median(device) * 1e6


def main() -> int:
    if not torch.cuda.is_available():
        print("no GPU: nothing to measure")
        return 0
    stream = torch.cuda.Stream()
    buf = torch.zeros(N, device="cuda")
    rows = []
    with torch.cuda.stream(stream):
        for ops in (1, 100):
            def draw(k):
                for _ in range(k):
                    torch.rand(N, device="cuda", out=buf)

            def plain(k):
                for _ in range(k):
                    buf.mul_(1.0)

            with_rand = capture(ops, draw)
            without = capture(ops, plain)
            repeats = REPEATS if ops == 1 else REPEATS // 5
            r_submit, r_device = measure(with_rand, stream, repeats)
            p_submit, p_device = measure(without, stream, repeats)
            # Each replay of with_rand must draw new numbers (the generator's offset advances).
            with_rand.replay()
            first = buf.clone()
            with_rand.replay()
            fresh = not torch.equal(first, buf)
            rows.append((ops, p_submit, r_submit, p_device, r_device, fresh))

    print(f"\n== PyTorch {torch.__version__} torch.cuda.CUDAGraph with torch.rand (medians) ==")
    for ops, p_submit, r_submit, p_device, r_device, fresh in rows:
        print(f"  torch {ops:3d} ops: replay() host submit {p_submit:8.3f} us without rand, {r_submit:8.3f} us with "
              f"({r_submit / p_submit:.3f}x); device {p_device:8.3f} / {r_device:8.3f} us ({r_device / p_device:.3f}x); "
              f"fresh numbers per replay: {fresh}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
