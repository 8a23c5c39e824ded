// ZeRO stages (with every update rule's state: LAMB's and LARS's per-parameter norms span the
// ranks), gradient accumulation, clipping, overlap and fp16 overflow agreement, at 1, 2 and
// 3 ranks on the CPU (fp32): every variant must end with the parameters of the single-rank run
// with the global batch (relative difference <= 1e-5 after 20 steps), on simple_cnn over 1x8x8
// images, whose 155,530 parameters are not divisible by 3, with small buckets so that every
// bucket is padded.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>

#include "hpc_train/comm/comm.h"
#include "hpc_train/comm/reducer.h"
#include "hpc_train/runtime/runtime.h"
#include "hpc_train/runtime/test_hooks.h"
#include "hpc_train/train/trainer.h"
#include "hpc_train/optim/zero_optimizer.h"
#include "synthetic_dataset.h"
#include "test_device.h"

namespace {

using namespace hpc_train;

constexpr int kSteps = 20;
constexpr int kMicroBatch = 4;

class ZeroTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    std::string path;
    if (rank == 0) {
      path = test_support::make_test_directory("zero") + "/data.h5";
      test_support::SyntheticShape shape;
      shape.train = 480;  // divisible by 4 * {1, 2, 3} * 2: no padding in 20 steps
      test_support::write_synthetic_dataset(path, shape, 5);
    }
    path_ = broadcast_string(MPI_COMM_WORLD, path, 0);
    MPI_Barrier(MPI_COMM_WORLD);
    file_ = new DatasetFile(DatasetFile::open(path_));
  }
  static void TearDownTestSuite() {
    delete file_;
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) test_support::remove_directory(std::filesystem::path(path_).parent_path().string());
  }

  static TrainConfig base(int micro_batch) {
    TrainConfig config;
    config.dataset_path = path_;
    config.micro_batch = micro_batch;
    config.epochs = 5;
    config.max_steps = kSteps;
    config.log_every = 1000;
    config.seed = 3;
    config.bucket_mb = 0.05;        // ~13 buckets of 50 KiB
    config.first_bucket_mb = 0.01;
    return config;
  }

  // Trains on `comm` and returns the logical parameters.
  static torch::Tensor train(const TrainConfig& config, MPI_Comm comm, MemoryBytes* memory = nullptr) {
    TrainConfig placed = config;
    const Placement placement = test_support::test_placement(placed, comm);
    Trainer trainer(placed, *file_, comm, TrainerOutput{"", false, false}, placement);
    const TrainSummary summary = trainer.run();
    EXPECT_EQ(summary.steps, kSteps);
    if (memory) *memory = trainer.memory();
    return trainer.flat_parameters();
  }

  // The single-rank reference with the global batch, computed on rank 0 and broadcast.
  static torch::Tensor reference(TrainConfig config) {
    Communicator world(MPI_COMM_WORLD);
    config.micro_batch = kMicroBatch * world.size();
    config.grad_accum = 1;
    config.zero_stage = 0;
    torch::Tensor result;
    if (world.rank() == 0) result = train(config, MPI_COMM_SELF);
    int64_t numel = result.defined() ? result.numel() : 0;
    MPI_Bcast(&numel, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
    if (world.rank() != 0) result = torch::empty({numel});
    world.broadcast(result, 0).wait();
    return result;
  }

  static void expect_close(const torch::Tensor& got, const torch::Tensor& want, const char* what) {
    const double difference = ((got - want).norm() / want.norm()).item<double>();
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0) std::printf("%s: relative difference %.3e\n", what, difference);
    EXPECT_LE(difference, test_support::parameter_tolerance()) << what;
  }

  static std::string path_;
  static DatasetFile* file_;
};

std::string ZeroTest::path_;
DatasetFile* ZeroTest::file_ = nullptr;

