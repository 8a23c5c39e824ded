#include "hpc_train/trainer.h"

#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>

#include "hpc_train/batch_loader.h"
#include "hpc_train/checkpoint.h"
#include "hpc_train/checkpoint_files.h"
#include "hpc_train/comm.h"
#include "hpc_train/device_input.h"
#include "hpc_train/epoch_batches.h"
#include "hpc_train/epoch_plan.h"
#include "hpc_train/error.h"
#include "hpc_train/flat_parameters.h"
#include "hpc_train/gpu_monitor.h"
#include "hpc_train/loss_scaler.h"
#include "hpc_train/lr_schedule.h"
#include "hpc_train/metrics.h"
#include "hpc_train/models.h"
#include "hpc_train/reducer.h"
#include "hpc_train/run_report.h"
#include "hpc_train/runtime.h"
#include "hpc_train/step_graph.h"
#include "hpc_train/stop_signal.h"
#include "hpc_train/training_state.h"
#include "hpc_train/zero_optimizer.h"

namespace hpc_train {

namespace {

// Evaluation batches are larger than training ones: no gradients are kept, and the result does
// not depend on the batch size.
constexpr int64_t kEvalBatchSamples = 256;
constexpr double kBytesPerMiB = 1024.0 * 1024.0;
// --resident-data auto keeps the train split on the GPU up to this size (CIFAR-10: 154 MB).
constexpr int64_t kAutoResidentBytes = int64_t{4} << 30;
// Eager steps before a step is captured as a CUDA graph: the first one's gradients decide the
// bucket layout, and LibTorch initialises its libraries' handles and workspaces in the first
// few (as torch.cuda.graphs asks for warm-up iterations).
constexpr int64_t kEagerStepsBeforeCapture = 3;

torch::Dtype model_dtype(const std::string& precision) {
  if (precision == "fp16") return torch::kHalf;
  if (precision == "bf16") return torch::kBFloat16;
  return torch::kFloat;
}

}  // namespace

void set_compute_threads(int threads) { at::set_num_threads(std::max(1, threads)); }

struct Trainer::Impl {
  TrainConfig config;
  const DatasetFile& dataset;
  Communicator comm;
  TrainerOutput output;
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
  std::shared_ptr<Model> model;
  FlatParameters flat;
  std::optional<Reducer> reducer;
  std::optional<ZeroOptimizer> optimizer;
  std::optional<LossScalerOptions> loss_scaling;  // fp16: how the optimizer scales the loss
  std::optional<DeviceInput> train_input;
  std::optional<DeviceInput> eval_input;
  bool train_split_resident = false;
  torch::Tensor interval_loss;       // summed micro-batch losses since the last log (fp64 [])
  bool channels_last = false;        // inputs in NHWC (cuDNN's fast layout on tensor cores)
  StepGraph step_graph;              // --cuda-graph: the captured training step
  bool use_step_graph = false;       // whether steps are captured and replayed
  bool graph_captured_now = false;   // the step just run captured the graph
  torch::Tensor graph_input;         // the captured step's static input buffers
  torch::Tensor graph_labels;
  bool buckets_rebuilt = false;
  JsonlWriter metrics;
  bool is_printer = false;  // rank 0 with printing on
  TrainingPosition start;   // where run() begins: zero, or a resumed checkpoint's position
  SampleTrace sample_trace; // test-only (SampleTrace)
  std::string resumed_from; // the checkpoint file, empty for a fresh start
  IntervalTimes run_times;  // every log interval of the run, added up
  double shown_loss = 0.0;  // the last log interval's loss, for the progress bar

