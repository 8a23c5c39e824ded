// Test hooks: all of hpc_train that exists only for its tests, in one list (Note [Test hooks]):
// the environment switches that make one rank fail, stall or record what it trained on, and the
// entry points through which tests reach members that production code must not call. Torch-free.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace at {
class Tensor;
}  // namespace at

namespace hpc_train {

class DeviceInput;
struct HostBatch;
class ZeroOptimizer;
struct StepOutcome;
struct StepReport;
struct LossScalerState;

// Note [Test hooks]
// Some behaviour can only be tested by making the program do what a healthy run never does: fail
// on one rank at a chosen point, hold a GPU up, write down what it trained on, take an optimizer
// step by hand. All of it is listed here, so that a reader sees what a real run never touches.
// Each switch is read in this unit and nowhere else. The members reached through TestHooks are
// private in their classes, which declare TestHooks a friend, so that production code cannot
// call them by accident.
//
// Environment switches. Unset in every real run; mpirun passes them to every rank. A value that
// cannot be meant (a fault at no known point, a rank that is not a number, a trace file that
// cannot be opened) is an error, so that a test cannot pass by a typo.
//   HPC_TRAIN_TEST_FAULT=KIND@RANK      test_fault(): rank RANK fails at the point KIND, the
//                                       way the real fault fails there (below).
//                                       tests/test_startup_faults.sh, test_capture_failure.sh
//   HPC_TRAIN_TEST_STALL_REPLAY_RANK=R  test_stall_replay_rank(): before rank R's first CUDA-graph
//                                       replay (step_graph_cuda.cpp), a kernel holds its training
//                                       stream up for kTestStallReplayS and then ends (the GPU is
//                                       never held for good), as if a peer never joined a
//                                       collective of the step: the replay cannot finish within a
//                                       shorter --comm-timeout. tests/test_graph_replay_timeout.sh
//   HPC_TRAIN_TEST_SAMPLE_TRACE=PREFIX  SampleTrace: every rank appends the samples of each
//                                       micro-batch to PREFIX.<rank>. tests/test_data_store.sh,
//                                       test_resume_reshape.sh
// The other HPC_TRAIN_TEST_* variables (HPC_TRAIN_TEST_DEVICE, _SEED, _WORK, ...) belong to the
// tests' harness (tests/); hpc_train never reads them.
//
// HPC_TRAIN_TEST_FAULT. What one rank's failure does to the job (Note [Ending the job] in
// runtime.h) can only be shown by making one rank, and only it, fail where the others are busy
// elsewhere, e.g. waiting in a collective. KIND is one of:
//   init-weights     the --init-weights file is missing on that rank (the real read fails)
//   alloc            an allocation larger than any node's memory (the real allocator refuses)
//   resident-upload  the upload of the resident splits fails on its thread
//   capture          a backward captured into a CUDA graph fails half-way (reducer.h)
//
// Test-only members, reached through TestHooks (each defined next to the state it reaches):
//   TestHooks::fill               DeviceInput: prepare() then take_into() in one call, the
//                                 batch and tensors checked first. test_device_input
//   TestHooks::step               ZeroOptimizer: one step with the host's learning rate and
//                                 loss scale, not the owned schedule and scaler's; gradients not
//                                 zeroed. test_zero, test_gradient_precision, test_fused_optimizer
//   TestHooks::step_on_device     ZeroOptimizer (GPU): that step with the device's schedule and
//                                 scaler; gradients not zeroed. test_fused_optimizer
//   TestHooks::read_device_report ZeroOptimizer (GPU): the device's counters, without report()'s
//                                 check of the scaler. test_fused_optimizer
//   TestHooks::load_device_state  ZeroOptimizer (GPU): resume() of the device's counters and
//                                 scaler alone. test_fused_optimizer
//   TestHooks::loss_scale_tensor  ZeroOptimizer (GPU): the device scaler's current scale.
//                                 test_fused_optimizer
// Test-only, outside this unit:
//   launch_gpu_stall (train/gpu_stall.h)  the kernel behind HPC_TRAIN_TEST_STALL_REPLAY_RANK;
//                                         CUDA, so in a GPU-only unit of its own.
//   PeerProbe::close_for_test (comm/peer_probe.h, public)  a rank that stops answering.
//                                         test_peer_probe

// HPC_TRAIN_TEST_FAULT: whether the fault `kind` is asked of `rank`. Throws Error for a value
// that is not KIND@RANK with a KIND listed above.
bool test_fault(const char* kind, int rank);

// HPC_TRAIN_TEST_STALL_REPLAY_RANK: the rank whose first graph replay stalls, or -1 where the
// switch is unset (every real run). Throws Error for a value that is not a rank number.
int test_stall_replay_rank();
// How long that replay is held up: far longer than the test's --comm-timeout.
constexpr double kTestStallReplayS = 30.0;
// The line tests/test_graph_replay_timeout.sh measures from, on stderr: the replay `label`
// ("step 12") held up on `rank`, and when the stall begins (ms since the epoch).
void announce_test_stall_replay(int rank, const std::string& label);

// HPC_TRAIN_TEST_SAMPLE_TRACE: one line per micro-batch, appended to PREFIX.<rank>: the epoch,
// the optimizer step the micro-batch counts towards, then its dataset indices. The resume tests
// compare what runs saw (Note [Resume position] in checkpoint.h); nothing else reads it.
class SampleTrace {
 public:
  explicit SampleTrace(int rank);  // throws Error when the file cannot be opened
  ~SampleTrace();
  SampleTrace(const SampleTrace&) = delete;
  SampleTrace& operator=(const SampleTrace&) = delete;

  bool on() const { return file_ != nullptr; }
  void write(int64_t epoch, int64_t step, const std::vector<int64_t>& indices);

 private:
  std::FILE* file_ = nullptr;
};

// The test-only members of the list above; the classes are complete where tests call these.
struct TestHooks {
  // Throws Error for a batch of another size than the static buffers, or tensors of another
  // shape, dtype or device, and then leaves nothing prepared.
  static void fill(DeviceInput& input, const HostBatch& batch, int64_t epoch,
                   at::Tensor& static_input, at::Tensor& static_labels);

  // ZeroOptimizer (zero_optimizer.h says what each step reads and does). Collective.
  static StepOutcome step(ZeroOptimizer& optimizer, double lr, double loss_scale);
  static void step_on_device(ZeroOptimizer& optimizer);
  static StepReport read_device_report(const ZeroOptimizer& optimizer);
  static void load_device_state(ZeroOptimizer& optimizer, int64_t global_step,
                                int64_t adam_steps, const LossScalerState& scaler);
  // A 1-element fp32 tensor on the GPU, updated by every step on the device; undefined on the CPU.
  static const at::Tensor& loss_scale_tensor(const ZeroOptimizer& optimizer);
};

}  // namespace hpc_train
