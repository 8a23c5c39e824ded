#include "hpc_train/train/trainer.h"

#include <torch/cuda.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <future>
#include <optional>
#include <vector>

#include "hpc_train/io/checkpoint.h"
#include "hpc_train/comm/comm.h"
#include "hpc_train/data/device_input.h"
#include "hpc_train/data/epoch_batches.h"
#include "hpc_train/data/epoch_plan.h"
#include "hpc_train/data/sample_store.h"
#include "hpc_train/train/checkpoint_cadence.h"
#include "hpc_train/train/cross_entropy.h"
#include "hpc_train/train/evaluation.h"
#include "hpc_train/error.h"
#include "hpc_train/model/batch_norm_act.h"
#include "hpc_train/model/pool_bias_relu.h"
#include "hpc_train/model/flat_parameters.h"
#include "hpc_train/monitor/gpu_monitor.h"
#include "hpc_train/model/initial_weights.h"
#include "hpc_train/optim/lr_schedule.h"
#include "hpc_train/monitor/metrics.h"
#include "hpc_train/model/models.h"
#include "hpc_train/comm/reducer.h"
#include "hpc_train/train/run_length.h"
#include "hpc_train/train/run_options.h"
#include "hpc_train/train/step_agreement.h"
#include "hpc_train/monitor/run_report.h"
#include "hpc_train/train/graphed_step.h"
#include "hpc_train/runtime/cuda_profiler.h"
#include "hpc_train/runtime/runtime.h"
#include "hpc_train/runtime/startup_phases.h"
#include "hpc_train/runtime/stop_signal.h"
#include "hpc_train/runtime/test_fault.h"
#include "hpc_train/train/training_state.h"
#include "hpc_train/optim/zero_optimizer.h"

namespace hpc_train {

void set_compute_threads(int threads) { at::set_num_threads(std::max(1, threads)); }

namespace {

// The calling thread's current stream on `device`.
c10::Stream current_stream(const torch::Device& device) {
  return c10::impl::getDeviceGuardImpl(device.type())->getStream(device);
}

// Note [Training step warm-up]
// CUDA loads a library's kernels (one fatbinary of cuDNN, cuBLAS, LibTorch or hpc_train) at the
// first launch of one of them, 1-60 ms each: on an H100, the origin's first step spent about
// 0.15 s of its 0.2 s in such loads, on autograd's thread, after the model phase had spent most
// of its 0.25 s in its own. The driver loads on several threads at once (three groups of first
// uses took 0.23-0.31 s on three threads against 0.44-0.63 s on one). So on a GPU, while the
// trainer's thread runs the check and the evaluation's first use (Note [One evaluation shape]
// in evaluation.h), a second thread runs one training step's forward and backward on a twin of
// the model at the micro-batch's shape and layout; the model phase waits for both. The twin is
// built before the run's seed is set (the run's weights draw what they drew without it), its
// step runs on the training stream (training reuses the memory it frees), and the CUDA
// generator's state is put back after it (dropout in the twin draws nothing from the run). The
// loaded kernels serve every thread; cuDNN's plans are kept per thread, and the backward's,
// made on autograd's device thread, are the ones training's backward finds there. Errors are
// left to the first step, which meets and reports them.
void warm_up_training_step(TrainableModel& twin, const torch::Device& device, torch::Dtype dtype,
                           bool channels_last, const ModelShape& shape, int64_t micro_batch,
                           c10::Stream training_stream) {
  try {
    const c10::DeviceGuard on_device(device);
    const c10::StreamGuard on_training_stream(training_stream);
    at::Generator generator = at::globalContext().defaultGenerator(device);
    const torch::Tensor generator_state = generator.get_state();
    twin.to(device, dtype);
    for (const TrainableModel::NamedTensor& parameter : twin.named_parameters())
      if (channels_last && parameter.tensor.dim() == 4)  // Note [Channels-last weights]
        parameter.tensor.set_data(parameter.tensor.contiguous(at::MemoryFormat::ChannelsLast));
    twin.train();
    const auto on_device_options = torch::TensorOptions().device(device);
    const torch::Tensor input = in_model_layout(
        torch::zeros({micro_batch, shape.channels, shape.height, shape.width},
                     on_device_options.dtype(dtype)),
        channels_last);
    mean_cross_entropy(twin.forward(input),
                       torch::zeros({micro_batch}, on_device_options.dtype(torch::kLong)))
        .backward();
    generator.set_state(generator_state);
  } catch (const std::exception&) {
  }
}

}  // namespace

struct Trainer::Impl {
  TrainConfig config;
  const DatasetFile& dataset;
  Communicator comm;
  RunReporter reporter;
  Placement placement;
  torch::Device device;
  torch::Dtype dtype;
  GpuMonitor gpu_monitor;  // NVML samples of this rank's GPU (none on the CPU)
  // Note [Training stream]: from here on (GPU) every step, eager or captured, runs on one
  // non-default stream. It must be current before the Reducer takes the gradient accumulators:
  // an AccumulateGrad node remembers the stream current when it was made, and autograd runs it
  // there. Made on the default stream, it ties the default (legacy) stream into every backward,
  // which a CUDA graph capture refuses ("operation would make the legacy stream depend on a
  // capturing blocking stream"; PyTorch asks DDP to be built on the side stream for the same
  // reason). Declared before the model, so that it is torn down last.
  TrainingStreamScope training_stream;
  std::unique_ptr<TrainableModel> model;
  FlatParameters flat;
  std::optional<Reducer> reducer;
  std::optional<ZeroOptimizer> optimizer;
  std::optional<RunCheckpoints> checkpoints;
  std::optional<DeviceInput> train_input;
  std::optional<Evaluator> evaluator;
  std::optional<SampleStore> store;  // --data-store memory (sample_store.h)
  bool train_split_resident = false;
  torch::Tensor interval_loss;       // summed micro-batch losses since the last log (fp64 [])
  int64_t interval_loss_micro_steps = 0;  // how many are in it
  // Inputs and convolution weights in NHWC (cuDNN's fast layout on tensor cores; Note
  // [Channels-last weights] in flat_parameters.h)
  bool channels_last = false;
  std::optional<GraphedStep> graphed_step;  // --cuda-graph
  bool buckets_rebuilt = false;
  TrainingPosition start;   // where run() begins: zero, or a resumed checkpoint's position
  SampleTrace sample_trace; // test-only (SampleTrace)
  std::string resumed_from; // the checkpoint file, empty for a fresh start
  IntervalTimes run_times;  // every log interval of the run, added up
  double shown_loss = 0.0;  // the last log interval's loss, for the progress bar