TEST_F(ZeroTest, StagesZeroOneTwoMatchTheSingleRankRun) {
  const torch::Tensor want = reference(base(kMicroBatch));
  MemoryBytes memory[3];
  for (int stage = 0; stage <= 2; ++stage) {
    TrainConfig config = base(kMicroBatch);
    config.zero_stage = stage;
    const std::string what = "stage " + std::to_string(stage);
    expect_close(train(config, MPI_COMM_WORLD, &memory[stage]), want, what.c_str());
  }
  // Optimizer state per rank at stages 1 and 2 is 1/N of stage 0, within the padding (less
  // than N elements per bucket, two fp32 moments each).
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const int64_t padding_allowance = 2 * 4 * 64 * world;  // generous: up to 64 buckets
  for (int stage = 1; stage <= 2; ++stage) {
    EXPECT_LE(std::llabs(memory[stage].optimizer_state * world - memory[0].optimizer_state),
              padding_allowance)
        << "stage " << stage << ": " << memory[stage].optimizer_state << " bytes vs stage 0 "
        << memory[0].optimizer_state;
  }
  // Stage 2 keeps its partition and two staging buffers of 50 KiB of the 622 KB of gradients,
  // stage 1 the full buffer (Note [Partitioned gradients]; PartitionedGradients counts exactly).
  if (world > 1)
    EXPECT_LT(memory[2].gradients, memory[1].gradients)
        << "stage 2: " << memory[2].gradients << " gradient bytes vs stage 1 " << memory[1].gradients;
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0)
    for (const char* what : {"optimizer state", "gradient"}) {
      const auto bytes = [&](int stage) {
        return static_cast<long long>(what[0] == 'o' ? memory[stage].optimizer_state
                                                     : memory[stage].gradients);
      };
      std::printf("%s bytes per rank at %d ranks: stage 0 %lld, stage 1 %lld, stage 2 %lld\n",
                  what, world, bytes(0), bytes(1), bytes(2));
    }
}

// Note [Trust ratios]: LAMB's and LARS's norms are over whole parameters, which the small buckets
// split between the ranks' partitions: each stage must still end where the single-rank run does.
TEST_F(ZeroTest, LayerAdaptiveRulesMatchTheSingleRankRunAtEveryStage) {
  for (OptimizerKind kind : {OptimizerKind::kLamb, OptimizerKind::kLars}) {
    TrainConfig config = base(kMicroBatch);
    config.optimizer = kind;
    if (kind == OptimizerKind::kLamb) {
      config.lr = 1e-2;
      config.max_trust_ratio = 10.0;
    } else {
      config.lr = 1.0;
      config.momentum = 0.9;
      config.nesterov = true;
      config.weight_decay = 5e-4;
      config.trust_coefficient = 0.02;
      config.no_decay_bias_bn = true;
    }
    const torch::Tensor want = reference(config);
    for (int stage = 0; stage <= 2; ++stage) {
      config.zero_stage = stage;
      const std::string what = to_string(kind) + " at stage " + std::to_string(stage);
      expect_close(train(config, MPI_COMM_WORLD), want, what.c_str());
    }
  }
}

TEST_F(ZeroTest, GradientAccumulationMatchesTheLargerBatch) {
  // 2 micro-steps of b/2 per rank = 1 step of b per rank = 1 rank with N*b.
  const torch::Tensor want = reference(base(kMicroBatch));
  for (int stage : {1, 2}) {
    TrainConfig config = base(kMicroBatch / 2);
    config.grad_accum = 2;
    config.zero_stage = stage;
    const std::string what = "grad-accum 2, stage " + std::to_string(stage);
    expect_close(train(config, MPI_COMM_WORLD), want, what.c_str());
  }
}

TEST_F(ZeroTest, ClippingByTheGlobalNormMatches) {
  TrainConfig clipped = base(kMicroBatch);
  clipped.clip_grad = 0.05;  // well below the gradient norms here, so it clips every step
  const torch::Tensor want = reference(clipped);
  EXPECT_GT(((want - reference(base(kMicroBatch))).norm()).item<double>(), 1e-4)
      << "clipping must change the result for this test to mean anything";
  for (int stage : {0, 2}) {
    TrainConfig config = clipped;
    config.zero_stage = stage;
    const std::string what = "clip 0.05, stage " + std::to_string(stage);
    expect_close(train(config, MPI_COMM_WORLD), want, what.c_str());
  }
}

