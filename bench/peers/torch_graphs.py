#!/usr/bin/env python3
"""PyTorch's torch.cuda.CUDAGraph on the workload of bench/replay: graphs of 1, 10, 100 and
1000 one-element add kernels. Host submit cost of g.replay() and the cost of capture +
instantiate, medians. Run on the GPU machine next to bench/replay (same run)."""
import statistics
import sys
import time

import torch

BATCH = 64
REPEATS = 200


def main() -> int:
    if not torch.cuda.is_available():
        print("no GPU: nothing to measure")
        return 0
    stream = torch.cuda.Stream()
    x = torch.zeros(1, device="cuda")
    rows = []
    with torch.cuda.stream(stream):
        for kernels in (1, 10, 100, 1000):
            def body():
                for _ in range(kernels):
                    x.add_(1)

            body()  # warm up: kernels loaded, allocator primed
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            graph.capture_begin()
            body()
            graph.capture_end()
            for _ in range(3):
                graph.replay()
            torch.cuda.synchronize()

            submit = []
            for _ in range(REPEATS if kernels <= 10 else REPEATS // 10 if kernels <= 100 else REPEATS // 20):
                start = time.perf_counter()
                for _ in range(BATCH):
                    graph.replay()
                submit.append((time.perf_counter() - start) / BATCH)
                stream.synchronize()

            capture = []
            for _ in range(20 if kernels == 1000 else 100):
                g = torch.cuda.CUDAGraph()
                start = time.perf_counter()
                g.capture_begin()
                body()
                g.capture_end()  # instantiates
                capture.append(time.perf_counter() - start)
                del g
            rows.append((kernels, statistics.median(submit) * 1e6, statistics.median(capture) * 1e6))

    print(f"\n== PyTorch {torch.__version__} torch.cuda.CUDAGraph (medians) ==")
    for kernels, submit_us, capture_us in rows:
        print(f"  torch {kernels:4d} kernels: replay() host submit {submit_us:10.3f} us   capture+instantiate {capture_us:10.3f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