  Impl(const TrainConfig& c, const DatasetFile& d, MPI_Comm mpi_comm, const TrainerOutput& output,
       Placement where, StartupPhases* startup)
      : config(c), dataset(d), comm(mpi_comm, where.backend, where.cuda_device),
        reporter(output, comm.rank()), placement(where),
        device(where.cuda ? torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(where.cuda_device))
                          : torch::Device(torch::kCPU)),
        dtype(model_dtype(c)),
        gpu_monitor(where.cuda ? where.cuda_device : -1),
        training_stream(where.cuda),
        sample_trace(comm.rank()) {
    // Note [Start-up phases]: each mark ends the phase since the previous one.
    const auto phase_ends = [startup](const char* name) {
      if (startup) startup->end_phase(name);
    };
    phase_ends("communicator");  // NCCL's, with the CUDA context it makes; the training stream
    comm.set_timeout(config.comm_timeout_s);
    const DatasetInfo& info = dataset.info();
    // Note [Resident upload beside the model]: the resident splits are read and copied to the
    // device on a thread of their own while the model and the optimizer are built (on the H200,
    // 0.14 s of Fashion-MNIST's start-up came after them); the data phase waits for it.
    train_input.emplace(info, device, dtype, default_augmentation(info, config.augment),
                        config.seed, comm.rank(), config.micro_batch);
    channels_last = placement.cuda && config.channels_last;
    evaluator.emplace(dataset, Split::kTest, device, dtype, channels_last, config.seed,
                      evaluation_batch(config, info, comm.size(), placement.cuda),
                      config.prefetch_batches, comm);
    const std::optional<GpuMemory> gpu = gpu_memory(placement);
    train_split_resident = keep_train_split_resident(config, info, gpu);
    std::future<void> resident_upload;
    if (train_split_resident) {
      const bool test_split_resident = keep_test_split_resident(config, info, gpu);
      resident_upload = std::async(std::launch::async, [this, test_split_resident] {
        const c10::DeviceGuard on_device(device);  // the thread's own current device
        if (test_fault("resident-upload", comm.rank()))  // Note [Test faults]
          throw Error("test fault: the upload of the resident train split failed");
        train_input->keep_split_resident(dataset, Split::kTrain);
        if (test_split_resident) evaluator->keep_split_resident();
      });
    }
    const ModelShape shape{info.channels, info.height, info.width, info.num_classes};
    // Process-wide switches, set before the twin's thread below reads them.
    set_fused_batch_norm(config.fused_batch_norm);  // Note [Fused batch norm]
    set_fused_pooling(config.fused_pooling);        // Note [Fused pooling]
    // Written only where it changes: the early CUDA start's thread may still run a convolution,
    // which reads it (Note [Early CUDA start] set it from the same command line).
    if (placement.cuda && at::globalContext().deterministicCuDNN() != config.deterministic)
      at::globalContext().setDeterministicCuDNN(config.deterministic);
    // Note [Training step warm-up]: built before the run's seed, whose draws it leaves alone.
    std::unique_ptr<TrainableModel> twin;
    if (placement.cuda) twin = load_model(config.model, shape);
    torch::manual_seed(config.seed);
    model = load_model(config.model, shape);
    // --init-weights on every rank, before the broadcast, which then only confirms what every
    // rank read.
    if (!config.init_weights.empty()) {
      const std::string init_weights = test_fault("init-weights", comm.rank())  // Note [Test faults]
                                           ? config.init_weights + ".missing-on-this-rank"
                                           : config.init_weights;
      const WeightsMatch match = load_initial_weights(
          init_weights, config.init_weights_partial, *model, config.model);
      reporter.say("%s\n", describe_weights_loaded(match, config.init_weights).c_str());
    }
    model->to(device, dtype);
    std::future<void> step_warm_up;
    if (twin)
      step_warm_up = std::async(std::launch::async, [&, twin = std::move(twin),
                                                     stream = current_stream(device)] {
        warm_up_training_step(*twin, device, dtype, channels_last, shape, config.micro_batch,
                              stream);
      });
    if (placement.cuda) {
      // At the evaluation's shape, with its sums (Note [One evaluation shape] in evaluation.h).
      evaluator->warm_up(check_runs_in(*model, evaluator->sample_input(),
                                       to_string(config.precision), config.model));
    } else if (dtype != torch::kFloat) {  // on the CPU shapes cost nothing ahead: one sample
      check_runs_in(*model,
                    torch::zeros({1, info.channels, info.height, info.width},
                                 torch::TensorOptions().dtype(dtype)),
                    to_string(config.precision), config.model);
    }
    if (step_warm_up.valid()) step_warm_up.get();
    phase_ends("model");  // with the GPU's first uses (check_runs_in, the twin's step)
    std::vector<std::string> names;
    std::vector<at::Tensor> parameters;
    for (const auto& item : model->named_parameters()) {
      names.push_back(item.name);
      parameters.push_back(item.tensor);
    }
    const ReducerOptions bucketing = reducer_options(config);
    BucketLayout layout = Reducer::initial_layout(parameters, bucketing, comm.size());
    // Note [Channels-last weights]
    flat = FlatParameters(std::move(names), std::move(parameters), std::move(layout),
                          /*channels_last_weights=*/channels_last);
    if (test_fault("alloc", comm.rank()))  // Note [Test faults]: more bytes than any node has
      torch::empty({int64_t{1} << 58}, torch::TensorOptions().dtype(torch::kFloat).device(device));
    // Every rank starts from rank 0's parameters and buffers.
    comm.broadcast(flat.values(), 0).wait();
    broadcast_buffers(*model, comm);
    reducer.emplace(flat, comm, bucketing);
    optimizer.emplace(flat, *reducer, comm, zero_options(config));
    checkpoints.emplace(config, info, comm, *model, flat.numel(), device, *optimizer, reporter);
    phase_ends("optimizer");  // flat storage, the broadcast, buckets, the optimizer's state
    if (config.data_store == DataStore::kMemory) {  // Note [Read-once sample store]
      store.emplace(dataset, comm, store_limit_bytes(config.data_store_limit_mb, comm.mpi_comm()));
      reporter.say("Data store: rank 0 read %s\n", store->describe_read().c_str());
    }
    if (resident_upload.valid()) resident_upload.get();  // rethrows the thread's error
    phase_ends("data");  // the store's read, what is left of the resident splits' upload
    interval_loss = torch::zeros({}, torch::TensorOptions().dtype(torch::kDouble).device(device));
    graphed_step.emplace(capture_steps(config, placement), config.cuda_graph == Switch::kOn);
    resumed_from = checkpoints->to_resume();
    if (!resumed_from.empty()) start = checkpoints->resume(resumed_from);
    checkpoints->start_branch(resumed_from, start.global_step);
    phase_ends("resume");
  }