  Impl(const TrainConfig& c, const DatasetFile& d, MPI_Comm mpi_comm, TrainerOutput out,
       Placement where)
      : config(c), dataset(d), comm(mpi_comm, where.backend, where.cuda_device),
        output(std::move(out)), placement(where),
        device(where.cuda ? torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(where.cuda_device))
                          : torch::Device(torch::kCPU)),
        dtype(model_dtype(c.precision)),
        gpu_monitor(where.cuda ? where.cuda_device : -1),
        training_stream(where.cuda),
        sample_trace(comm.rank()) {
    comm.set_timeout(config.comm_timeout_s);
    const DatasetInfo& info = dataset.info();
    torch::manual_seed(config.seed);
    model = make_model(config.model, {info.channels, info.height, info.width, info.num_classes});
    model->to(device, dtype);
    check_model_runs_in_dtype(info);
    std::vector<std::string> names;
    std::vector<at::Tensor> parameters;
    for (const auto& item : model->named_parameters()) {
      names.push_back(item.key());
      parameters.push_back(item.value());
    }
    ReducerOptions reducer_options;
    reducer_options.first_bucket_bytes = static_cast<int64_t>(config.first_bucket_mb * kBytesPerMiB);
    reducer_options.bucket_bytes = static_cast<int64_t>(config.bucket_mb * kBytesPerMiB);
    reducer_options.overlap = config.overlap_comm;
    reducer_options.reduce_scatter = config.zero_stage == 2;
    BucketLayout layout = Reducer::initial_layout(parameters, reducer_options, comm.size());
    flat = FlatParameters(std::move(names), std::move(parameters), std::move(layout));
    // Every rank starts from rank 0's parameters and buffers.
    comm.broadcast(flat.values(), 0).wait();
    broadcast_buffers();
    reducer.emplace(flat, comm, reducer_options);
    ZeroOptions zero;
    zero.stage = config.zero_stage;
    zero.adam = adam_options(config.optimizer, config.lr, config.beta1, config.beta2, config.eps,
                             config.weight_decay);
    zero.clip_grad = config.clip_grad;
    zero.check_overflow = config.precision == "fp16";
    if (config.precision == "fp16") {
      LossScalerOptions scaling;
      scaling.fixed_scale = config.loss_scale;
      scaling.initial_scale_power = config.initial_scale_power;
      scaling.scale_window = config.loss_scale_window;
      scaling.hysteresis = config.hysteresis;
      scaling.min_scale = config.min_loss_scale;
      loss_scaling = scaling;
      zero.loss_scaling = scaling;
    }
    optimizer.emplace(flat, *reducer, comm, zero);
    train_input.emplace(info, device, dtype, default_augmentation(info, config.augment),
                        config.seed, comm.rank(), config.micro_batch);
    eval_input.emplace(info, device, dtype, AugmentOptions{}, config.seed, comm.rank(),
                       kEvalBatchSamples);
    const int64_t resident_bytes = resident_split_bytes(info, Split::kTrain);
    train_split_resident = config.resident_data == "on" ||
                           (config.resident_data == "auto" && placement.cuda &&
                            resident_bytes <= kAutoResidentBytes);
    if (train_split_resident) train_input->keep_split_resident(dataset, Split::kTrain);
    channels_last = placement.cuda && config.channels_last;
    if (placement.cuda) {
      at::globalContext().setBenchmarkCuDNN(config.cudnn_benchmark);
      at::globalContext().setDeterministicCuDNN(config.deterministic);
    }
    interval_loss = torch::zeros({}, torch::TensorOptions().dtype(torch::kDouble).device(device));
    use_step_graph = placement.cuda && config.cuda_graph != "off" && cuda_graphs_available() &&
                     placement.backend != CommBackendKind::kMpi && config.grad_accum == 1;
    if (config.cuda_graph == "on" && !use_step_graph)
      throw ConfigError("--cuda-graph on needs a GPU build, --device cuda, the nccl (or none) "
                        "backend and --grad-accum 1; use --cuda-graph auto or off");
    is_printer = output.print && comm.rank() == 0;
    if (comm.rank() == 0 && !output.run_dir.empty())
      metrics = JsonlWriter(output.run_dir + "/metrics.jsonl");
    const std::string checkpoint = checkpoint_to_resume();
    if (!checkpoint.empty()) resume(checkpoint);
  }

  // --resume: "" starts fresh, "auto" takes the run directory's newest complete checkpoint (or
  // starts fresh when there is none), anything else names a file. Rank 0 looks, every rank
  // gets its answer. Collective.
  std::string checkpoint_to_resume() {
    if (config.resume != "auto") return config.resume;
    std::string found;
    if (comm.rank() == 0) {
      std::vector<std::string> warnings;
      found = find_latest_checkpoint(config.run_dir, &warnings).value_or("");
      for (const std::string& warning : warnings)
        std::fprintf(stderr, "warning: %s\n", warning.c_str());
      if (is_printer && found.empty())
        std::printf("--resume auto: no checkpoint in %s yet, starting fresh\n",
                    checkpoint_directory(config.run_dir).c_str());
    }
    return broadcast_string(comm.mpi_comm(), found, 0);
  }