TEST_F(ZeroTest, FirstBucketStartsBeforeBackwardEnds) {
  TrainConfig config = base(kMicroBatch);
  config.max_steps = 2;  // the second step runs with the rebuilt buckets
  config.zero_stage = 2;
  const Placement placement = test_support::test_placement(config, MPI_COMM_WORLD);
  Trainer trainer(config, *file_, MPI_COMM_WORLD, TrainerOutput{"", false, false}, placement);
  trainer.run();
  const auto events = trainer.last_reducer_events();
  size_t first_start = events.size();
  size_t backward_end = events.size();
  for (size_t i = 0; i < events.size(); ++i) {
    if (events[i].first == "bucket 0 started" && first_start == events.size()) first_start = i;
    if (events[i].first == "backward ended") backward_end = i;
  }
  ASSERT_LT(backward_end, events.size());
  ASSERT_LT(first_start, events.size());
  EXPECT_LT(first_start, backward_end) << "bucket 0 must start while backward is still running";
  EXPECT_LE(events[first_start].second, events[backward_end].second);
  int started_during_backward = 0;
  for (size_t i = 0; i < backward_end; ++i) started_during_backward += events[i].first.find("started") != std::string::npos;
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0)
    std::printf("overlap: %d collectives started during backward; bucket 0 at %.3f ms, backward "
                "ended at %.3f ms\n", started_during_backward, events[first_start].second,
                events[backward_end].second);
}

TEST_F(ZeroTest, ResNet18TrainsAndEveryRankHoldsTheSameParameters) {
  // Batch norm sees each rank's own micro-batch, so resnet18 is not expected to match the
  // single-rank run (as with DDP without SyncBatchNorm); the ranks must still agree exactly.
  TrainConfig config = base(kMicroBatch);
  config.model = "resnet18";
  config.max_steps = 3;
  config.zero_stage = 2;
  config.bucket_mb = 8.0;
  const Placement placement = test_support::test_placement(config, MPI_COMM_WORLD);
  Trainer trainer(config, *file_, MPI_COMM_WORLD, TrainerOutput{"", false, false}, placement);
  const TrainSummary summary = trainer.run();
  EXPECT_EQ(summary.steps, 3);
  EXPECT_GT(summary.parameters, 11000000);
  EXPECT_TRUE(std::isfinite(summary.final_train_loss));
  const torch::Tensor mine = trainer.flat_parameters();
  torch::Tensor root = mine.clone();
  Communicator(MPI_COMM_WORLD).broadcast(root, 0).wait();
  EXPECT_TRUE(torch::equal(root, mine));
}

TEST_F(ZeroTest, CapturedStepsMatchEagerSteps) {
  // --cuda-graph on: after the eager warm-up steps every step is replayed from one captured
  // graph (NCCL world of one). The replays must compute what eager steps compute.
  if (!test_support::testing_on_gpu()) GTEST_SKIP() << "CUDA graphs need the GPU (ctest -L gpu)";
  if (Communicator(MPI_COMM_WORLD).size() != 1)
    GTEST_SKIP() << "graphs need NCCL, which takes one rank per GPU";
  at::globalContext().setDeterministicCuDNN(true);
  for (Precision precision : {Precision::kFp32, Precision::kBf16, Precision::kFp16}) {
    for (int stage : {0, 2}) {
      TrainConfig config = base(kMicroBatch);
      config.precision = precision;
      config.zero_stage = stage;
      const std::string what = to_string(precision) + ", stage " + std::to_string(stage);
      auto run = [&](Switch graph, int64_t expected_replays) {
        TrainConfig placed = config;
        placed.cuda_graph = graph;
        const Placement placement = test_support::test_placement(placed, MPI_COMM_WORLD);
        Trainer trainer(placed, *file_, MPI_COMM_WORLD, TrainerOutput{"", false, false}, placement);
        const TrainSummary summary = trainer.run();
        EXPECT_EQ(summary.steps, kSteps) << what;
        EXPECT_EQ(summary.graph_replays, expected_replays)
            << what << ", --cuda-graph " << to_string(graph);
        return trainer.flat_parameters().to(torch::kFloat);
      };
      const torch::Tensor eager = run(Switch::kOff, 0);
      // Steps 1-3 eager (the first rebuilds the buckets), step 4 captures and replays, 5-20 replay.
      const torch::Tensor graphed = run(Switch::kOn, kSteps - 3);
      const double difference = ((graphed - eager).norm() / eager.norm()).item<double>();
      std::printf("graph replay vs eager, %s: relative difference %.3e\n", what.c_str(), difference);
      // The same kernels in the same order (deterministic cuDNN algorithms on both sides): fp32
      // agrees to rounding; 16-bit parameters may round a few elements the other way.
      EXPECT_LE(difference, precision == Precision::kFp32 ? 1e-5 : 2e-3) << what;
    }
  }
  at::globalContext().setDeterministicCuDNN(false);
}