  // Returns the losses summed since the last call and starts a new sum (waits for the device).
  LossSum take_interval_loss() {
    const LossSum taken{interval_loss.item<double>(), interval_loss_micro_steps};
    interval_loss.zero_();
    interval_loss_micro_steps = 0;
    return taken;
  }

  // Note [Gradient averaging]
  // Each rank's loss is the mean over its micro-batch, and every rank's micro-batch has the same
  // size (the epoch plan pads or drops so that it does). The gradient of the mean loss over the
  // global batch (world size W ranks x G micro-steps of the update) is then the sum, over ranks
  // and micro-steps, of each micro-batch's gradient divided by W * G. So backward runs as on
  // loss * loss_scale / (W * G) (it starts from that factor, the optimizer's loss_gradient), the
  // micro-steps add up in the parameters' gradients (collected into the flat buffer at the last
  // one), and the collectives sum over ranks: no division pass, and fp16 sums stay small. N
  // ranks with micro-batch b then match 1 rank with batch N*b, and 2 micro-steps of b match 1
  // of 2b. G is --grad-accum, or fewer in the run's final partial window (Note [Run length]).
  void forward_backward(const DeviceBatch& batch, bool sync, int window_micro_steps,
                        IntervalTimes& times) {
    Stopwatch phase;
    if (placement.cuda)  // Note [cuDNN autotuning] (run_options.h)
      at::globalContext().setBenchmarkCuDNN(cudnn_autotunes(config, batch.labels.size(0)));
    model->train();
    const torch::Tensor logits = model->forward(in_model_layout(batch.input, channels_last));
    const torch::Tensor loss = mean_cross_entropy(logits, batch.labels);  // Note [Fused cross-entropy]
    times.forward_ms += phase.elapsed_ms();
    phase.restart();
    reducer->begin_backward(sync);
    const double averaging = 1.0 / (comm.size() * static_cast<double>(window_micro_steps));
    loss.backward(optimizer->loss_gradient(loss, averaging));
    times.backward_ms += phase.elapsed_ms();
    if (sync) {
      times.comm_wait_ms += reducer->finish_backward();
      times.comm_span_ms += reducer->comm_span_ms();
      times.comm_bytes += reducer->bytes_last_backward();
    } else {
      reducer->finish_backward();
    }
    interval_loss.add_(loss.detach());
  }