  // Everything a later run needs to continue from `position`. Collective (the optimizer state
  // is gathered from its partitions).
  Checkpoint make_checkpoint(const TrainingPosition& position) {
    Checkpoint c = model_checkpoint(config.model, dataset.info(), *model, position.global_step);
    add_optimizer_and_rng_state(c, optimizer->gather_full_state());
    c.precision = config.precision;
    c.zero_stage = config.zero_stage;
    c.world_size = comm.size();
    c.config_ini = to_ini(config);
    c.position = position;
    c.has_loss_scaler = loss_scaling.has_value();
    c.loss_scaler_dynamic = loss_scaling && loss_scaling->fixed_scale <= 0;
    c.loss_scaler = optimizer->report().scaler;
    return c;
  }

  // Writes the checkpoint of `position` into the run directory and keeps the newest
  // --keep-checkpoints. Collective. Returns the file.
  std::string save_checkpoint(const TrainingPosition& position, const char* why) {
    if (config.run_dir.empty()) return "";  // a Trainer without a run directory (tests)
    Stopwatch wall;
    // Every rank passes the same contents to write_checkpoint, which may write any rank's bytes
    // (and their crc32): BatchNorm statistics, updated by each rank from its own batches, are
    // made rank 0's first, as evaluate() does.
    broadcast_buffers();
    const std::string path = checkpoint_path(config.run_dir, position.global_step);
    write_checkpoint(comm.mpi_comm(), path, make_checkpoint(position));
    if (comm.rank() == 0) prune_checkpoints(config.run_dir, config.keep_checkpoints);
    const double seconds = wall.elapsed_ms() / 1e3;
    metrics.write({{"kind", "checkpoint"},
                   {"step", position.global_step},
                   {"epoch", position.epoch + 1},
                   {"why", why},
                   {"path", path},
                   {"write_s", seconds}});
    if (is_printer) {
      std::printf("%sCheckpoint (%s) after step %lld: %s in %.2f s\n",
                  output.progress_bar ? "\n" : "", why,
                  static_cast<long long>(position.global_step), path.c_str(), seconds);
      std::fflush(stdout);
    }
    return path;
  }

  // Continues from the checkpoint at `path`: parameters and buffers, optimizer state
  // (re-partitioned for this world size), loss scaler, random state and the position.
  // A checkpoint of another model or input is a DataError.
  void resume(const std::string& path) {
    const Checkpoint c = read_checkpoint(path);
    optimizer->load_full_state(restore_model_and_rng(c, path, config.model, dataset.info(), *model,
                                                     flat.numel(), device));
    // Note [Scaler on resume] (checkpoint.h).
    const bool continue_scaler = continues_loss_scaler(c, loss_scaling);
    const LossScalerState scaler_state =
        continue_scaler ? c.loss_scaler
                        : (loss_scaling ? LossScaler(*loss_scaling).state() : LossScalerState{});
    optimizer->resume(c.position.global_step, c.optimizer_steps, scaler_state);
    if (is_printer && !continue_scaler && (c.has_loss_scaler || loss_scaling))
      std::printf("Loss scaling: the checkpoint's (%s) does not carry over to this run's (%s); "
                  "starting at scale %g\n",
                  describe_loss_scaling(c.precision, c.has_loss_scaler, c.loss_scaler_dynamic,
                                        c.loss_scaler.scale)
                      .c_str(),
                  describe_loss_scaling(config.precision, loss_scaling.has_value(),
                                        loss_scaling && loss_scaling->fixed_scale <= 0,
                                        scaler_state.scale)
                      .c_str(),
                  scaler_state.scale);
    start = c.position;
    // A version 1 checkpoint did not record the position in samples; it continued at its
    // micro-steps times this run's micro-batch and world size, which is right when they are the
    // saving run's (or keep its global batch).
    if (start.samples_in_epoch < 0)
      start.samples_in_epoch = start.micro_steps_in_epoch * config.micro_batch * comm.size();
    resumed_from = path;
    if (is_printer) {
      std::printf("Resumed from %s: step %lld, epoch %lld, %lld samples into it (saved by %d "
                  "rank(s), continuing on %d)\n",
                  path.c_str(), static_cast<long long>(c.position.global_step),
                  static_cast<long long>(c.position.epoch + 1),
                  static_cast<long long>(start.samples_in_epoch), c.world_size, comm.size());
      std::fflush(stdout);
    }
  }

  // LibTorch lacks some kernels for some dtypes on some devices (1.13 has no fp16 convolution
  // on the CPU): one tiny forward finds out before training, with a message that says what to
  // do instead of a LibTorch backtrace from the first step.
  void check_model_runs_in_dtype(const DatasetInfo& info) {
    if (dtype == torch::kFloat) return;
    torch::NoGradGuard no_grad;
    model->eval();
    try {
      model->forward(torch::zeros({1, info.channels, info.height, info.width},
                                  torch::TensorOptions().dtype(dtype).device(device)));
    } catch (const c10::Error& e) {
      throw ConfigError("--precision " + config.precision + ": " + config.model +
                        " cannot run in " + config.precision + " here (" +
                        first_line(e.what_without_backtrace()) +
                        "); use --precision bf16 or fp32 on the CPU, fp16 on a GPU");
    }
  }

