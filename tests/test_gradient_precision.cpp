// Note [Gradient precision] (flat_parameters.h): --grad-accum-dtype fp32 and --comm-dtype fp32
// with a bf16 or fp16 model, at 1 and 3 ranks. One accumulation window of 8 micro-steps goes
// through the reducer as training sends it (autograd's hooks, buckets, the collectives of ZeRO 0
// and of ZeRO 2's reduce-scatter); what the optimizer then reads is compared with what the fp32
// run of the same micro-steps reads. The fp32 path must be clearly closer than the 16-bit one.
// Also: fp16's overflow check sees the fp32 sum, fp32 runs are unchanged bit for bit, the memory
// figures count the fp32 buffers, and the options reach the reducer through the trainer.
//
// On the CPU here; with HPC_TRAIN_TEST_DEVICE=cuda (ctest -L gpu) on the GPU, through NCCL for
// one rank and the MPI backend for three ranks sharing it.
#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "hpc_train/comm/comm.h"
#include "hpc_train/comm/reducer.h"
#include "hpc_train/data/dataset_file.h"
#include "hpc_train/comm/flat_parameters.h"
#include "hpc_train/optim/zero_optimizer.h"
#include "hpc_train/runtime/runtime.h"
#include "hpc_train/runtime/test_hooks.h"
#include "hpc_train/train/run_options.h"
#include "hpc_train/train/trainer.h"
#include "synthetic_dataset.h"
#include "test_device.h"