  // The optimizer step after a synchronised micro-step. On a GPU overflows and the loss scale
  // stay there; log_interval reads them (ZeroOptimizer::report).
  void optimizer_step(IntervalTimes& times) {
    Stopwatch phase;
    optimizer->step();
    // The first step that was taken decides the bucket layout (a read of the GPU, once).
    if (!buckets_rebuilt && !optimizer->report().last_overflow) {
      optimizer->rebuild_buckets();
      buckets_rebuilt = true;
    }
    times.optimizer_ms += phase.elapsed_ms();
  }

  MemoryBytes memory() const {
    MemoryBytes bytes;
    bytes.parameters = flat.values().numel() * flat.values().element_size();
    bytes.gradients = reducer->gradient_bytes();
    bytes.optimizer_state = optimizer->state_bytes();
    return bytes;
  }

  // Rank 0's log line and metrics record for the interval that ends with the step `at`.
  // Collective (the interval's loss is averaged over ranks).
  // Returns the interval's mean loss.
  double log_interval(const StepPosition& at, IntervalTimes& times) {
    const StepReport report = optimizer->report();
    const double steps = static_cast<double>(std::max<int64_t>(1, times.steps));
    // Over the micro-steps whose losses the interval holds: an update's window may have begun
    // in the epoch before (Note [Run length]).
    const double loss =
        comm.all_reduce_scalar(times.loss_sum) /
        (comm.size() * static_cast<double>(std::max<int64_t>(1, times.loss_micro_steps)));
    const double interval_ms = times.wall.elapsed_ms();
    IntervalReport line;
    line.at = at;
    line.loss = loss;
    line.lr = report.last_lr;
    line.samples_per_s = 1e3 * times.samples * comm.size() / interval_ms;
    line.ms_per_step = interval_ms / steps;
    line.buckets = reducer->num_buckets();
    line.show_loss_scale = config.precision == Precision::kFp16;
    line.loss_scale = report.loss_scale;
    line.skipped_steps = report.skipped_steps;
    line.memory = memory();
    line.breakdown = times.breakdown(comm.size(), config.zero_stage == 2);
    // Every rank's GPU figures, min and max over the ranks (collective).
    const int64_t allocator_peak = placement.cuda ? allocator_peak_bytes(placement.cuda_device) : 0;
    const GpuSpread gpu = gpu_spread_over_ranks(gpu_monitor.take_interval(), allocator_peak, comm);
    if (placement.cuda) line.gpu = gpu;
    reporter.interval(line);
    run_times.add(times);
    times = IntervalTimes{};
    return loss;
  }