  static std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

  // Batch-norm running statistics are updated by each rank from its own batches; like DDP's
  // broadcast_buffers, rank 0's are the model's. They matter only in evaluation (and export).
  void broadcast_buffers() {
    for (auto& buffer : model->buffers()) {
      at::Tensor contiguous = buffer.contiguous();
      comm.broadcast(contiguous, 0).wait();
      if (!contiguous.is_same(buffer)) buffer.copy_(contiguous);
    }
  }

  torch::Tensor in_model_layout(const torch::Tensor& input) const {
    return channels_last ? input.contiguous(at::MemoryFormat::ChannelsLast) : input;
  }


  // Returns the losses summed since the last call and starts a new sum (waits for the device).
  double take_interval_loss() {
    const double sum = interval_loss.item<double>();
    interval_loss.zero_();
    return sum;
  }

  // Note [Gradient averaging]
  // Each rank's loss is the mean over its micro-batch, and every rank's micro-batch has the same
  // size (the epoch plan pads or drops so that it does). The gradient of the mean loss over the
  // global batch (world size W ranks x grad_accum micro-steps) is then the sum, over ranks and
  // micro-steps, of each micro-batch's gradient divided by W * grad_accum. So backward runs on
  // loss * loss_scale / (W * grad_accum), the micro-steps add up in the gradient buffer, and the
  // collectives sum over ranks: no division pass, and fp16 sums stay small. N ranks with
  // micro-batch b then match 1 rank with batch N*b, and 2 micro-steps of b match 1 of 2b.
  void forward_backward(const DeviceBatch& batch, bool sync, IntervalTimes& times) {
    Stopwatch phase;
    model->train();
    const torch::Tensor logits = model->forward(in_model_layout(batch.input));
    const torch::Tensor loss = torch::nn::functional::cross_entropy(logits.to(torch::kFloat), batch.labels);
    times.forward_ms += phase.elapsed_ms();
    phase.restart();
    reducer->begin_backward(sync);
    const double averaging = 1.0 / (comm.size() * static_cast<double>(config.grad_accum));
    optimizer->scale_loss(loss, averaging).backward();
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
  // stay there; log_interval reads them (optimizer_report).
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

  // One whole training step (forward, backward, reduction, optimizer) replayed from a CUDA
  // graph, captured at the first call (step_graph.h). False when capturing failed: the caller
  // runs the step eagerly, and no further capture is tried. `step`: the global step, from 0.
  bool replay_step_graph(const DeviceBatch& batch, int64_t step) {
    if (!step_graph.captured()) {
      graph_input = torch::empty_like(in_model_layout(batch.input));
      graph_labels = torch::empty_like(batch.labels);
      std::string why;
      comm.set_capturing(true);
      const bool captured = step_graph.capture([&] {
        IntervalTimes ignored;  // host timers mean nothing inside a capture
        forward_backward(DeviceBatch{graph_input, graph_labels}, /*sync=*/true, ignored);
        optimizer->step();
      }, &why);
      comm.set_capturing(false);
      if (!captured) {
        use_step_graph = false;
        if (config.cuda_graph == "on") throw Error("--cuda-graph on: capturing the step failed: " + why);
        if (is_printer)
          std::printf("CUDA graph capture failed (%s); the steps run eagerly\n", why.c_str());
        return false;
      }
      graph_captured_now = true;
      if (is_printer) std::printf("Training step captured as a CUDA graph\n");
    }
    graph_input.copy_(in_model_layout(batch.input));
    graph_labels.copy_(batch.labels);
    step_graph.replay(comm, "step " + std::to_string(step + 1));
    return true;
  }

  EvalResult evaluate() {
    broadcast_buffers();
    torch::NoGradGuard no_grad;
    model->eval();
    const int64_t n = dataset.info().test_size;
    BatchLoader loader(dataset, Split::kTest,
                       rank_epoch_indices(config.seed, 0, n, comm.size(), comm.rank(),
                                          EpochTail::kUneven, /*shuffle=*/false),
                       kEvalBatchSamples, config.prefetch_batches);
    double loss_sum = 0.0;
    int64_t correct = 0;
    int64_t samples = 0;
    HostBatch host_batch;
    // Sums stay on the device until the end: no wait for the GPU per batch.
    torch::Tensor loss_total = torch::zeros({}, torch::TensorOptions().dtype(torch::kDouble).device(device));
    torch::Tensor correct_total = torch::zeros({}, torch::TensorOptions().dtype(torch::kLong).device(device));
    while (loader.next(host_batch)) {
      const DeviceBatch batch = eval_input->to_device(host_batch, 0);
      const torch::Tensor logits = model->forward(in_model_layout(batch.input)).to(torch::kFloat);
      loss_total.add_(torch::nn::functional::cross_entropy(
          logits, batch.labels,
          torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum)));
      correct_total.add_(logits.argmax(1).eq(batch.labels).sum());
      samples += host_batch.size;
    }
    loss_sum = loss_total.item<double>();
    correct = correct_total.item<int64_t>();
    EvalResult result;
    result.samples = comm.all_reduce_count(samples);
    result.correct = comm.all_reduce_count(correct);
    const double total_loss = comm.all_reduce_scalar(loss_sum);
    if (result.samples > 0) {
      result.loss = total_loss / static_cast<double>(result.samples);
      result.accuracy = static_cast<double>(result.correct) / static_cast<double>(result.samples);
    }
    return result;
  }

