// CUDA's execution model on the CPU, for kernels compiled as host code (a kernels header such as
// fused_batch_norm_kernels.cuh, included after this one): the CPU build's tests run them and
// check their arithmetic, indexing and the cooperation of a block's threads, which the GPU tests
// alone would otherwise see. emulate_launch runs the grid's blocks one after another on a pool
// of std::threads, one per CUDA thread of a block. A block's __shared__ arrays are static (one
// block runs at a time); __syncthreads is a barrier of the block's threads, __shfl_down_sync one
// of the warp's. What it cannot show: blocks running at once (they run in order, so the last
// block to arrive is the grid's last), memory ordering, and speed.
//
// The CUDA headers are included first: in host code they turn __global__, __shared__ and
// __launch_bounds__ into attributes that GCC ignores, which this header then replaces.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <vector_types.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#undef __global__
#define __global__
#undef __shared__
#define __shared__ static
#undef __launch_bounds__
#define __launch_bounds__(threads)

namespace hpc_train::emulation {

// A reusable barrier for `count` threads; a thread that leaves (its kernel returned) drops out
// of it, as an exited CUDA thread no longer takes part in __syncthreads.
class Barrier {
 public:
  void reset(int count) { expected_ = count; }
  void arrive_and_wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    const uint64_t generation = generation_;
    if (++arrived_ >= expected_) {
      release();
      return;
    }
    released_.wait(lock, [&] { return generation_ != generation; });
  }
  void drop() {
    std::unique_lock<std::mutex> lock(mutex_);
    --expected_;
    if (arrived_ > 0 && arrived_ >= expected_) release();
  }

 private:
  void release() {
    arrived_ = 0;
    ++generation_;
    released_.notify_all();
  }
  std::mutex mutex_;
  std::condition_variable released_;
  int expected_ = 0, arrived_ = 0;
  uint64_t generation_ = 0;
};

constexpr int kWarpSize = 32;

struct BlockState {
  Barrier block;
  std::vector<Barrier> warps;
  std::vector<float> exchange;  // one slot per thread, for the warp shuffles
};

inline BlockState& block_state() {
  static BlockState state;
  return state;
}

}  // namespace hpc_train::emulation

inline thread_local uint3 threadIdx;
inline uint3 blockIdx;
inline dim3 blockDim;
inline dim3 gridDim;

inline void __syncthreads() { hpc_train::emulation::block_state().block.arrive_and_wait(); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline unsigned atomicAdd(unsigned* address, unsigned value) {
  return __atomic_fetch_add(address, value, __ATOMIC_SEQ_CST);
}
inline float4 __ldcg(const float4* address) { return *address; }
inline float rsqrtf(float x) { return 1.f / std::sqrt(x); }
using std::min;

// Every lane of the warp calls it, as in the kernels (a warp exits whole or not at all).
inline float __shfl_down_sync(unsigned /*mask*/, float value, int offset) {
  hpc_train::emulation::BlockState& state = hpc_train::emulation::block_state();
  const int lane = static_cast<int>(threadIdx.x) % hpc_train::emulation::kWarpSize;
  hpc_train::emulation::Barrier& warp =
      state.warps[threadIdx.x / hpc_train::emulation::kWarpSize];
  state.exchange[threadIdx.x] = value;
  warp.arrive_and_wait();
  const float result = lane + offset < hpc_train::emulation::kWarpSize
                           ? state.exchange[threadIdx.x + offset]
                           : value;
  warp.arrive_and_wait();
  return result;
}

namespace hpc_train::emulation {

// Runs kernel(args...) over `grid` blocks of `threads` threads (a multiple of the warp size),
// block after block, and returns when the last has finished. The block's threads are a pool of
// std::threads that go through the blocks together.
template <typename Kernel, typename... Args>
void emulate_launch(dim3 grid, int threads, Kernel kernel, Args... args) {
  gridDim = grid;
  blockDim = dim3(static_cast<unsigned>(threads));
  BlockState& state = block_state();
  state.warps = std::vector<Barrier>(static_cast<size_t>(threads / kWarpSize));
  state.exchange.assign(static_cast<size_t>(threads), 0.f);
  std::vector<uint3> blocks;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) blocks.push_back(uint3{x, y, z});
  Barrier pool_barrier;  // between blocks: every thread of the pool, none dropping
  pool_barrier.reset(threads);
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(threads));
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      threadIdx = uint3{static_cast<unsigned>(t), 0, 0};
      for (const uint3& block : blocks) {
        pool_barrier.arrive_and_wait();  // the previous block is done in every thread
        if (t == 0) {
          blockIdx = block;
          state.block.reset(threads);
          for (Barrier& warp : state.warps) warp.reset(kWarpSize);
        }
        pool_barrier.arrive_and_wait();
        kernel(args...);
        state.block.drop();
      }
    });
  for (std::thread& thread : pool) thread.join();
}

}  // namespace hpc_train::emulation