  // A checkpoint's position at this run's micro-batch and accumulation (Note [Resume position]).
  TrainingPosition position(int64_t global_step, int64_t micro_step, int64_t epoch,
                            int64_t micro_steps_in_epoch, int64_t samples_in_epoch) {
    return {global_step,      micro_step,         epoch, micro_steps_in_epoch,
            optimizer->report().skipped_steps, samples_in_epoch, config.micro_batch,
            config.grad_accum};
  }

  TrainSummary run() {
    Stopwatch run_wall;
    const DatasetInfo& info = dataset.info();
    const EpochTail tail = config.drop_last ? EpochTail::kDrop : EpochTail::kPad;
    const int64_t rank_samples = samples_for_rank(info.train_size, comm.size(), comm.rank(), tail);
    const int64_t micro_steps_per_epoch = batches_per_epoch(rank_samples, config.micro_batch);
    // Note [Run length]: the session's micro-steps, from the resumed position's on, and the
    // updates they make, which the LR schedule plans.
    const int64_t first_epoch_micro_steps = batches_per_epoch(
        samples_for_rank(std::max<int64_t>(0, info.train_size - start.samples_in_epoch),
                         comm.size(), comm.rank(), tail),
        config.micro_batch);
    const RunLength run_length(static_cast<int>(start.epoch), config.epochs,
                               first_epoch_micro_steps, micro_steps_per_epoch, config.grad_accum,
                               start.global_step, config.max_steps);
    // What the log announces: an epoch's updates, give or take one (Note [Run length]).
    const int64_t steps_per_epoch = micro_steps_per_epoch / config.grad_accum;
    const int64_t steps_per_epoch_max =
        (micro_steps_per_epoch + config.grad_accum - 1) / config.grad_accum;
    optimizer->set_lr_schedule(
        LrSchedule(lr_schedule_options(config, run_length.last_global_step())).params());

    const RunStart run_start{config.model,      flat.numel(),       to_string(config.precision),
                             config.zero_stage, comm.size(),        placement.describe(),
                             info.train_size,   steps_per_epoch,    steps_per_epoch_max,
                             run_length.last_global_step(),         config.micro_batch,
                             config.grad_accum, memory(),           reducer->num_buckets()};
    reporter.run_start(run_start);
    TrainSummary summary = starting_summary(run_start);
    summary.resumed_from = resumed_from;
    summary.steps_redone = reporter.steps_redone();  // Note [Resume record]
    summary.data_store = to_string(config.data_store);
    // Note [Step position]: the run's constants; after() places each step.
    StepPosition run_steps;
    run_steps.epochs = config.epochs;
    run_steps.last_global_step = run_length.last_global_step();
    run_steps.global_batch = summary.global_batch;
    if (placement.cuda && !model->forward_flops_per_sample())
      reporter.say("MFU: unknown for %s (hpc_train counts the FLOPs of its built-in models "
                   "only); summary.json reports mfu 0\n", config.model.c_str());

    int64_t global_step = start.global_step;  // optimizer steps taken or skipped
    int64_t micro_step = start.micro_step;    // over the whole run
    int64_t session_micro_step = 0;           // this session's micro-steps (Note [Run length])
    // Micro-steps accumulated towards the next update; checkpoints (hence resumes) fall where
    // it is 0, so a resumed run's first update is a whole one at its own --grad-accum.
    int64_t micro_steps_since_update = 0;
    // An epoch that ended inside an update has its epoch-end checkpoint at that update's end.
    bool epoch_end_checkpoint_due = false;
    // The losses of an update's micro-steps before an epoch's end, for the next log interval.
    LossSum carried_loss;
    // The step a CUDA graph captures (GraphedStep): host timers mean nothing inside a capture.
    // Captured only without accumulation (capture_steps), so its window is one micro-step.
    const auto enqueue_whole_step = [&](const DeviceBatch& static_batch) {
      IntervalTimes ignored;
      forward_backward(static_batch, /*sync=*/true, /*window_micro_steps=*/1, ignored);
      optimizer->step();
    };
    // What a capture that failed inside the step leaves (Note [Failed capture] in step_graph.h).
    const auto discard_partial_step = [&] { reducer->discard_backward(); };
    CudaProfilerRange profiler_range(config.cuda_profiler_start_step, config.cuda_profiler_steps,
                                     placement.cuda);
    ThroughputClock throughput(start.global_step + 1);
    StorageReadClock storage_reads;
    CheckpointCadence checkpoint_cadence(config.checkpoint_every, config.checkpoint_every_minutes);
    StepAgreement agreement(comm);  // Note [Stop agreement]
    bool reached_max_steps = config.max_steps > 0 && global_step >= config.max_steps;
    for (int epoch = static_cast<int>(start.epoch);
         epoch < config.epochs && !reached_max_steps && summary.stop_signal == 0; ++epoch) {
      Stopwatch epoch_wall;
      // Note [Resume position]: a resumed epoch goes on at the permutation position its
      // checkpoint had reached, whatever world size, micro-batch and accumulation reached it.
      const int64_t first_position = epoch == start.epoch ? start.samples_in_epoch : 0;
      const int64_t global_micro_batch = static_cast<int64_t>(config.micro_batch) * comm.size();
      // Micro-batches of the epoch behind us, counted at this run's micro-batch (display, and
      // the augmentation draws, which follow a batch's place in the epoch).
      const int64_t consumed_micro_steps = first_position / global_micro_batch;
      EpochBatches batches(*train_input, dataset,
                           store ? store->start_epoch(config.seed, epoch, tail, first_position)
                                 : rank_epoch_indices(config.seed, epoch, info.train_size,
                                                      comm.size(), comm.rank(), tail,
                                                      /*shuffle=*/true, first_position),
                           config.micro_batch, config.prefetch_batches, epoch,
                           consumed_micro_steps, train_split_resident,
                           store ? &*store : nullptr);
      if (batches.batches() != run_length.micro_steps_in_epoch(epoch))
        throw Error("internal: epoch " + std::to_string(epoch + 1) + " has " +
                    std::to_string(batches.batches()) + " micro-batches, the run planned " +
                    std::to_string(run_length.micro_steps_in_epoch(epoch)));
      const int64_t epoch_end_micro_steps = consumed_micro_steps + batches.batches();
      IntervalTimes times;
      times.loss_sum = carried_loss.sum;
      times.loss_micro_steps = carried_loss.micro_steps;
      carried_loss = {};
      double epoch_loss_sum = 0.0;
      int64_t epoch_micro_steps = consumed_micro_steps;
      int64_t samples_in_epoch = first_position;  // positions consumed by all ranks together
      int64_t step_in_epoch = run_length.updates_done_in_epoch(epoch, consumed_micro_steps);
      StepPosition epoch_steps = run_steps;
      epoch_steps.steps_per_epoch = run_length.updates_in_epoch(epoch, consumed_micro_steps);
      // The last step taken, for the log, the bar and the epoch's end; until this epoch's first
      // step, the run's step before it.
      StepPosition at = epoch_steps.after(epoch, step_in_epoch - 1, global_step);
      throughput.epoch_started();
      bool have_batch = batches.prepare_next(&times.data_wait_ms);
      while (have_batch) {
        const int64_t batch_size = batches.prepared_size();
        ++micro_step;
        ++micro_steps_since_update;
        const int window_micro_steps = run_length.window_micro_steps(session_micro_step);
        const bool sync = run_length.ends_update(session_micro_step++);
        if (micro_steps_since_update == 1) profiler_range.step_begins(global_step + 1);
        const bool graph_wanted =
            graphed_step->wanted(sync, buckets_rebuilt, batch_size == config.micro_batch,
                                 global_step - start.global_step);
        bool replayed = false;
        if (graph_wanted && graphed_step->captured()) {
          // Note [One input kernel] (device_input.cpp): into the graph's buffers directly.
          DeviceBatch& graph_input = graphed_step->static_batch();
          batches.take_into(graph_input.input, graph_input.labels);
          graphed_step->replay(global_step, comm);
          replayed = true;
        } else {
          const DeviceBatch batch = batches.take();
          replayed = graph_wanted &&
                     graphed_step->run({in_model_layout(batch.input, channels_last), batch.labels},
                                       global_step, enqueue_whole_step,
                                       discard_partial_step, comm, reporter);
          if (!replayed) {
            forward_backward(batch, sync, window_micro_steps, times);
            if (sync) optimizer_step(times);
          }
        }
        if (sample_trace.on()) sample_trace.write(epoch, global_step + 1, batches.taken_indices());
        if (replayed) ++summary.graph_replays;
        ++interval_loss_micro_steps;
        ++epoch_micro_steps;
        samples_in_epoch += batch_size * comm.size();  // every rank's batch has this size
        times.samples += batch_size;
        // The next batch's copy overlaps the step just queued on the GPU.
        have_batch = batches.prepare_next(&times.data_wait_ms);
        if (!sync) continue;
        micro_steps_since_update = 0;
        ++global_step;
        ++times.steps;
        profiler_range.step_ended(global_step);
        if (!replayed) ++times.phase_timed_steps;
        reached_max_steps = config.max_steps > 0 && global_step >= config.max_steps;
        at = epoch_steps.after(epoch, step_in_epoch, global_step);
        const bool last_of_epoch = step_in_epoch + 1 >= epoch_steps.steps_per_epoch ||
                                   reached_max_steps || !have_batch;
        if ((step_in_epoch + 1) % config.log_every == 0 || last_of_epoch) {
          const LossSum taken = take_interval_loss();
          times.loss_sum += taken.sum;
          times.loss_micro_steps += taken.micro_steps;
          epoch_loss_sum += taken.sum;
          shown_loss = log_interval(at, times);
        }
        // After the log, which waits for the GPU at its interval: asynchronous steps are counted
        // when they have run.
        if (graphed_step->take_captured_now()) {
          torch::cuda::synchronize();
          throughput.restart_after(global_step);
        } else {
          throughput.step_ended(global_step, batch_size * window_micro_steps);
        }
        reporter.progress(at, shown_loss);
        ++step_in_epoch;
        auto here = [&] {
          return position(global_step, micro_step, epoch, epoch_micro_steps, samples_in_epoch);
        };
        const StepAgreement::Agreed agreed =
            agreement.after_step(stop_signal_received(), checkpoint_cadence.take_minutes_elapsed());
        summary.stop_signal = agreed.stop_signal;
        if (summary.stop_signal != 0) {
          summary.last_checkpoint = checkpoints->save(here(), stop_signal_name(summary.stop_signal),
                                                      RunCheckpoints::Write::kNow);
          break;
        }
        const char* why = epoch_end_checkpoint_due
                              ? "epoch end"
                              : checkpoint_cadence.due(global_step, agreed.checkpoint_minutes_elapsed);
        if (why) {
          summary.last_checkpoint =
              checkpoints->save(here(), why, RunCheckpoints::Write::kBackground);
          checkpoint_cadence.checkpoint_written();
          epoch_end_checkpoint_due = false;
        }
        if (reached_max_steps) break;
      }
      // Micro-steps of an update that ends in the next epoch: this epoch's loss, and the next
      // log interval's, whose update they belong to.
      carried_loss = take_interval_loss();
      epoch_loss_sum += carried_loss.sum;
      reporter.end_progress();
      if (summary.stop_signal != 0) break;
      EpochReport ended;
      ended.at = at;
      ended.train_s = epoch_wall.elapsed_ms() / 1e3;
      summary.final_train_loss =
          comm.all_reduce_scalar(epoch_loss_sum) /
          (comm.size() *
           static_cast<double>(std::max<int64_t>(1, epoch_micro_steps - consumed_micro_steps)));
      ended.complete = epoch_micro_steps == epoch_end_micro_steps;
      if (ended.complete) ++summary.epochs_completed;
      if (placement.cuda) at::globalContext().setBenchmarkCuDNN(false);  // Note [cuDNN autotuning]
      summary.test = evaluator->evaluate(*model);
      const StepReport report = optimizer->report();
      ended.train_loss = summary.final_train_loss;
      ended.test = summary.test;
      ended.wall_s = epoch_wall.elapsed_ms() / 1e3;
      ended.loader_wait_s = batches.loader_wait_ms() / 1e3;
      ended.storage_reads = storage_reads.epoch_ended(comm);
      ended.skipped_steps = report.skipped_steps;
      ended.loss_scale = report.loss_scale;
      reporter.epoch(ended);
      // Checkpoints fall on optimizer-step boundaries: an epoch that ends inside an update has
      // its checkpoint at that update's end (Note [Run length]).
      if (config.checkpoint_epochs && micro_steps_since_update != 0) epoch_end_checkpoint_due = true;
      if (config.checkpoint_epochs && micro_steps_since_update == 0) {
        const TrainingPosition here =
            ended.complete
                ? position(global_step, micro_step, epoch + 1, 0, 0)
                : position(global_step, micro_step, epoch, epoch_micro_steps, samples_in_epoch);
        summary.last_checkpoint = checkpoints->save(
            here, ended.complete ? "epoch end" : "max steps", RunCheckpoints::Write::kBackground);
        checkpoint_cadence.checkpoint_written();
      }
    }
    agreement.finish();
    checkpoints->wait_for_writes();  // Note [Background checkpoint writes]
    if (!config.export_weights.empty() && summary.stop_signal == 0 && comm.rank() == 0) {
      write_weights_safetensors(config.export_weights, model_checkpoint(info, *model, global_step));
      reporter.say("Weights exported to %s\n", config.export_weights.c_str());
    }
    summary.steps = global_step;
    const StepReport report = optimizer->report();
    summary.skipped_steps = report.skipped_steps;
    summary.loss_scale = report.loss_scale;
    summary.memory = memory();
    summary.breakdown = run_times.breakdown(comm.size(), config.zero_stage == 2);
    summary.wall_s = run_wall.elapsed_ms() / 1e3;
    summary.storage_reads = storage_reads.since_start(comm);
    add_throughput(summary, throughput, comm);
    if (store) {
      add_data_store_figures(summary, *store, global_step - start.global_step, comm);
      reporter.say("Data store: exchanges took %.3f ms per step (the slowest rank's mean)\n",
                   summary.data_store_exchange_ms_per_step);
    }
    if (placement.cuda)
      add_gpu_figures(summary, placement.cuda_device, config.precision,
                      model->forward_flops_per_sample(), comm);
    return summary;
  }
};