  MemoryBytes memory() const {
    MemoryBytes bytes;
    bytes.parameters = flat.values().numel() * flat.values().element_size();
    bytes.gradients = reducer->gradient_bytes();
    bytes.optimizer_state = optimizer->state_bytes();
    return bytes;
  }

  // Rank 0's log line and metrics record for the interval that ends with this step.
  // Collective (the interval's loss is averaged over ranks).
  // Returns the interval's mean loss.
  double log_interval(int epoch, int64_t step_in_epoch, int64_t steps_per_epoch,
                      int64_t global_step, IntervalTimes& times) {
    const StepReport report = optimizer_report();
    const double steps = static_cast<double>(std::max<int64_t>(1, times.steps));
    const double loss = comm.all_reduce_scalar(times.loss_sum) /
                        (comm.size() * steps * config.grad_accum);
    const double interval_ms = times.wall.elapsed_ms();
    const double samples_per_s = 1e3 * times.samples * comm.size() / interval_ms;
    IntervalReport line;
    line.epoch = epoch;
    line.epochs = config.epochs;
    line.step_in_epoch = step_in_epoch;
    line.steps_per_epoch = steps_per_epoch;
    line.global_step = global_step;
    line.loss = loss;
    line.lr = report.last_lr;
    line.samples_per_s = samples_per_s;
    line.ms_per_step = interval_ms / steps;
    line.buckets = reducer->num_buckets();
    line.show_loss_scale = loss_scaling.has_value();
    line.loss_scale = report.loss_scale;
    line.skipped_steps = report.skipped_steps;
    line.memory = memory();
    line.breakdown = times.breakdown(comm.size(), config.zero_stage == 2);
    // Every rank's GPU figures, min and max over the ranks (collective).
    const int64_t allocator_peak = placement.cuda ? allocator_peak_bytes(placement.cuda_device) : 0;
    const GpuSpread gpu = gpu_spread_over_ranks(gpu_monitor.take_interval(), allocator_peak,
                                                comm.mpi_comm());
    if (placement.cuda) line.gpu = gpu;
    report_interval(line, metrics, is_printer && !output.progress_bar);
    std::fflush(stdout);
    run_times.add(times);
    times = IntervalTimes{};
    return loss;
  }

  // The optimizer's report (a read of the GPU: at log intervals, checkpoints and the end). Ends
  // the run when the device scaler met an overflow at its minimum scale, as the host scaler
  // does at once (LossScaler::update).
  StepReport optimizer_report() {
    const StepReport report = optimizer->report();
    if (report.scaler_failed)
      throw Error("fp16 loss scale reached its minimum (" + std::to_string(config.min_loss_scale) +
                  ") and the gradients still overflow (" + std::to_string(report.skipped_steps) +
                  " step(s) skipped so far). What to try: --precision bf16, a lower --lr, "
                  "gradient clipping (--clip-grad 1.0), or --precision fp32 to see where it "
                  "diverges");
    return report;
  }

  // SIGUSR1/SIGTERM on any rank, agreed by all (stop_signal.h); 0 = go on. Collective.
  int agreed_stop_signal() {
    const int local = stop_signal_received();
    if (comm.size() == 1) return local;
    return static_cast<int>(comm.all_reduce_count(local, ReduceOp::kMax));
  }