TEST(ZeroOverflow, OneRankOverflowingSkipsTheStepEverywhere) {
  Communicator comm(MPI_COMM_WORLD);
  // fp16 parameters (no forward needed: the gradients are set by hand).
  std::vector<std::string> names = {"a", "b"};
  std::vector<at::Tensor> parameters = {torch::ones({5, 3}).to(torch::kHalf).requires_grad_(),
                                        torch::ones({7}).to(torch::kHalf).requires_grad_()};
  ReducerOptions reducer_options;
  reducer_options.reduction = GradientReduction::kPartitioned;
  BucketLayout layout = Reducer::initial_layout(parameters, reducer_options, comm.size());
  FlatParameters flat(names, parameters, std::move(layout));
  Reducer reducer(flat, comm, reducer_options);
  ZeroOptions options;
  options.stage = 2;
  options.check_overflow = true;
  ZeroOptimizer optimizer(flat, reducer, comm, options);
  const torch::Tensor before = flat.values().clone();

  // As backward leaves them: in `.grad`, whence the reducer collects them (partitioned, there
  // is no flat gradient buffer to write into).
  const auto set_grads = [&](bool overflow) {
    for (at::Tensor& p : parameters) p.mutable_grad() = torch::full_like(p, 0.5);
    if (overflow) parameters[0].mutable_grad()[1][0] = std::numeric_limits<float>::infinity();
  };
  set_grads(comm.rank() == comm.size() - 1);
  reducer.begin_backward(true);
  reducer.finish_backward();
  const StepOutcome outcome = TestHooks::step(optimizer, 1e-3, 1024.0);
  EXPECT_TRUE(outcome.overflow) << "rank " << comm.rank() << " must learn of the overflow";
  EXPECT_TRUE(torch::equal(flat.values(), before)) << "nothing may change on a skipped step";
  EXPECT_EQ(optimizer.steps_taken(), 0);

  flat.zero_grads();  // as the step policy does after every step
  set_grads(false);
  reducer.begin_backward(true);
  reducer.finish_backward();
  EXPECT_FALSE(TestHooks::step(optimizer, 1e-3, 1024.0).overflow);
  EXPECT_EQ(optimizer.steps_taken(), 1);
  EXPECT_FALSE(torch::equal(flat.values(), before));
}

// The step policy the optimizer owns on the CPU (the GPU's is in test_fused_optimizer.cpp):
// the host loss scaler skips and halves on an overflow agreed by all ranks, the schedule counts
// applied steps only (Note [Schedule step]), the gradients are zeroed after every step, and
// resume() continues the counters and the scaler.
TEST(ZeroStepPolicy, ScalerScheduleAndZeroedGradientsOnTheHost) {
  Communicator comm(MPI_COMM_WORLD);
  std::vector<std::string> names = {"a", "b"};
  std::vector<at::Tensor> parameters = {torch::ones({5, 3}).requires_grad_(),
                                        torch::ones({7}).requires_grad_()};
  ReducerOptions reducer_options;
  BucketLayout layout = Reducer::initial_layout(parameters, reducer_options, comm.size());
  FlatParameters flat(names, parameters, std::move(layout));
  Reducer reducer(flat, comm, reducer_options);
  ZeroOptions options;
  options.stage = 1;
  options.check_overflow = true;
  LossScalerOptions scaling;
  scaling.initial_scale_power = 4;
  scaling.hysteresis = 1;  // every overflow halves the scale
  options.loss_scaling = scaling;
  options.lr_schedule = LrScheduleParams{LrScheduleKind::kWarmup, WarmupType::kLinear, 1e-2, 10, 0.0};
  ZeroOptimizer optimizer(flat, reducer, comm, options);
  EXPECT_EQ(optimizer.loss_gradient(torch::full({}, 3.0), 0.5).item<double>(), 16 * 0.5);

  const bool overflow_at[] = {false, true, false, true, false};
  int64_t applied = 0;
  double scale = 16;
  for (bool overflow : overflow_at) {
    flat.grads().fill_(0.5);
    if (overflow && comm.rank() == 0) flat.grads()[2] = std::numeric_limits<float>::infinity();
    reducer.begin_backward(true);
    reducer.finish_backward();
    optimizer.step();
    const StepReport report = optimizer.report();
    EXPECT_EQ(report.last_overflow, overflow) << "rank " << comm.rank();
    EXPECT_TRUE(torch::equal(flat.grads(), torch::zeros_like(flat.grads()))) << "gradients zeroed";
    if (overflow) {
      scale /= 2;
    } else {
      EXPECT_EQ(report.last_lr, lr_at(*options.lr_schedule, applied)) << applied << " applied before";
      ++applied;
    }
    EXPECT_EQ(report.loss_scale, scale);
    EXPECT_EQ(report.adam_steps, applied);
  }
  const StepReport last = optimizer.report();
  EXPECT_EQ(last.global_step, 5);
  EXPECT_EQ(last.skipped_steps, 2);
  EXPECT_EQ(last.scaler.skipped_steps, 2);

  ZeroOptimizer resumed(flat, reducer, comm, options);
  resumed.load_full_state(optimizer.gather_full_state());
  resumed.resume(last.global_step, last.adam_steps, last.scaler);
  const StepReport continued = resumed.report();
  EXPECT_EQ(continued.global_step, last.global_step);
  EXPECT_EQ(continued.skipped_steps, last.skipped_steps);
  EXPECT_EQ(continued.loss_scale, last.loss_scale);
}

