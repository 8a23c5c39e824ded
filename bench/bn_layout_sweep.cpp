// The fused batch norm's passes (Note [Fused batch norm] in include/hpc_train/model/
// fused_batch_norm.h) at every batch-norm shape of resnet18 on CIFAR (batch 256) and of resnet50
// at 224 (batch 128), bf16 channels-last as the step runs them, under several layouts
// (BnLayoutLimits), next to LibTorch's batch norm, add and ReLU through autograd on the same
// tensors: one run on one GPU says which layout each shape wants, forward and backward apart
// (each pass computes its own layout).
//   bn_layout_sweep [resnet18|resnet50]       (both without an argument)
// Each case is captured kPassesPerGraph times in a CUDA graph and replayed kReplays times. Before
// each pass its input is copied in from a second buffer, as the convolution before it writes it
// in the step, so that the L2 cache holds what it holds there; the copies' own time (a graph of
// the copies alone) is taken off. Forward is timed alone and followed by backward; backward is
// the difference. Printed: microseconds per pass for LibTorch and for each layout
// ("tile_vectors/rows_per_thread/blocks_per_sm"; the first column is the step's default), each
// model's sums weighted by how many batch norms of that shape it has, and what the best layout
// per shape would sum to.
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <torch/torch.h>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "hpc_train/model/fused_batch_norm.h"

namespace {

using hpc_train::BnLayout;
using hpc_train::BnLayoutLimits;

constexpr int kPassesPerGraph = 10;
constexpr int kReplays = 20;
constexpr double kMomentum = 0.1, kEps = 1e-5;

struct Shape {
  std::string model;
  int64_t batch, channels, pixels;  // an activation is [batch, channels, pixels, pixels]
  bool relu, residual;
  int count;  // the model's batch norms of this shape