  // A checkpoint's position at this run's micro-batch and accumulation (Note [Resume position]).
  TrainingPosition position(int64_t global_step, int64_t micro_step, int64_t epoch,
                            int64_t micro_steps_in_epoch, int64_t samples_in_epoch) {
    return {global_step,      micro_step,         epoch, micro_steps_in_epoch,
            optimizer_report().skipped_steps, samples_in_epoch, config.micro_batch,
            config.grad_accum};
  }

  TrainSummary run() {
    Stopwatch run_wall;
    const DatasetInfo& info = dataset.info();
    const EpochTail tail = config.drop_last ? EpochTail::kDrop : EpochTail::kPad;
    const int64_t rank_samples = samples_for_rank(info.train_size, comm.size(), comm.rank(), tail);
    const int64_t micro_steps_per_epoch = batches_per_epoch(rank_samples, config.micro_batch);
    // Micro-steps carry over epoch boundaries (as DeepSpeed counts them), so an epoch has this
    // many optimizer steps, give or take one.
    const int64_t steps_per_epoch = std::max<int64_t>(1, micro_steps_per_epoch / config.grad_accum);
    int64_t total_steps = steps_per_epoch * config.epochs;
    if (config.max_steps > 0) total_steps = std::min(total_steps, config.max_steps);
    LrScheduleOptions schedule_options;
    schedule_options.kind = config.lr_schedule;
    schedule_options.lr = config.lr;
    schedule_options.warmup_steps = config.warmup_steps;
    schedule_options.warmup_type = config.warmup_type;
    schedule_options.warmup_start_ratio = config.warmup_start_ratio;
    schedule_options.cosine_final_ratio = config.cosine_final_ratio;
    schedule_options.total_steps = config.schedule_steps > 0 ? config.schedule_steps : total_steps;
    optimizer->set_lr_schedule(LrSchedule(schedule_options).params());

    TrainSummary summary;
    summary.world_size = comm.size();
    summary.model = config.model;
    summary.parameters = flat.numel();
    summary.zero_stage = config.zero_stage;
    summary.precision = config.precision;
    summary.placement = placement.describe();
    summary.global_batch =
        static_cast<int64_t>(config.micro_batch) * config.grad_accum * comm.size();
    if (is_printer) {
      const MemoryBytes bytes = memory();
      std::printf("Training %s (%lld parameters, %s, ZeRO stage %d) on %d rank(s) (rank 0: %s): "
                  "%lld samples, "
                  "%lld steps per epoch, global batch %lld (%d x %d micro-steps x %d ranks)\n"
                  "Per rank: parameters %.2f MB, gradients %.2f MB, optimizer state %.2f MB; "
                  "%zu gradient buckets\n",
                  config.model.c_str(), static_cast<long long>(flat.numel()),
                  config.precision.c_str(), config.zero_stage, comm.size(),
                  placement.describe().c_str(), static_cast<long long>(info.train_size),
                  static_cast<long long>(steps_per_epoch),
                  static_cast<long long>(summary.global_batch), config.micro_batch,
                  config.grad_accum, comm.size(), bytes.parameters / 1e6, bytes.gradients / 1e6,
                  bytes.optimizer_state / 1e6, reducer->num_buckets());
    }

    int64_t global_step = start.global_step;  // optimizer steps taken or skipped
    int64_t micro_step = start.micro_step;    // over the whole run
    // Micro-steps accumulated towards the next update; checkpoints (hence resumes) fall where
    // it is 0, so a resumed run's first update is a whole one at its own --grad-accum.
    int64_t micro_steps_since_update = 0;
    summary.resumed_from = resumed_from;
    // Throughput is timed from the end of the first step (set-up and first-use costs), or of
    // the step that captured the CUDA graph, to the end.
    int64_t timed_after_step = start.global_step + 1;
    int64_t timed_steps = 0;
    int64_t samples_after_first_step = 0;  // per rank
    double train_ms_after_first_step = 0.0;
    bool reached_max_steps = false;
    reached_max_steps = config.max_steps > 0 && global_step >= config.max_steps;
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
                           rank_epoch_indices(config.seed, epoch, info.train_size, comm.size(),
                                              comm.rank(), tail, /*shuffle=*/true, first_position),
                           config.micro_batch, config.prefetch_batches, epoch,
                           consumed_micro_steps, train_split_resident);
      const int64_t epoch_end_micro_steps = consumed_micro_steps + batches.batches();
      IntervalTimes times;
      double epoch_loss_sum = 0.0;
      int64_t epoch_micro_steps = consumed_micro_steps;
      int64_t samples_in_epoch = first_position;  // positions consumed by all ranks together
      int64_t step_in_epoch = consumed_micro_steps / config.grad_accum;
      Stopwatch step_wall;
      bool have_batch = batches.prepare_next(&times.data_wait_ms);
      while (have_batch) {
        const int64_t batch_size = batches.prepared_size();
        const DeviceBatch batch = batches.take();
        if (sample_trace.on()) sample_trace.write(epoch, global_step + 1, batches.taken_indices());
        ++micro_step;
        const bool sync = ++micro_steps_since_update == config.grad_accum;
        // Captured steps need the final bucket layout, warmed-up libraries and full batches.
        const bool replayed = use_step_graph && sync && buckets_rebuilt &&
                              batch_size == config.micro_batch &&
                              global_step - start.global_step >= kEagerStepsBeforeCapture &&
                              replay_step_graph(batch, global_step);
        if (replayed) {
          ++summary.graph_replays;
        } else {
          forward_backward(batch, sync, times);
          if (sync) optimizer_step(times);
        }
        ++epoch_micro_steps;
        samples_in_epoch += batch_size * comm.size();  // every rank's batch has this size
        times.samples += batch_size;
        // The next batch's copy overlaps the step just queued on the GPU.
        have_batch = batches.prepare_next(&times.data_wait_ms);
        if (!sync) continue;
        micro_steps_since_update = 0;
        ++global_step;
        ++times.steps;
        if (!replayed) ++times.phase_timed_steps;
        reached_max_steps = config.max_steps > 0 && global_step >= config.max_steps;
        const bool last_of_epoch =
            step_in_epoch + 1 >= steps_per_epoch || reached_max_steps || !have_batch;
        if ((step_in_epoch + 1) % config.log_every == 0 || last_of_epoch) {
          const double interval_loss_sum = take_interval_loss();
          times.loss_sum += interval_loss_sum;
          epoch_loss_sum += interval_loss_sum;
          shown_loss = log_interval(epoch, step_in_epoch, steps_per_epoch, global_step, times);
        }
        // After the log, which waits for the GPU at its interval: asynchronous steps are counted
        // when they have run.
        if (graph_captured_now) {
          graph_captured_now = false;
          torch::cuda::synchronize();
          timed_after_step = global_step;
          timed_steps = 0;
          samples_after_first_step = 0;
          train_ms_after_first_step = 0.0;
        } else if (global_step > timed_after_step) {
          ++timed_steps;
          samples_after_first_step += batch_size * config.grad_accum;
          train_ms_after_first_step += step_wall.elapsed_ms();
        }
        step_wall.restart();
        if (is_printer && output.progress_bar)
          print_progress_bar(epoch, config.epochs, step_in_epoch, steps_per_epoch, shown_loss);
        ++step_in_epoch;
        auto here = [&] {
          return position(global_step, micro_step, epoch, epoch_micro_steps, samples_in_epoch);
        };
        summary.stop_signal = agreed_stop_signal();
        if (summary.stop_signal != 0) {
          summary.last_checkpoint = save_checkpoint(here(), stop_signal_name(summary.stop_signal));
          break;
        }
        if (config.checkpoint_every > 0 && global_step % config.checkpoint_every == 0)
          summary.last_checkpoint = save_checkpoint(here(), "periodic");
        if (reached_max_steps) break;
      }
      // Micro-steps of an accumulation that carries over into the next epoch.
      epoch_loss_sum += take_interval_loss();
      if (is_printer && output.progress_bar) std::printf("\n");
      if (summary.stop_signal != 0) break;
      const double epoch_train_ms = epoch_wall.elapsed_ms();
      summary.final_train_loss =
          comm.all_reduce_scalar(epoch_loss_sum) /
          (comm.size() *
           static_cast<double>(std::max<int64_t>(1, epoch_micro_steps - consumed_micro_steps)));
      const bool epoch_complete = epoch_micro_steps == epoch_end_micro_steps;
      if (epoch_complete) ++summary.epochs_completed;
      summary.test = evaluate();
      const StepReport report = optimizer_report();
      metrics.write({{"kind", "epoch"},
                     {"epoch", epoch + 1},
                     {"complete", epoch_complete},
                     {"steps", global_step},
                     {"train_loss", summary.final_train_loss},
                     {"test_loss", summary.test.loss},
                     {"test_accuracy", summary.test.accuracy},
                     {"epoch_train_s", epoch_train_ms / 1e3},
                     {"epoch_s", epoch_wall.elapsed_ms() / 1e3},
                     {"loader_wait_s", batches.loader_wait_ms() / 1e3},
                     {"skipped_steps", report.skipped_steps},
                     {"loss_scale", report.loss_scale}});
      // Checkpoints fall on optimizer-step boundaries: an epoch that ends inside a gradient
      // accumulation is not one.
      if (config.checkpoint_epochs && micro_steps_since_update == 0) {
        const TrainingPosition here =
            epoch_complete
                ? position(global_step, micro_step, epoch + 1, 0, 0)
                : position(global_step, micro_step, epoch, epoch_micro_steps, samples_in_epoch);
        summary.last_checkpoint = save_checkpoint(here, epoch_complete ? "epoch end" : "max steps");
      }
      if (is_printer)
        std::printf("Epoch [%d/%d] %s in %.1f s: train loss %.4f, test loss %.4f, test accuracy "
                    "%.2f%% (%lld/%lld)\n",
                    epoch + 1, config.epochs, epoch_complete ? "done" : "stopped (max steps)",
                    epoch_wall.elapsed_ms() / 1e3, summary.final_train_loss, summary.test.loss,
                    100.0 * summary.test.accuracy, static_cast<long long>(summary.test.correct),
                    static_cast<long long>(summary.test.samples));
      std::fflush(stdout);
    }
    if (!config.export_weights.empty() && summary.stop_signal == 0 && comm.rank() == 0) {
      write_weights_safetensors(config.export_weights,
                                model_checkpoint(config.model, info, *model, global_step));
      if (is_printer) std::printf("Weights exported to %s\n", config.export_weights.c_str());
    }
    summary.steps = global_step;
    const StepReport report = optimizer_report();
    summary.skipped_steps = report.skipped_steps;
    summary.loss_scale = report.loss_scale;
    summary.memory = memory();
    summary.breakdown = run_times.breakdown(comm.size(), config.zero_stage == 2);
    summary.wall_s = run_wall.elapsed_ms() / 1e3;
    if (timed_steps > 0 && train_ms_after_first_step > 0) {
      // Per-rank rates times ranks; the slowest rank sets the pace, so take its time.
      const double slowest_ms = comm.all_reduce_scalar(train_ms_after_first_step, ReduceOp::kMax);
      summary.samples_per_s =
          1e3 * comm.all_reduce_count(samples_after_first_step) / slowest_ms;
      summary.ms_per_step = slowest_ms / static_cast<double>(timed_steps);
    }
    if (placement.cuda) {
      summary.peak_allocated_bytes_per_rank =
          gather_at_root(allocator_peak_bytes(placement.cuda_device), comm.mpi_comm());
      // LibTorch lets cuDNN convolve fp32 in TF32 by default, and convolutions dominate.
      const double peak = peak_flops_per_s(cuda_device_name(placement.cuda_device),
                                           config.precision == "fp32" ? "tf32" : config.precision);
      summary.training_flops_per_sample = training_flops_per_sample(
          config.model, {info.channels, info.height, info.width, info.num_classes});
      summary.mfu = model_flops_utilization(summary.training_flops_per_sample,
                                            summary.samples_per_s, comm.size(), peak);
    }
    return summary;
  }
};