// The reducer owns the layout and its rebuild; the optimizer, told around it (LayoutObserver),
// carries its state into the new partition. Parameters a, b, c, each a bucket of its own, start
// in reverse order (c, b, a); a backward that makes a ready first, then b, then c rebuilds them as
// (a, b, c). The optimizer's state in the logical layout is then what it was, at every stage.
TEST(ReducerRebuild, TheOptimizerStateFollowsTheNewLayout) {
  Communicator comm(MPI_COMM_WORLD);
  for (int stage = 0; stage <= 2; ++stage) {
    std::vector<std::string> names = {"a", "b", "c"};
    std::vector<at::Tensor> parameters = {torch::arange(15.0).reshape({5, 3}).requires_grad_(),
                                          torch::arange(7.0).requires_grad_(),
                                          torch::arange(4.0).requires_grad_()};
    ReducerOptions reducer_options;
    reducer_options.first_bucket_bytes = reducer_options.bucket_bytes = 4;  // one each
    reducer_options.reduction = reduction_for_zero_stage(stage);
    BucketLayout layout = Reducer::initial_layout(parameters, reducer_options, comm.size());
    FlatParameters flat(names, parameters, std::move(layout));
    Reducer reducer(flat, comm, reducer_options);
    ZeroOptions options;
    options.stage = stage;
    ZeroOptimizer optimizer(flat, reducer, comm, options);
    reducer.begin_backward(true);
    // Autograd runs the nodes made last first: a's gradient is ready first.
    const at::Tensor c_term = (parameters[2] * parameters[2]).sum();
    const at::Tensor b_term = (parameters[1] * 3.0).sum();
    const at::Tensor a_term = (parameters[0] * parameters[0] * 0.5).sum();
    (c_term + b_term + a_term).backward();
    reducer.finish_backward();
    optimizer.step();
    const FullOptimizerState before = optimizer.gather_full_state();
    const at::Tensor values_before = flat.to_logical(flat.values()).clone();
    EXPECT_FALSE(reducer.layout_final());
    ASSERT_TRUE(reducer.rebuild_buckets()) << "stage " << stage;
    EXPECT_TRUE(reducer.layout_final());
    EXPECT_EQ(flat.layout().buckets.front().parameters, std::vector<int>{0});
    const FullOptimizerState after = optimizer.gather_full_state();
    EXPECT_TRUE(torch::equal(after.master, before.master)) << "stage " << stage;
    EXPECT_TRUE(torch::equal(after.exp_avg, before.exp_avg)) << "stage " << stage;
    EXPECT_TRUE(torch::equal(after.exp_avg_sq, before.exp_avg_sq)) << "stage " << stage;
    EXPECT_EQ(after.steps, before.steps);
    EXPECT_TRUE(torch::equal(flat.to_logical(flat.values()), values_before)) << "stage " << stage;
    EXPECT_FALSE(reducer.rebuild_buckets()) << "the layout is final after the first rebuild";
  }
}