namespace {

// `body`'s result; LibTorch's errors become ours, with LibTorch's own message and without its C++
// backtrace.
template <typename Body>
auto without_libtorch_backtrace(Body&& body) -> decltype(body()) {
  try {
    return body();
  } catch (const c10::Error& e) {
    throw Error(std::string("LibTorch: ") + e.what_without_backtrace());
  }
}

}  // namespace

Trainer::Trainer(const TrainConfig& config, const DatasetFile& dataset, MPI_Comm comm,
                 const TrainerOutput& output, Placement placement, StartupPhases* startup)
    : impl_(without_libtorch_backtrace([&] {
        return std::make_unique<Impl>(config, dataset, comm, output, placement, startup);
      })) {}

Trainer::~Trainer() = default;

TrainSummary Trainer::run() {
  return without_libtorch_backtrace([this] { return impl_->run(); });
}

EvalResult Trainer::evaluate() { return impl_->evaluator->evaluate(*impl_->model); }

at::Tensor Trainer::flat_parameters() const {
  return impl_->flat.to_logical(impl_->flat.values()).to(at::kFloat).cpu();
}

MemoryBytes Trainer::memory() const { return impl_->memory(); }

std::vector<std::pair<std::string, double>> Trainer::last_reducer_events() const {
  std::vector<std::pair<std::string, double>> events;
  for (const ReducerEvent& e : impl_->reducer->events())
    events.emplace_back(e.describe(), e.time_ms);
  return events;
}

}  // namespace hpc_train