namespace {

using namespace hpc_train;

constexpr int kMicroSteps = 8;  // --grad-accum 8

// Parameter counts not divisible by 3, small buckets: every bucket is padded and split.
const std::vector<std::pair<std::string, std::vector<int64_t>>> kParameters = {
    {"conv.weight", {16, 3, 3, 3}}, {"conv.bias", {16}}, {"fc.weight", {10, 97}},
    {"fc.bias", {10}}};

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

torch::Device test_device() {
  return test_support::testing_on_gpu() ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
}

// NCCL takes one rank per GPU: a world of one on the GPU uses it, three ranks sharing the GPU use
// the MPI backend, as hpc_train's placement does.
CommBackendKind test_backend() {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return test_support::testing_on_gpu() && size == 1 ? CommBackendKind::kNccl
                                                     : CommBackendKind::kMpi;
}

// One micro-step's data for every parameter, fp32: its gradient (loss = sum_i (p_i * c_i).sum(),
// in fp32 as the trainer's cross-entropy is) is c_i times the loss gradient, rounded once to the
// model's dtype where autograd leaves the fp32 loss for the 16-bit parameters. Like real micro-batches' gradients, the micro-steps share a
// mean (the same on every rank) and differ by noise of the same size (each rank's own); the
// parameters' scales differ by 100x.
std::vector<std::vector<torch::Tensor>> micro_step_inputs(int rank) {
  std::vector<torch::Tensor> means;
  torch::manual_seed(7);
  double scale = 1e-3;
  for (const auto& parameter : kParameters) {
    means.push_back(torch::randn(parameter.second) * scale);
    scale *= 4.7;
  }
  torch::manual_seed(1000 + rank);
  std::vector<std::vector<torch::Tensor>> inputs(kMicroSteps);
  for (int k = 0; k < kMicroSteps; ++k)
    for (const torch::Tensor& mean : means)
      inputs[k].push_back(mean + torch::randn(mean.sizes()) * mean.abs().mean());
  return inputs;
}

struct Window {
  torch::Tensor gradients;  // what the optimizer reads, all ranks' partitions, logical, fp64
  int64_t gradient_bytes = 0;
  int64_t total_numel = 0;
  int64_t partition_numel = 0;
  int64_t staging_numel = 0;  // partitioned: each staging buffer's elements
  at::ScalarType grad_dtype = at::kFloat;
  StepOutcome outcome;  // of the step after the window, when asked for
};

// One accumulation window of `inputs` in a `dtype` model: an fp32 loss and the trainer's loss
// gradient (the loss scale / (ranks x micro-steps), Note [Gradient averaging]), the reducer's
// hooks and buckets, and optionally one optimizer step.
Window run_window(Communicator& comm, at::ScalarType dtype, GradientPrecision precision, int stage,
                  const std::vector<std::vector<torch::Tensor>>& inputs, double loss_scale = 1.0,
                  bool step = false, bool check_overflow = false) {
  const torch::TensorOptions options = torch::TensorOptions().dtype(dtype).device(test_device());
  std::vector<std::string> names;
  std::vector<at::Tensor> parameters;
  for (const auto& [name, sizes] : kParameters) {
    names.push_back(name);
    parameters.push_back(torch::zeros(sizes, options).requires_grad_());
  }
  ReducerOptions reducer_options;
  reducer_options.first_bucket_bytes = 512;
  reducer_options.bucket_bytes = 2048;
  reducer_options.reduction = reduction_for_zero_stage(stage);
  reducer_options.precision = precision;
  BucketLayout layout = Reducer::initial_layout(parameters, reducer_options, comm.size());
  FlatParameters flat(names, parameters, std::move(layout));
  Reducer reducer(flat, comm, reducer_options);
  ZeroOptions zero;
  zero.stage = stage;
  zero.check_overflow = check_overflow;
  ZeroOptimizer optimizer(flat, reducer, comm, zero);

  const double averaging = loss_scale / (comm.size() * static_cast<double>(inputs.size()));
  for (size_t k = 0; k < inputs.size(); ++k) {
    reducer.begin_backward(/*sync=*/k + 1 == inputs.size());
    const torch::TensorOptions fp32 = options.dtype(torch::kFloat);
    torch::Tensor loss = torch::zeros({}, fp32);
    for (size_t i = 0; i < parameters.size(); ++i)
      loss = loss + (parameters[i].to(torch::kFloat) * inputs[k][i].to(fp32)).sum();
    loss.backward(torch::full({}, averaging, fp32));
    reducer.finish_backward();
  }

  Window window;
  window.gradient_bytes = reducer.gradient_bytes();
  window.total_numel = flat.layout().total_numel;
  window.partition_numel = flat.layout().partition_numel;
  window.staging_numel = reducer.staging_numel();
  at::Tensor full = flat.grads();
  if (stage == 2 && comm.size() > 1) {
    // Every rank's partition into one flat tensor (Note [Bucket layout]).
    const at::Tensor& partition = reducer.partition_grads();
    full = torch::zeros({flat.layout().total_numel}, partition.options());
    for (size_t b = 0; b < flat.layout().spans.size(); ++b) {
      const BucketLayout::Span& span = flat.layout().spans[b];
      full.narrow(0, span.offset + comm.rank() * span.slice_numel, span.slice_numel)
          .copy_(partition.narrow(0, span.partition_offset, span.slice_numel));
      at::Tensor bucket = flat.bucket_view(full, b);
      comm.all_gather_in_place(bucket).wait();
    }
  }
  window.grad_dtype = full.scalar_type();
  window.gradients = flat.to_logical(full).to(torch::kDouble).cpu();
  if (step) window.outcome = TestHooks::step(optimizer, 1e-3, loss_scale);
  return window;
}

double relative_error(const torch::Tensor& got, const torch::Tensor& want) {
  return ((got - want).norm() / want.norm()).item<double>();
}

std::string precision_name(at::ScalarType dtype) { return dtype == at::kHalf ? "fp16" : "bf16"; }

bool fp16_runs_here() {
  // LibTorch 1.13 has half-precision arithmetic on the CPU for what this test does (mul, sum);
  // a LibTorch without it is told apart here rather than failing the test.
  try {
    const torch::Tensor p = torch::ones({3}, torch::TensorOptions().dtype(torch::kHalf).device(test_device())).requires_grad_();
    (p * p).sum().backward();
    return p.grad().defined();
  } catch (const c10::Error&) {
    return false;
  }
}

class GradientPrecisionTest : public ::testing::TestWithParam<at::ScalarType> {};

// The errors against the fp32 run, printed for each path, at ZeRO 0 (all-reduce into the flat
// buffer) and ZeRO 2 (reduce-scatter into the partition).
TEST_P(GradientPrecisionTest, Fp32AccumulationAndReductionAreCloserToTheFp32Run) {
  const at::ScalarType dtype = GetParam();
  if (dtype == at::kHalf && !fp16_runs_here()) GTEST_SKIP() << "no fp16 arithmetic on this device";
  Communicator comm(MPI_COMM_WORLD, test_backend(), 0);
  const std::vector<std::vector<torch::Tensor>> inputs = micro_step_inputs(comm.rank());
  const double loss_scale = dtype == at::kHalf ? 1024.0 : 1.0;  // fp16's scaled loss
  const std::string what = precision_name(dtype) + ", " + std::to_string(comm.size()) +
                           " rank(s), --grad-accum " + std::to_string(kMicroSteps);
  for (int stage : {0, 2}) {
    const Window fp32_run = run_window(comm, at::kFloat, {}, stage, inputs, loss_scale);
    const Window sixteen = run_window(comm, dtype, {false, false}, stage, inputs, loss_scale);
    const Window accumulate = run_window(comm, dtype, {true, false}, stage, inputs, loss_scale);
    const Window reduce = run_window(comm, dtype, {false, true}, stage, inputs, loss_scale);
    const Window both = run_window(comm, dtype, {true, true}, stage, inputs, loss_scale);
    const double error_16 = relative_error(sixteen.gradients, fp32_run.gradients);
    const double error_accumulate = relative_error(accumulate.gradients, fp32_run.gradients);
    const double error_reduce = relative_error(reduce.gradients, fp32_run.gradients);
    const double error_fp32 = relative_error(both.gradients, fp32_run.gradients);
    if (comm.rank() == 0)
      std::printf("gradient error vs the fp32 run (%s, ZeRO %d): 16-bit accumulation and "
                  "reduction %.3e; fp32 accumulation only %.3e; fp32 reduction only %.3e; fp32 "
                  "accumulation and reduction %.3e (%.1fx smaller)\n",
                  what.c_str(), stage, error_16, error_accumulate, error_reduce, error_fp32,
                  error_16 / error_fp32);
    // The 16-bit path's error is mostly its rounding of the running sums; the fp32 path keeps
    // only the rounding of each micro-step's own 16-bit gradient.
    EXPECT_LT(error_fp32, error_16 / 3) << what << ", ZeRO " << stage;
    EXPECT_LT(error_accumulate, error_16) << what << ", ZeRO " << stage;
    EXPECT_EQ(sixteen.grad_dtype, dtype);
    // Rounded once, for the 16-bit collective; but partitioned, each micro-step is reduced in 16
    // bits and the partition adds them up in fp32 (Note [Partitioned gradients]).
    const bool partitioned = stage == 2 && comm.size() > 1;
    EXPECT_EQ(accumulate.grad_dtype, partitioned ? at::kFloat : dtype);
    EXPECT_EQ(reduce.grad_dtype, at::kFloat);
    EXPECT_EQ(both.grad_dtype, at::kFloat);
  }
}

// Note [Gradient precision]: the buffers' bytes, which the memory figures report
// (Reducer::gradient_bytes -> MemoryBytes::gradients): 4 bytes an element for fp32 gradients and
// for a separate fp32 accumulation buffer, 2 for 16-bit ones. With several ranks ZeRO 2 keeps no
// flat buffer but its partition (fp32 where either option is) and two staging buckets in the
// dtype the collectives move (Note [Partitioned gradients]).
TEST_P(GradientPrecisionTest, MemoryFiguresCountTheFp32Buffers) {
  const at::ScalarType dtype = GetParam();
  if (dtype == at::kHalf && !fp16_runs_here()) GTEST_SKIP() << "no fp16 arithmetic on this device";
  Communicator comm(MPI_COMM_WORLD, test_backend(), 0);
  const std::vector<std::vector<torch::Tensor>> inputs = micro_step_inputs(comm.rank());
  for (int stage : {0, 2}) {
    const bool partitioned = stage == 2 && comm.size() > 1;
    for (const GradientPrecision precision :
         {GradientPrecision{false, false}, GradientPrecision{true, false},
          GradientPrecision{false, true}, GradientPrecision{true, true}}) {
      const Window w = run_window(comm, dtype, precision, stage, inputs);
      const int64_t grad_bytes = precision.reduce_fp32 ? 4 : 2;
      const int64_t separate_sum = precision.accumulate_fp32 && !precision.reduce_fp32 ? 4 : 0;
      const int64_t partition_bytes = precision.accumulate_fp32 || precision.reduce_fp32 ? 4 : 2;
      EXPECT_EQ(w.gradient_bytes,
                partitioned ? w.partition_numel * partition_bytes + 2 * w.staging_numel * grad_bytes
                            : w.total_numel * (grad_bytes + separate_sum))
          << "ZeRO " << stage << ", accumulate fp32 " << precision.accumulate_fp32
          << ", reduce fp32 " << precision.reduce_fp32;
      if (comm.rank() == 0 && stage == 2)
        std::printf("%s gradient bytes per rank at %d rank(s), ZeRO 2, accumulate %s, reduce %s: "
                    "%lld (%lld flat elements)\n",
                    precision_name(dtype).c_str(), comm.size(),
                    precision.accumulate_fp32 ? "fp32" : "model",
                    precision.reduce_fp32 ? "fp32" : "model",
                    static_cast<long long>(w.gradient_bytes),
                    static_cast<long long>(w.total_numel));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Precisions, GradientPrecisionTest,
                         ::testing::Values(at::kBFloat16, at::kHalf),
                         [](const ::testing::TestParamInfo<at::ScalarType>& info) {
                           return precision_name(info.param);
                         });

// fp16's overflow check (ZeroOptions::check_overflow, agreed by all ranks) looks at what the
// optimizer reads. Eight micro-steps of 10,000 sum to 80,000 on each rank: beyond fp16's 65,504,
// so the 16-bit path overflows and skips the step, while the fp32 sum is finite and the step is
// taken, as in the fp32 run. With a 16-bit reduction the fp32 sum is rounded into fp16 and
// overflows there; except where ZeRO 2 partitions the gradients, which reduces each micro-step
// (30,000 at 3 ranks, in range) and adds them up in the fp32 partition (Note [Partitioned
// gradients]). A real inf in one micro-step of one rank still skips the step everywhere.
TEST(GradientPrecisionOverflow, Fp16OverflowCheckSeesTheFp32Sum) {
  if (!fp16_runs_here()) GTEST_SKIP() << "no fp16 arithmetic on this device";
  Communicator comm(MPI_COMM_WORLD, test_backend(), 0);
  std::vector<std::vector<torch::Tensor>> inputs(kMicroSteps);
  for (auto& step : inputs)
    for (const auto& parameter : kParameters) step.push_back(torch::full(parameter.second, 10000.0));
  // The averaging would divide the sum back into range: the loss scale undoes it here.
  const double scale = comm.size() * static_cast<double>(kMicroSteps);
  for (int stage : {0, 2}) {
    const std::string what = "ZeRO " + std::to_string(stage);
    EXPECT_TRUE(run_window(comm, at::kHalf, {false, false}, stage, inputs, scale, true, true)
                    .outcome.overflow)
        << what;
    const bool partitioned = stage == 2 && comm.size() > 1;
    EXPECT_EQ(run_window(comm, at::kHalf, {true, false}, stage, inputs, scale, true, true)
                  .outcome.overflow,
              !partitioned)
        << what << (partitioned ? ": the partition's fp32 sum is finite"
                                : ": the fp32 sum rounded into fp16 is inf");
    const StepOutcome fp32_path =
        run_window(comm, at::kHalf, {true, true}, stage, inputs, scale, true, true).outcome;
    const StepOutcome fp32_run =
        run_window(comm, at::kFloat, {}, stage, inputs, scale, true, true).outcome;
    EXPECT_FALSE(fp32_path.overflow) << what;
    EXPECT_FALSE(fp32_run.overflow) << what;
    EXPECT_NEAR(fp32_path.grad_norm, fp32_run.grad_norm, 1e-6 * fp32_run.grad_norm) << what;

    std::vector<std::vector<torch::Tensor>> with_inf = inputs;
    if (comm.rank() == comm.size() - 1) {
      with_inf[3][1] = with_inf[3][1].clone();  // the vectors' tensors are shared with `inputs`
      with_inf[3][1][5] = std::numeric_limits<float>::infinity();
    }
    EXPECT_TRUE(run_window(comm, at::kHalf, {true, true}, stage, with_inf, scale, true, true)
                    .outcome.overflow)
        << what << ": rank " << comm.rank() << " must learn of the inf";
  }
}

// In an fp32 model both options are what happens anyway: the same layout, the same buffers and
// the same gradients, bit for bit.
TEST(GradientPrecisionFp32, Fp32RunsAreUnchangedBitForBit) {
  Communicator comm(MPI_COMM_WORLD, test_backend(), 0);
  const std::vector<std::vector<torch::Tensor>> inputs = micro_step_inputs(comm.rank());
  for (int stage : {0, 2}) {
    const Window plain = run_window(comm, at::kFloat, {false, false}, stage, inputs, 1.0, true);
    const Window asked = run_window(comm, at::kFloat, {true, true}, stage, inputs, 1.0, true);
    EXPECT_TRUE(torch::equal(plain.gradients, asked.gradients)) << "ZeRO " << stage;
    EXPECT_EQ(plain.total_numel, asked.total_numel);
    EXPECT_EQ(plain.gradient_bytes, asked.gradient_bytes);
    EXPECT_EQ(plain.outcome.grad_norm, asked.outcome.grad_norm);
  }
}

// The options reach the reducer as the trainer builds it (run_options.h): fp32 accumulation only
// where there is something to accumulate.
TEST(GradientPrecisionOptions, ReducerOptionsFromTheConfig) {
  TrainConfig config;
  config.precision = Precision::kBf16;
  EXPECT_FALSE(reducer_options(config, 1, 1000).precision.accumulate_fp32);
  EXPECT_FALSE(reducer_options(config, 1, 1000).precision.reduce_fp32);
  config.grad_accum_dtype = GradientDtype::kFp32;
  config.comm_dtype = GradientDtype::kFp32;
  EXPECT_FALSE(reducer_options(config, 1, 1000).precision.accumulate_fp32) << "--grad-accum 1";
  EXPECT_TRUE(reducer_options(config, 1, 1000).precision.reduce_fp32);
  config.grad_accum = 4;
  EXPECT_TRUE(reducer_options(config, 1, 1000).precision.accumulate_fp32);
}

// End to end through the trainer: bf16 simple_cnn, ZeRO 2, --grad-accum 4, both options fp32.
// Trains, reports the fp32 buffers in its memory figures, and every rank holds the same
// parameters. Its distance from the fp32 run is printed (the bf16 forward and backward dominate
// it; the gradients' own error is measured above).
TEST(GradientPrecisionTraining, TrainerRunsWithFp32GradientsInBf16) {
  Communicator world(MPI_COMM_WORLD);
  std::string path;
  if (world.rank() == 0) {
    path = test_support::make_test_directory("gradient_precision") + "/data.h5";
    test_support::SyntheticShape shape;
    shape.train = 480;
    test_support::write_synthetic_dataset(path, shape, 5);
  }
  path = broadcast_string(MPI_COMM_WORLD, path, 0);
  MPI_Barrier(MPI_COMM_WORLD);
  {
    DatasetFile file = DatasetFile::open(path);
    const auto train = [&](Precision precision, GradientDtype dtypes, MemoryBytes* memory) {
      TrainConfig config;
      config.dataset_path = path;
      config.micro_batch = 4;
      config.grad_accum = 4;
      config.epochs = 1;
      config.max_steps = 6;
      config.log_every = 1000;
      config.seed = 3;
      config.zero_stage = 2;
      config.bucket_mb = 0.05;
      config.first_bucket_mb = 0.01;
      config.precision = precision;
      config.grad_accum_dtype = dtypes;
      config.comm_dtype = dtypes;
      const Placement placement = test_support::test_placement(config, MPI_COMM_WORLD);
      Trainer trainer(config, file, MPI_COMM_WORLD, TrainerOutput{"", false, false}, placement);
      const TrainSummary summary = trainer.run();
      EXPECT_EQ(summary.steps, 6);
      EXPECT_TRUE(std::isfinite(summary.final_train_loss));
      if (memory) *memory = trainer.memory();
      return trainer.flat_parameters().to(torch::kFloat);
    };
    MemoryBytes sixteen_memory;
    MemoryBytes fp32_memory;
    const torch::Tensor reference = train(Precision::kFp32, GradientDtype::kModel, nullptr);
    const torch::Tensor sixteen = train(Precision::kBf16, GradientDtype::kModel, &sixteen_memory);
    const torch::Tensor fp32 = train(Precision::kBf16, GradientDtype::kFp32, &fp32_memory);
    torch::Tensor root = fp32.clone();
    world.broadcast(root, 0).wait();
    EXPECT_TRUE(torch::equal(root, fp32)) << "every rank holds the same parameters";
    // fp32 gradients take twice the 16-bit ones' bytes; the buckets hold half as many elements,
    // so the padding differs a little. Partitioned (Note [Partitioned gradients]), the partition
    // doubles and the two staging buffers stay, a bucket cap of bytes each.
    const double parameters = static_cast<double>(fp32.numel());
    if (world.size() == 1)
      EXPECT_NEAR(static_cast<double>(fp32_memory.gradients),
                  2.0 * static_cast<double>(sixteen_memory.gradients),
                  0.02 * static_cast<double>(sixteen_memory.gradients));
    else
      EXPECT_NEAR(static_cast<double>(fp32_memory.gradients - sixteen_memory.gradients),
                  2.0 * parameters / world.size(), 0.02 * 2.0 * parameters / world.size());
    EXPECT_NEAR(static_cast<double>(fp32_memory.optimizer_state),
                static_cast<double>(sixteen_memory.optimizer_state),
                0.01 * static_cast<double>(sixteen_memory.optimizer_state));  // padding only
    if (world.rank() == 0)
      std::printf("trainer, bf16, ZeRO 2, --grad-accum 4, %d rank(s): parameters' distance from "
                  "the fp32 run after 6 steps: 16-bit gradients %.3e, fp32 gradients %.3e; "
                  "gradient bytes per rank %lld -> %lld\n",
                  world.size(), relative_error(sixteen, reference),
                  relative_error(fp32, reference),
                  static_cast<long long>(sixteen_memory.gradients),
                  static_cast<long long>(fp32_memory.gradients));
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (world.rank() == 0)
    test_support::remove_directory(path.substr(0, path.rfind('/')));
}

// On the GPU (one rank, NCCL): --comm-dtype fp32 with --grad-accum 1 keeps steps capturable, and
// the fused optimizer kernels read the fp32 gradients of the bf16 model (fused_optimizer.h): the
// replayed steps compute what eager steps compute, at ZeRO 0 and 2.
TEST(GradientPrecisionGraphs, CapturedStepsWithFp32ReductionMatchEagerSteps) {
  if (!test_support::testing_on_gpu()) GTEST_SKIP() << "CUDA graphs need the GPU (ctest -L gpu)";
  if (Communicator(MPI_COMM_WORLD).size() != 1)
    GTEST_SKIP() << "graphs need NCCL, which takes one rank per GPU";
  const std::string path = test_support::make_test_directory("gradient_precision_graphs") + "/data.h5";
  test_support::SyntheticShape shape;
  shape.train = 480;
  test_support::write_synthetic_dataset(path, shape, 5);
  {
    DatasetFile file = DatasetFile::open(path);
    at::globalContext().setDeterministicCuDNN(true);
    for (int stage : {0, 2}) {
      const auto run = [&](Switch graph) {
        TrainConfig config;
        config.dataset_path = path;
        config.micro_batch = 4;
        config.epochs = 1;
        config.max_steps = 20;
        config.log_every = 1000;
        config.seed = 3;
        config.zero_stage = stage;
        config.precision = Precision::kBf16;
        config.comm_dtype = GradientDtype::kFp32;
        config.cuda_graph = graph;
        const Placement placement = test_support::test_placement(config, MPI_COMM_WORLD);
        Trainer trainer(config, file, MPI_COMM_WORLD, TrainerOutput{"", false, false}, placement);
        const TrainSummary summary = trainer.run();
        EXPECT_EQ(summary.steps, 20);
        EXPECT_EQ(summary.graph_replays > 0, graph == Switch::kOn) << "ZeRO " << stage;
        return trainer.flat_parameters().to(torch::kFloat);
      };
      const torch::Tensor eager = run(Switch::kOff);
      const torch::Tensor graphed = run(Switch::kOn);
      const double difference = relative_error(graphed, eager);
      std::printf("graph replay vs eager, bf16 with fp32 reduction, ZeRO %d: relative difference "
                  "%.3e\n", stage, difference);
      EXPECT_LE(difference, 2e-3) << "ZeRO " << stage;
    }
    at::globalContext().setDeterministicCuDNN(false);
  }
  test_support::remove_directory(path.substr(0, path.rfind('/')));
}

}  // namespace