// Note [Failed capture] (step_graph.h), the reducer's part: a backward that throws half-way, with
// a bucket started (its collective in flight where there are peers) and gradients of a bucket
// not yet started still in `.grad`, is forgotten by discard_backward, and the next backward
// reduces exactly what a clean one does. Without it, the next backward would throw (collectives
// in flight) or add its gradients into the stale `.grad`s.
TEST(ReducerDiscard, ABackwardThatThrowsHalfWayLeavesNothingBehind) {
  Communicator comm(MPI_COMM_WORLD);
  torch::manual_seed(11);
  std::vector<std::string> names = {"w1", "b1", "w2", "b2", "w3", "b3"};
  std::vector<at::Tensor> parameters = {
      torch::randn({16, 8}).requires_grad_(), torch::randn({16}).requires_grad_(),
      torch::randn({8, 16}).requires_grad_(), torch::randn({8}).requires_grad_(),
      torch::randn({4, 8}).requires_grad_(),  torch::randn({4}).requires_grad_()};
  // Buckets in reverse order: {b3, w3} (144 bytes), {b2, w2, b1} (608), {w1}.
  ReducerOptions reducer_options;
  reducer_options.first_bucket_bytes = 144;
  reducer_options.bucket_bytes = 608;
  BucketLayout layout = Reducer::initial_layout(parameters, reducer_options, comm.size());
  FlatParameters flat(names, parameters, std::move(layout));
  Reducer reducer(flat, comm, reducer_options);
  ASSERT_EQ(reducer.num_buckets(), 3u);
  // Each rank's own input, as each rank has its own samples.
  const torch::Tensor input = torch::randn({4, 8}) + comm.rank();
  // With `fail`, the gradient of the first layer's output throws: the last two layers' gradients
  // are in, bucket {b3, w3} has started, {b2, w2, b1} waits for b1.
  const auto loss = [&](bool fail) {
    torch::Tensor x = torch::relu(torch::linear(input, parameters[0], parameters[1]));
    if (fail)
      x.register_hook([](const torch::Tensor&) -> torch::Tensor {
        throw std::runtime_error("a failure half-way through the backward");
      });
    x = torch::relu(torch::linear(x, parameters[2], parameters[3]));
    return torch::linear(x, parameters[4], parameters[5]).pow(2).sum();
  };
  const auto clean_backward = [&] {
    reducer.begin_backward(true);
    loss(false).backward();
    reducer.finish_backward();
  };
  clean_backward();
  const torch::Tensor reference = flat.grads().clone();
  flat.zero_grads();

  reducer.begin_backward(true);
  EXPECT_ANY_THROW(loss(true).backward());
  EXPECT_TRUE(parameters[2].grad().defined() && parameters[3].grad().defined())
      << "w2 and b2 must be waiting in .grad for their bucket, or the test tests less";

  reducer.discard_backward();
  for (size_t i = 0; i < parameters.size(); ++i)
    EXPECT_FALSE(parameters[i].grad().defined()) << names[i] << "'s .grad was not dropped";
  EXPECT_TRUE(torch::equal(flat.grads(), torch::zeros_like(flat.grads())));

  clean_backward();
  EXPECT_TRUE(torch::equal(flat.grads(), reference))
      << "rank " << comm.rank() << ": the backward after the discarded one reduced other gradients";
}

