"""A plain NCCL all-reduce of a given number of bytes through torch.distributed, the yardstick
for the bus bandwidth hpc_train's reducer reaches (bench/scaling.sh).

    python3 -m torch.distributed.run --nproc_per_node N allreduce_bw.py --bytes 22353952

Rank 0 prints one JSON line: the median time of --iters all-reduces (bf16, one buffer of
--bytes, after --warmup) by CUDA events, algbw = bytes / time and busbw = algbw x 2(n-1)/n
(nccl-tests' definition), in GB/s.
"""
import argparse
import json
import os

import torch
import torch.distributed as dist


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bytes", type=int, required=True)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    args = parser.parse_args()
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    world = dist.get_world_size()
    # Refilled before each all-reduce (outside the timed region), so that sums never overflow.
    source = torch.randn(args.bytes // 2, dtype=torch.bfloat16, device="cuda")
    buffer = source.clone()
    for _ in range(args.warmup):
        dist.all_reduce(buffer)
    torch.cuda.synchronize()
    times_ms = []
    for _ in range(args.iters):
        buffer.copy_(source)
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        dist.all_reduce(buffer)
        end.record()
        end.synchronize()
        times_ms.append(begin.elapsed_time(end))
    median_ms = sorted(times_ms)[len(times_ms) // 2]
    algbw = buffer.numel() * buffer.element_size() / (median_ms * 1e-3) / 1e9
    if dist.get_rank() == 0:
        print(json.dumps({"world_size": world, "bytes": buffer.numel() * buffer.element_size(),
                          "ms": median_ms, "algbw_gb_s": algbw,
                          "busbw_gb_s": algbw * 2 * (world - 1) / world}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
