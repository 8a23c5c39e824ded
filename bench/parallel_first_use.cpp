// Does the CUDA driver load library kernels on several threads at once? Run as
// `parallel_first_use serial|parallel` in fresh processes: after the context and one kernel,
// three groups of first uses with disjoint kernels (cuDNN convolutions at two shapes; LibTorch's
// loss, argmax, sort and scan; cuBLAS products) run one after another or on three threads, then
// once more on one thread (their cost without first uses). The answer decides Note [Training
// step warm-up] (trainer.cpp): on an H100 the groups took 0.44-0.63 s in series and 0.23-0.31 s
// on three threads (bench/results-h100-2026-12-05-startup.txt).
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

torch::TensorOptions on_gpu(torch::Dtype dtype = torch::kBFloat16) {
  return torch::TensorOptions().dtype(dtype).device(torch::kCUDA, 0);
}

void convolutions() {
  const torch::NoGradGuard no_grad;
  const auto nhwc = torch::MemoryFormat::ChannelsLast;
  for (int64_t batch : {64, 4096}) {
    torch::conv2d(torch::randn({batch, 32, 14, 14}, on_gpu()).contiguous(nhwc),
                  torch::randn({64, 32, 3, 3}, on_gpu()).contiguous(nhwc), {}, 1, 1);
    torch::conv2d(torch::randn({batch, 1, 28, 28}, on_gpu()).contiguous(nhwc),
                  torch::randn({32, 1, 3, 3}, on_gpu()).contiguous(nhwc), {}, 1, 1);
  }
  cudaDeviceSynchronize();
}

void reductions() {
  const torch::NoGradGuard no_grad;
  const torch::Tensor logits = torch::randn({4096, 10}, on_gpu(torch::kFloat));
  const torch::Tensor labels = torch::randint(0, 10, {4096}, on_gpu(torch::kLong));
  torch::nn::functional::cross_entropy(logits, labels);
  logits.argmax(1).eq(labels).sum();
  torch::sort(logits, 1);
  torch::cumsum(logits, 1);
  torch::topk(logits, 3, 1);
  torch::max_pool2d(torch::randn({8, 4, 8, 8}, on_gpu()), 2);
  cudaDeviceSynchronize();
}

void products() {
  const torch::NoGradGuard no_grad;
  torch::linear(torch::randn({64, 3136}, on_gpu()), torch::randn({512, 3136}, on_gpu()));
  torch::matmul(torch::randn({4096, 512}, on_gpu()), torch::randn({512, 10}, on_gpu()));
  torch::randn({64, 512}, on_gpu(torch::kFloat))
      .mm(torch::randn({512, 512}, on_gpu(torch::kFloat)));
  cudaDeviceSynchronize();
}

}  // namespace

int main(int argc, char** argv) {
  const bool parallel = argc > 1 && std::strcmp(argv[1], "parallel") == 0;
  const double start = now_s();
  torch::ones({1}, on_gpu()).add_(1);
  cudaDeviceSynchronize();
  const double context_ready = now_s();
  void (*const groups[])() = {convolutions, reductions, products};
  if (parallel) {
    std::vector<std::thread> threads;
    for (auto group : groups)
      threads.emplace_back([group] {
        const c10::cuda::CUDAGuard on_device(0);
        group();
      });
    for (std::thread& thread : threads) thread.join();
  } else {
    for (auto group : groups) group();
  }
  const double first_done = now_s();
  for (auto group : groups) group();
  const double again_done = now_s();
  std::printf("%s: context and one kernel %.3f s, the three groups' first uses %.3f s, "
              "again %.3f s\n",
              parallel ? "parallel" : "serial", context_ready - start, first_done - context_ready,
              again_done - first_done);
}