// Note [Partitioned gradients]: at ZeRO-2 across ranks a rank keeps its partition of the reduced
// gradients and two staging buffers of about a bucket, and no full-size buffer; a window of
// micro-steps reduced one by one into the partition sums what stage 0's one all-reduce sums.
// Stage 1's reduce-scatter leaves each rank's own slices of the flat buffer reduced. Buckets of
// 64 elements: one of two parameters, the others alone, the larger ones (a channels-last weight
// among them) in chunks, so that the ring turns over many times.
TEST(PartitionedGradients, ThePartitionAndTwoBucketsHoldAWindowsReducedSum) {
  Communicator comm(MPI_COMM_WORLD);
  const std::vector<std::vector<int64_t>> shapes = {{37}, {5, 9}, {64}, {4, 3, 3, 3},
                                                    {3, 11}, {100}, {7}};
  const int64_t kBucketBytes = 64 * 4;
  const int kMicroSteps = 3;
  torch::manual_seed(5 + comm.rank());  // each rank its own samples
  std::vector<std::vector<torch::Tensor>> inputs(kMicroSteps);
  for (auto& micro_step : inputs)
    for (const auto& shape : shapes) micro_step.push_back(torch::randn(shape) + comm.rank());

  struct Reduced {
    torch::Tensor logical;  // every rank's reduced partition, gathered, in the logical layout
    int64_t gradient_bytes = 0;
    bool flat_buffer = false;
    int64_t expected_partitioned_bytes = 0;
  };
  const auto reduce_window = [&](GradientReduction reduction) {
    std::vector<std::string> names;
    std::vector<at::Tensor> parameters;
    for (size_t i = 0; i < shapes.size(); ++i) {
      names.push_back("p" + std::to_string(i));
      parameters.push_back(torch::zeros(shapes[i]).requires_grad_());
    }
    ReducerOptions options;
    options.first_bucket_bytes = options.bucket_bytes = kBucketBytes;
    options.reduction = reduction;
    FlatParameters flat(names, parameters, Reducer::initial_layout(parameters, options, comm.size()),
                        /*channels_last_weights=*/true);
    Reducer reducer(flat, comm, options);
    for (int k = 0; k < kMicroSteps; ++k) {
      reducer.begin_backward(/*sync=*/k + 1 == kMicroSteps);
      torch::Tensor loss = torch::zeros({});
      for (size_t i = 0; i < shapes.size(); ++i) loss = loss + (parameters[i] * inputs[k][i]).sum();
      loss.backward();
      reducer.finish_backward();
    }
    const BucketLayout& layout = flat.layout();
    const bool partitioned = reduction == GradientReduction::kPartitioned && comm.size() > 1;
    // Each rank's reduced slices into a flat tensor, then every rank's to every rank.
    torch::Tensor full = torch::zeros({layout.total_numel});
    for (const Partition::Slice& slice : reducer.partition().slices) {
      const torch::Tensor& source = partitioned ? reducer.partition_grads() : flat.grads();
      const int64_t offset = partitioned ? slice.partition_offset : slice.flat_offset;
      full.narrow(0, slice.flat_offset, slice.numel).copy_(source.narrow(0, offset, slice.numel));
    }
    if (reduction == GradientReduction::kAllReduce) full = flat.grads();
    else reducer.all_gather_slices(full);
    Reduced reduced;
    reduced.logical = flat.to_logical(full);
    reduced.gradient_bytes = reducer.gradient_bytes();
    reduced.flat_buffer = flat.grads().defined();
    // A staging buffer: a bucket of several parameters whole, one of a single parameter up to
    // the cap in elements (rounded down to ranks x 16, at least that), the rest in chunks.
    const int64_t granule = comm.size() * kSlotAlignmentElements;
    const int64_t cap = std::max(granule, kBucketBytes / 4 / granule * granule);
    int64_t staging = 0, largest_bucket = 0;
    for (size_t b = 0; b < layout.spans.size(); ++b) {
      const int64_t padded = layout.spans[b].padded_numel;
      staging = std::max(staging, layout.buckets[b].parameters.size() > 1 ? padded
                                                                          : std::min(padded, cap));
      largest_bucket = std::max(largest_bucket, padded);
    }
    if (partitioned) EXPECT_GT(largest_bucket, staging) << "no bucket went in chunks";
    reduced.expected_partitioned_bytes = (layout.partition_numel + 2 * staging) * 4;
    return reduced;
  };
  const Reduced everywhere = reduce_window(GradientReduction::kAllReduce);
  int64_t partitioned_bytes = 0;
  for (GradientReduction reduction : {GradientReduction::kOwnSlices, GradientReduction::kPartitioned}) {
    const Reduced reduced = reduce_window(reduction);
    const std::string what = reduction == GradientReduction::kOwnSlices ? "stage 1" : "stage 2";
    EXPECT_TRUE(torch::allclose(reduced.logical, everywhere.logical, 1e-6, 1e-5))
        << what << ", rank " << comm.rank() << ": "
        << (reduced.logical - everywhere.logical).abs().max().item<double>();
    if (reduction == GradientReduction::kPartitioned) partitioned_bytes = reduced.gradient_bytes;
    if (reduction == GradientReduction::kPartitioned && comm.size() > 1) {
      EXPECT_FALSE(reduced.flat_buffer) << "stage 2 keeps no full-size gradient buffer";
      EXPECT_EQ(reduced.gradient_bytes, reduced.expected_partitioned_bytes);
    } else {
      EXPECT_EQ(reduced.gradient_bytes, everywhere.gradient_bytes) << what;
    }
  }
  if (comm.rank() == 0)
    std::printf("gradient bytes per rank at %d ranks: all-reduce %lld, partitioned %lld\n",
                comm.size(), static_cast<long long>(everywhere.gradient_bytes),
                static_cast<long long>(partitioned_bytes));
}

}  // namespace