  std::string name() const {
    return model + " " + std::to_string(channels) + "x" + std::to_string(pixels) + "^2" +
           (relu ? " relu" : "") + (residual ? "+res" : "");
  }
};

// resnet18 (CIFAR stem, 3x3) at batch 256: the stem's batch norm, then per stage the blocks'
// first (ReLU) and second (residual and ReLU) batch norms and the shortcut's (neither).
// resnet50 (ImageNet stem, 7x7 then pooling) at batch 128: the bottlenecks' first two (ReLU),
// third (residual and ReLU) and the shortcut's; a stage's first block has its first batch norm
// at the previous stage's size (the stride is in the 3x3 convolution).
std::vector<Shape> shapes_of(const std::string& model) {
  std::vector<Shape> all;
  if (model == "resnet18") {
    all.push_back({model, 256, 64, 32, true, false, 3});
    all.push_back({model, 256, 64, 32, true, true, 2});
    for (int64_t stage = 1; stage < 4; ++stage) {
      const int64_t channels = 64 << stage, pixels = 32 >> stage;
      all.push_back({model, 256, channels, pixels, true, false, 2});
      all.push_back({model, 256, channels, pixels, true, true, 2});
      all.push_back({model, 256, channels, pixels, false, false, 1});
    }
  } else {
    all.push_back({model, 128, 64, 112, true, false, 1});
    const int blocks[] = {3, 4, 6, 3};
    for (int stage = 0; stage < 4; ++stage) {
      const int64_t width = 64 << stage, pixels = 56 >> stage;
      if (stage > 0) all.push_back({model, 128, width, pixels * 2, true, false, 1});
      all.push_back({model, 128, width, pixels, true, false, 2 * blocks[stage] - (stage > 0)});
      all.push_back({model, 128, 4 * width, pixels, true, true, blocks[stage]});
      all.push_back({model, 128, 4 * width, pixels, false, false, 1});
    }
  }
  return all;
}

// The step's default first, then a grid around it.
std::vector<BnLayoutLimits> variants() {
  std::vector<BnLayoutLimits> all{BnLayoutLimits{}};
  for (int tile_vectors : {256, 32, 8, 4})
    for (int rows_per_thread : {16, 4})
      for (int blocks_per_sm : {4, 8}) {
        const BnLayoutLimits v{tile_vectors, rows_per_thread, blocks_per_sm};
        const BnLayoutLimits d{};
        if (v.tile_vectors != d.tile_vectors || v.rows_per_thread != d.rows_per_thread ||
            v.blocks_per_sm != d.blocks_per_sm)
          all.push_back(v);
      }
  return all;
}

std::string label(const BnLayoutLimits& v) {
  return std::to_string(v.tile_vectors) + "/" + std::to_string(v.rows_per_thread) + "/" +
         std::to_string(v.blocks_per_sm);
}

auto grid_of(const BnLayout& l) {
  return std::make_tuple(l.tile_vectors, l.row_lanes, l.channel_tiles, l.row_blocks,
                         l.rows_per_block);
}

// Microseconds per call of `work`, replayed from a CUDA graph of kPassesPerGraph calls.
double replayed_us(const std::function<void()>& work) {
  if (cudaDeviceSynchronize() != cudaSuccess) throw std::runtime_error("CUDA error before a case");
  const c10::cuda::CUDAStream stream = c10::cuda::getStreamFromPool();
  const c10::cuda::CUDAStreamGuard guard(stream);
  work();  // first uses outside the capture (cuDNN's plans, the allocator's blocks)
  at::cuda::CUDAGraph graph;
  graph.capture_begin();
  for (int i = 0; i < kPassesPerGraph; ++i) work();
  graph.capture_end();
  graph.replay();
  at::cuda::CUDAEvent start(cudaEventDefault), end(cudaEventDefault);
  start.record(stream);
  for (int i = 0; i < kReplays; ++i) graph.replay();
  end.record(stream);
  end.synchronize();
  return start.elapsed_time(end) * 1000.0 / (kReplays * kPassesPerGraph);
}

// One shape's tensors, for both LibTorch and the kernels: bf16 activations, fp32 parameters (as
// autocast leaves them).
struct Tensors {
  explicit Tensors(const Shape& s) {
    const auto activation = [&] {
      return torch::randn({s.batch, s.channels, s.pixels, s.pixels}, torch::kCUDA)
          .to(torch::kBFloat16)
          .contiguous(at::MemoryFormat::ChannelsLast);
    };
    const auto channel = [&](double value) {
      return torch::full({s.channels}, value, torch::dtype(torch::kFloat).device(torch::kCUDA));
    };
    x_source = activation();
    dy_source = activation();
    x = activation().requires_grad_();
    dy = activation();
    residual = activation().requires_grad_();
    y = activation();
    dx = activation();
    dresidual = activation();
    weight = (channel(1.0) + 0.1 * torch::randn_like(channel(0.0))).requires_grad_();
    bias = (0.1 * torch::randn_like(channel(0.0))).requires_grad_();
    running_mean = channel(0.0);
    running_var = channel(1.0);
    save_mean = channel(0.0);
    save_invstd = channel(0.0);
    dweight = channel(0.0);
    dbias = channel(0.0);
  }
  torch::Tensor x_source, dy_source, x, dy, residual, y, dx, dresidual;
  torch::Tensor weight, bias, running_mean, running_var, save_mean, save_invstd, dweight, dbias;
};

void copy_in(const torch::Tensor& to, const torch::Tensor& from) {
  const torch::NoGradGuard no_grad;
  to.copy_(from);
}

// LibTorch's ops as eager PyTorch runs torchvision's blocks: batch_norm, `+= identity`, ReLU
// in place; backward through autograd.
torch::Tensor reference_forward(const Shape& s, Tensors& t) {
  copy_in(t.x, t.x_source);
  torch::Tensor y = torch::batch_norm(t.x, t.weight, t.bias, t.running_mean, t.running_var,
                                      /*training=*/true, kMomentum, kEps, /*cudnn_enabled=*/true);
  if (s.residual) y.add_(t.residual);
  if (s.relu) y.relu_();
  return y;
}

void reference_forward_backward(const Shape& s, Tensors& t) {
  const torch::Tensor y = reference_forward(s, t);
  copy_in(t.dy, t.dy_source);
  std::vector<torch::Tensor> inputs{t.x, t.weight, t.bias};
  if (s.residual) inputs.push_back(t.residual);
  torch::autograd::grad({y}, inputs, {t.dy});
}

void fused_forward(const Shape& s, Tensors& t, const BnLayout& layout, float* workspace) {
  copy_in(t.x, t.x_source);
  hpc_train::BnForwardArgs args;
  args.x = t.x.data_ptr();
  args.residual = s.residual ? t.residual.data_ptr() : nullptr;
  args.y = t.y.data_ptr();
  args.relu = s.relu;
  args.param_dtype = hpc_train::KernelDtype::kFloat32;
  args.weight = t.weight.data_ptr();
  args.bias = t.bias.data_ptr();
  args.running_mean = t.running_mean.data_ptr();
  args.running_var = t.running_var.data_ptr();
  args.momentum = static_cast<float>(kMomentum);
  args.eps = static_cast<float>(kEps);
  args.save_mean = t.save_mean.data_ptr<float>();
  args.save_invstd = t.save_invstd.data_ptr<float>();
  args.workspace = workspace;
  hpc_train::launch_bn_forward(layout, args, at::cuda::getCurrentCUDAStream());
}

void fused_forward_backward(const Shape& s, Tensors& t, const BnLayout& layout,
                            float* workspace) {
  fused_forward(s, t, layout, workspace);
  copy_in(t.dy, t.dy_source);
  hpc_train::BnBackwardArgs args;
  args.dy = t.dy.data_ptr();
  args.y = t.y.data_ptr();
  args.x = t.x.data_ptr();
  args.relu = s.relu;
  args.param_dtype = hpc_train::KernelDtype::kFloat32;
  args.weight = t.weight.data_ptr();
  args.save_mean = t.save_mean.data_ptr<float>();
  args.save_invstd = t.save_invstd.data_ptr<float>();
  args.dx = t.dx.data_ptr();
  args.dresidual = s.residual ? t.dresidual.data_ptr() : nullptr;
  args.dweight = t.dweight.data_ptr();
  args.dbias = t.dbias.data_ptr();
  args.workspace = workspace;
  hpc_train::launch_bn_backward(layout, args, at::cuda::getCurrentCUDAStream());
}

struct Times {
  double forward_us = 0, backward_us = 0;
};

// The copies every timed pass starts with, timed alone once per shape.
struct Copies {
  explicit Copies(const Tensors& t)
      : x_us(replayed_us([&] { copy_in(t.x, t.x_source); })),
        x_and_dy_us(replayed_us([&] {
          copy_in(t.x, t.x_source);
          copy_in(t.dy, t.dy_source);
        })) {}
  double x_us, x_and_dy_us;
};

// Forward alone and forward then backward, each less its copies.
Times timed(const std::function<void()>& forward, const std::function<void()>& forward_backward,
            const Copies& copies) {
  Times times;
  times.forward_us = replayed_us(forward) - copies.x_us;
  times.backward_us = replayed_us(forward_backward) - copies.x_and_dy_us - times.forward_us;
  return times;
}

void sweep(const std::string& model) {
  const std::vector<Shape> shapes = shapes_of(model);
  const std::vector<BnLayoutLimits> layouts = variants();
  std::vector<Times> reference(shapes.size());
  std::vector<std::vector<Times>> fused(shapes.size(), std::vector<Times>(layouts.size()));
  std::vector<std::vector<BnLayout>> used(shapes.size());
  for (size_t i = 0; i < shapes.size(); ++i) {
    const Shape& s = shapes[i];
    Tensors t(s);
    const Copies copies(t);
    reference[i] = timed([&] { reference_forward(s, t); },
                         [&] { reference_forward_backward(s, t); }, copies);
    const int64_t rows = s.batch * s.pixels * s.pixels;
    std::map<decltype(grid_of(BnLayout{})), Times> seen;  // layouts that two variants share
    for (size_t v = 0; v < layouts.size(); ++v) {
      const BnLayout layout =
          hpc_train::bn_layout(rows, s.channels, hpc_train::KernelDtype::kBFloat16, layouts[v]);
      used[i].push_back(layout);
      const auto key = grid_of(layout);
      if (const auto it = seen.find(key); it != seen.end()) {
        fused[i][v] = it->second;
        continue;
      }
      const torch::Tensor workspace =
          torch::empty({layout.workspace_floats}, torch::dtype(torch::kFloat).device(torch::kCUDA));
      float* w = workspace.data_ptr<float>();
      fused[i][v] = seen[key] = timed([&] { fused_forward(s, t, layout, w); },
                                      [&] { fused_forward_backward(s, t, layout, w); }, copies);
    }
  }

  for (const bool backward : {false, true}) {
    std::printf("\n%s %s, us per batch norm (LibTorch, then the kernels per layout "
                "tile_vectors/rows_per_thread/blocks_per_sm)\n",
                model.c_str(), backward ? "backward" : "forward");
    std::printf("%-26s %3s %8s", "shape", "n", "torch");
    for (const BnLayoutLimits& v : layouts) std::printf(" %8s", label(v).c_str());
    std::printf("   best\n");
    const auto pass = [&](const Times& t) { return backward ? t.backward_us : t.forward_us; };
    double total_reference = 0, total_best = 0;
    std::vector<double> total(layouts.size(), 0.0);
    for (size_t i = 0; i < shapes.size(); ++i) {
      const int n = shapes[i].count;
      std::printf("%-26s %3d %8.1f", shapes[i].name().c_str(), n, pass(reference[i]));
      total_reference += n * pass(reference[i]);
      size_t best = 0;
      for (size_t v = 0; v < layouts.size(); ++v) {
        std::printf(" %8.1f", pass(fused[i][v]));
        total[v] += n * pass(fused[i][v]);
        if (pass(fused[i][v]) < pass(fused[i][best])) best = v;
      }
      total_best += n * pass(fused[i][best]);
      const BnLayout& l = used[i][best];
      std::printf("   %s (%lld x %d blocks, %d x %d threads)\n", label(layouts[best]).c_str(),
                  static_cast<long long>(l.row_blocks), l.channel_tiles, l.tile_vectors,
                  l.row_lanes);
    }
    std::printf("%-26s %3s %8.1f", "sum over the model", "", total_reference);
    for (double sum : total) std::printf(" %8.1f", sum);
    std::printf("   %.1f with the best per shape; default %.3fx LibTorch, best %.3fx\n",
                total_best, total[0] / total_reference, total_best / total_reference);
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string only = argc > 1 ? argv[1] : "";
    if (!only.empty() && only != "resnet18" && only != "resnet50") {
      std::fprintf(stderr, "usage: %s [resnet18|resnet50]\n", argv[0]);
      return 2;
    }
    if (!torch::cuda::is_available()) {
      std::fprintf(stderr, "bn_layout_sweep: no GPU\n");
      return 1;
    }
    torch::manual_seed(0);
    cudaDeviceProp properties{};
    cudaGetDeviceProperties(&properties, 0);
    std::printf("# %s, %d multiprocessors; %d passes per graph, %d replays\n", properties.name,
                properties.multiProcessorCount, kPassesPerGraph, kReplays);
    for (const std::string model : {"resnet18", "resnet50"})
      if (only.empty() || only == model) sweep(model);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bn_layout_sweep: %s\n", e.what());
    return 1;
  }
}