Trainer::Trainer(const TrainConfig& config, const DatasetFile& dataset, MPI_Comm comm,
                 TrainerOutput output, Placement placement)
    : impl_(std::make_unique<Impl>(config, dataset, comm, std::move(output), placement)) {}

Trainer::~Trainer() = default;

TrainSummary Trainer::run() {
  try {
    return impl_->run();
  } catch (const c10::Error& e) {
    // LibTorch's own message, without its C++ backtrace.
    throw Error(std::string("LibTorch: ") + e.what_without_backtrace());
  }
}

EvalResult Trainer::evaluate() { return impl_->evaluate(); }

at::Tensor Trainer::flat_parameters() const {
  return impl_->flat.to_logical(impl_->flat.values()).to(at::kFloat).cpu();
}

MemoryBytes Trainer::memory() const { return impl_->memory(); }

std::vector<std::pair<std::string, double>> Trainer::last_reducer_events() const {
  std::vector<std::pair<std::string, double>> events;
  for (const ReducerEvent& e : impl_->reducer->events()) {
    switch (e.kind) {
      case ReducerEvent::Kind::kCollectiveStarted:
        events.emplace_back("bucket " + std::to_string(e.bucket) + " started", e.time_ms);
        break;
      case ReducerEvent::Kind::kBackwardEnded: events.emplace_back("backward ended", e.time_ms); break;
      case ReducerEvent::Kind::kAllDone: events.emplace_back("all done", e.time_ms); break;
    }
  }
  return events;
}

}  // namespace hpc_train
