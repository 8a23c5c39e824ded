"""The PyTorch reference that bench/gpu_bench.sh times hpc_train against: eager PyTorch, the
same network (bench/reference/models.py), batch and optimizer (AdamW lr 1e-3, betas 0.9/0.999,
eps 1e-8, weight decay 0.01, fused), autocast for fp16 (with GradScaler) and bf16, and the
whole training split already on the GPU as uint8 (indexing a random batch there each step), so
that only the training step is timed.

    python3 train_reference.py --dataset fm.h5 --model simple_cnn --batch 64 --precision bf16
Prints one JSON line: ms_per_step, samples_per_s (CUDA-event timing over --steps after --warmup).
--mode picks PyTorch's way of running the step:
  eager    the step as written;
  graph    the whole step (forward, backward, capturable fused AdamW, for fp16 the scaler) captured
           once in one CUDA graph and replayed, the batch's indices copied into a static buffer;
  compile  the model through torch.compile(mode="max-autotune") (its CUDA graphs included), the
           optimizer step after it; the compile time (the warm-up steps) is reported apart.
With --cuda-profiler the timed steps run between cudaProfilerStart and cudaProfilerStop, for a
profiler started with its capture off (bench/kernel_profile.sh). With --kernel-table FILE, after
the timed steps, 10 more run under torch.profiler (CUPTI, so a graph replay's kernels too, each
timed where it ran) and FILE gets every GPU kernel's microseconds and launches per step, summed
per name, heaviest first: how torch.compile's step spends its time, where ncu would have to run
the minutes of autotuning under its own process.
With --epochs N it trains N epochs (shuffled, every sample once) instead and reports wall time
and test accuracy, as hpc_train's whole job does.

Started by torch.distributed.run (at any --nproc_per_node) it is the PyTorch DDP reference:
one process per GPU, NCCL, DistributedDataParallel with its default 25 MiB buckets
(gradient_as_bucket_view), --batch per GPU, each rank drawing its own batches; rank 0 prints
the global samples/s, timed by the slowest rank:
    python3 -m torch.distributed.run --nproc_per_node 4 train_reference.py --dataset ... --batch 256
"""
import argparse
import json
import os
import time

import h5py
import numpy as np
import torch
import torch.nn.functional as F

from models import build


def load(path, split):
    with h5py.File(path, "r") as f:
        images = torch.from_numpy(f[f"/{split}/images"][...])
        labels = torch.from_numpy(f[f"/{split}/labels"][...].astype(np.int64))
        attrs = {k: f.attrs[k] for k in ("num_classes", "mean", "std")}
    return images, labels, attrs


