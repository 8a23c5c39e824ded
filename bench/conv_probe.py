"""Times single cuDNN convolutions of resnet18 (CIFAR, batch 256, bf16, channels-last) that the
kernel profile questioned (bench/results-h100-2026-12-07-c.txt), each as a replayed CUDA graph,
with cuDNN's heuristics (what hpc_train runs by default) and with its autotuning:
  - the stem's weight gradient (3 input channels; its input needs no gradient), and the same
    convolution with the input padded to 4 and 8 channels;
  - layer2's shortcut (1x1, stride 2, 64 -> 128 at 32x32) as the strided convolution and as the
    stride-1 convolution of the sampled pixels (an average pooling of one pixel at stride 2, so
    exact), which computes the same sums: forward, and forward with both gradients (autograd);
    and as one GEMM of the sampled pixels (on channels-last activations, [pixels, 64] x [64, 128])
    with the strided convolution's own gradients for backward.
  python3 bench/conv_probe.py
"""
import torch
import torch.nn.functional as F

REPLAYS = 50


def replayed_us(step):
    """Microseconds per replay of `step` captured in a CUDA graph, after a few eager runs."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(REPLAYS):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / REPLAYS * 1000


def tensor(*shape):
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16).contiguous(
        memory_format=torch.channels_last)


def gradients(dy, x, w, stride, padding, wanted):
    """aten's convolution_backward: (input, weight) gradients as `wanted` asks."""
    return torch.ops.aten.convolution_backward(dy, x, w, None, [stride] * 2, [padding] * 2, [1, 1],
                                               False, [0, 0], 1, [wanted[0], wanted[1], False])


def main():
    torch.manual_seed(0)
    for autotune in (False, True):
        torch.backends.cudnn.benchmark = autotune
        print(f"cuDNN {'autotuning' if autotune else 'heuristics'}:")
        dy = tensor(256, 64, 32, 32)
        for channels in (3, 4, 8):
            x, w = tensor(256, channels, 32, 32), tensor(64, channels, 3, 3)
            forward = replayed_us(lambda: F.conv2d(x, w, padding=1))
            weight_gradient = replayed_us(lambda: gradients(dy, x, w, 1, 1, (False, True)))
            print(f"  stem, {channels} input channels: forward {forward:6.1f} us, "
                  f"weight gradient {weight_gradient:6.1f} us")
        x, w, dy = tensor(256, 64, 32, 32), tensor(128, 64, 1, 1), tensor(256, 128, 16, 16)
        x.requires_grad_()
        w.requires_grad_()
        strided = lambda: F.conv2d(x, w, stride=2)
        sampled = lambda: F.conv2d(F.avg_pool2d(x, 1, 2), w)  # one pixel in each 2x2: exact
        both = lambda forward: lambda: torch.autograd.grad(forward(), (x, w), dy)
        with torch.no_grad():
            strided_forward, sampled_forward = replayed_us(strided), replayed_us(sampled)
        print(f"  layer2 shortcut, forward: strided {strided_forward:6.1f} us, sampled pixels "
              f"{sampled_forward:6.1f} us")
        strided_both, sampled_both = replayed_us(both(strided)), replayed_us(both(sampled))
        print(f"  layer2 shortcut, forward and both gradients: strided {strided_both:6.1f} us, "
              f"sampled pixels {sampled_both:6.1f} us")
        # The sampled pixels times the weight as one GEMM; backward the strided convolution's.
        gemm = lambda: (x.detach()[:, :, ::2, ::2].contiguous(memory_format=torch.channels_last)
                        .permute(0, 2, 3, 1).reshape(-1, 64) @ w.detach().reshape(128, 64).t())
        gemm_forward = replayed_us(gemm)
        gemm_both = replayed_us(lambda: (gemm(), gradients(dy, x, w, 2, 0, (True, True))))
        print(f"  layer2 shortcut as a GEMM of the sampled pixels: forward {gemm_forward:6.1f} us, "
              f"with the strided convolution's gradients {gemm_both:6.1f} us")


if __name__ == "__main__":
    main()