def write_kernel_table(step, batches, path):
    """Every GPU kernel (and copy or fill) of the steps of `batches` under torch.profiler, summed
    per name: microseconds and launches per step, heaviest first, into `path` (None: the steps
    only, as a DDP rank other than 0 must run them for rank 0's collectives)."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as profiler:
        for index in batches:
            step(index)
        torch.cuda.synchronize()
    if path is None:
        return
    steps = len(batches)
    per_name = {}
    for event in profiler.events():
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        us, launches = per_name.get(event.name, (0.0, 0))
        per_name[event.name] = (us + event.time_range.elapsed_us(), launches + 1)
    total = sum(us for us, _ in per_name.values())
    with open(path, "w") as out:
        out.write(f"# {total / steps:.1f} us of GPU work per step over {steps} steps, "
                  f"{sum(n for _, n in per_name.values()) / steps:g} launches per step\n")
        for name, (us, launches) in sorted(per_name.items(), key=lambda item: -item[1][0]):
            out.write(f"{us / steps:9.1f} us {us / total:6.1%} x{launches / steps:<5g} "
                      f"{name[:160]}\n")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--model", default="simple_cnn")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--precision", choices=["fp32", "fp16", "bf16"], default="fp32")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--epochs", type=int, default=0)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--mode", choices=["eager", "graph", "compile"], default="eager")
    parser.add_argument("--cuda-profiler", action="store_true")
    parser.add_argument("--kernel-table", metavar="FILE")
    args = parser.parse_args()
    distributed = "LOCAL_RANK" in os.environ  # started by torch.distributed.run
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if distributed and args.epochs > 0:
        parser.error("--epochs runs on one GPU; the DDP reference times --steps")
    if distributed:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        torch.distributed.init_process_group("nccl")
    torch.manual_seed(args.seed)  # the same initial weights on every rank, as DDP expects
    device = torch.device("cuda", torch.cuda.current_device())
    torch.backends.cudnn.benchmark = True

    images, labels, attrs = load(args.dataset, "train")
    images, labels = images.to(device), labels.to(device)
    n, channels, height, width = images.shape
    mean = torch.tensor(np.asarray(attrs["mean"]), device=device).view(1, -1, 1, 1)
    std = torch.tensor(np.asarray(attrs["std"]), device=device).view(1, -1, 1, 1)
    model = build(args.model, channels, height, width, int(attrs["num_classes"])).to(device)
    model = model.to(memory_format=torch.channels_last)
    if distributed:
        model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index], gradient_as_bucket_view=True)
    if args.mode != "eager" and (distributed or args.epochs > 0):
        parser.error("--mode graph|compile times --steps on one GPU")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                                  weight_decay=0.01, fused=True,
                                  capturable=args.mode == "graph")
    forward = torch.compile(model, mode="max-autotune") if args.mode == "compile" else model
    dtype = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}[args.precision]
    scaler = torch.amp.GradScaler("cuda", enabled=args.precision == "fp16")

    def step(index):
        x = ((images[index].float() / 255.0 - mean) / std).contiguous(memory_format=torch.channels_last)
        with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = F.cross_entropy(forward(x), labels[index])
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        return loss

    model.train()
    if args.epochs > 0:
        test_images, test_labels, _ = load(args.dataset, "test")
        start = time.perf_counter()
        for _ in range(args.epochs):
            order = torch.randperm(n, device=device)
            for begin in range(0, n, args.batch):
                step(order[begin:begin + args.batch])
        torch.cuda.synchronize()
        wall_s = time.perf_counter() - start
        model.eval()
        correct = 0
        with torch.no_grad():
            for begin in range(0, len(test_labels), 1024):
                x = (test_images[begin:begin + 1024].to(device).float() / 255.0 - mean) / std
                correct += (model(x).argmax(1).cpu() == test_labels[begin:begin + 1024]).sum().item()
        print(json.dumps({"framework": "pytorch", "model": args.model, "epochs": args.epochs,
                          "wall_s": wall_s, "test_accuracy": correct / len(test_labels)}))
        return

    generator = torch.Generator(device=device).manual_seed(args.seed + rank)
    batches = [torch.randint(0, n, (args.batch,), device=device, generator=generator)
               for _ in range(args.warmup + args.steps)]
    warmup_start = time.perf_counter()
    if args.mode == "graph":
        # PyTorch's whole-network capture: warm up on a side stream, then capture one step with
        # the gradients unset, so that the graph's backward allocates and writes them each replay.
        static_index = batches[0].clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for i in range(args.warmup):
                step(batches[i])
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        optimizer.zero_grad(set_to_none=True)
        with torch.cuda.graph(graph):
            x = ((images[static_index].float() / 255.0 - mean) / std).contiguous(
                memory_format=torch.channels_last)
            with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
                loss = F.cross_entropy(model(x), labels[static_index])
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()

        def step(index):  # noqa: F811: the timed step is the replay
            static_index.copy_(index)
            graph.replay()
    else:
        for i in range(args.warmup):
            step(batches[i])
    torch.cuda.synchronize()
    warmup_s = time.perf_counter() - warmup_start
    if distributed:
        torch.distributed.barrier()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    if args.cuda_profiler:
        torch.cuda.profiler.start()
    begin.record()
    for i in range(args.steps):
        step(batches[args.warmup + i])
    end.record()
    if args.cuda_profiler:
        torch.cuda.profiler.stop()
    torch.cuda.synchronize()
    ms = begin.elapsed_time(end) / args.steps
    if args.kernel_table:
        write_kernel_table(step, batches[args.warmup:args.warmup + 10],
                           args.kernel_table if rank == 0 else None)
    if distributed:
        slowest = torch.tensor([ms], device=device)
        torch.distributed.all_reduce(slowest, op=torch.distributed.ReduceOp.MAX)
        ms = float(slowest)
        torch.distributed.destroy_process_group()
    if rank == 0:
        print(json.dumps({"framework": "pytorch-ddp" if distributed else "pytorch",
                          "model": args.model, "batch": args.batch, "world_size": world,
                          "precision": args.precision, "mode": args.mode, "warmup_s": warmup_s,
                          "ms_per_step": ms,
                          "samples_per_s": args.batch * world * 1e3 / ms}))


if __name__ == "__main__":
    main()
