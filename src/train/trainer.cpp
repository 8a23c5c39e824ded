#include "hpc_train/train/trainer.h"

#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "hpc_train/error.h"
#include "hpc_train/io/checkpoint.h"
#include "hpc_train/optim/lr_schedule.h"
#include "hpc_train/train/weight_ema.h"
#include "hpc_train/runtime/cuda_profiler.h"
#include "hpc_train/runtime/stop_signal.h"
#include "hpc_train/train/checkpoint_cadence.h"
#include "hpc_train/train/run_options.h"
#include "hpc_train/train/step_agreement.h"
#include "trainer_impl.h"

namespace hpc_train {

void set_compute_threads(int threads) { at::set_num_threads(std::max(1, threads)); }

// The run in progress: its plan, counters, clocks and the summary it builds (Trainer::Impl::run).
struct RunProgress {
  RunProgress(const TrainConfig& config, const TrainingPosition& start, RunLength length,
              Communicator& comm, bool cuda)
      : length(length), global_step(start.global_step), micro_step(start.micro_step),
        reached_max_steps(config.max_steps > 0 && global_step >= config.max_steps),
        profiler_range(config.cuda_profiler_start_step, config.cuda_profiler_steps, cuda),
        throughput(start.global_step + 1),
        checkpoint_cadence(config.checkpoint_every, config.checkpoint_every_minutes),
        agreement(comm) {}

  const RunLength length;  // Note [Run length]
  StepPosition steps;      // the run's constants; after() places each step (Note [Step position])
  TrainSummary summary;
  int64_t global_step;     // optimizer steps taken or skipped
  int64_t micro_step;      // over the whole run
  int64_t session_micro_step = 0;  // this session's micro-steps (Note [Run length])
  // Micro-steps accumulated towards the next update; checkpoints (hence resumes) fall where it is
  // 0, so a resumed run's first update is a whole one at its own --grad-accum.
  int64_t micro_steps_since_update = 0;
  int64_t loss_micro_steps = 0;  // micro-steps in the TrainingStep's loss sum
  // An epoch that ended inside an update has its epoch-end checkpoint at that update's end.
  bool epoch_end_checkpoint_due = false;
  // The losses of an update's micro-steps before an epoch's end, for the next log interval.
  LossSum carried_loss;
  bool reached_max_steps;
  double shown_loss = 0.0;  // the last log interval's loss, for the progress bar
  IntervalTimes times;      // the log interval in progress
  IntervalTimes run_times;  // every log interval of the run, added up
  CudaProfilerRange profiler_range;
  ThroughputClock throughput;
  StorageReadClock storage_reads;
  CheckpointCadence checkpoint_cadence;
  StepAgreement agreement;  // Note [Stop agreement]
};

// One epoch in progress (Trainer::Impl::train_epoch).
struct EpochProgress {
  int epoch = 0;
  // Micro-batches of the epoch behind us at its start (a resumed epoch), counted at this run's
  // micro-batch (display, and the augmentation draws, which follow a batch's place in the epoch).
  int64_t consumed_micro_steps = 0;
  int64_t micro_steps = 0;       // done, consumed_micro_steps included
  int64_t samples = 0;           // positions of its permutation consumed by all ranks together
  int64_t step_in_epoch = 0;     // updates that ended in it
  double loss_sum = 0.0;         // this rank's micro-batch losses of this session
  StepPosition steps;            // the run's, with this epoch's updates
  StepPosition at;               // the last step taken (until its first: the run's before it)
  int64_t complete_micro_steps = 0;  // micro_steps once every batch is trained
  double loader_wait_ms = 0.0;
};

// The epoch loop. What happens around each step is decided by the methods below: train_epoch
// runs the micro-steps (run_micro_step: eager or from the CUDA graph), after_update logs,
// checkpoints and stops, end_epoch evaluates.
TrainSummary Trainer::Impl::run() {
  const Stopwatch run_wall;
  RunProgress run(config, start, plan_run(), comm, placement.cuda);
  start_run(run);
  for (int epoch = static_cast<int>(start.epoch);
       epoch < config.epochs && !run.reached_max_steps && run.summary.stop_signal == 0;
       ++epoch) {
    const Stopwatch epoch_wall;
    const EpochProgress trained = train_epoch(run, epoch);
    if (run.summary.stop_signal != 0) break;
    end_epoch(run, trained, epoch_wall);
  }
  return finish_run(run, run_wall);
}

LossSum Trainer::Impl::take_loss_sum(RunProgress& run) {
  return {step->take_loss_sum(), std::exchange(run.loss_micro_steps, 0)};
}

// Rank 0's log line and metrics record for the interval that ends with the step `at`.
// Collective (the interval's loss is averaged over ranks). Returns the interval's mean loss.
double Trainer::Impl::log_interval(const StepPosition& at, RunProgress& run) {
  IntervalTimes& times = run.times;
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
  line.breakdown = times.breakdown(comm.size(), config.zero_stage >= 1);
  // Every rank's GPU figures, min and max over the ranks (collective).
  const int64_t allocator_peak = placement.cuda ? allocator_peak_bytes(placement.cuda_device) : 0;
  const GpuSpread gpu = gpu_spread_over_ranks(gpu_monitor.take_interval(), allocator_peak, comm);
  if (placement.cuda) line.gpu = gpu;
  reporter.interval(line);
  run.run_times.add(times);
  times = IntervalTimes{};
  return loss;
}

// A checkpoint's position at this run's micro-batch and accumulation (Note [Resume position]).
TrainingPosition Trainer::Impl::position(const RunProgress& run, int64_t epoch,
                                         int64_t micro_steps_in_epoch, int64_t samples_in_epoch) {
  return {run.global_step,      run.micro_step,   epoch, micro_steps_in_epoch,
          optimizer->report().skipped_steps, samples_in_epoch, config.micro_batch,
          config.grad_accum};
}

EpochTail Trainer::Impl::tail() const {
  return config.drop_last ? EpochTail::kDrop : EpochTail::kPad;
}

// The run's length (Note [Run length]: this session's micro-steps, from the resumed position's
// on, and the updates they make, which the LR schedule plans), announced in the log.
RunLength Trainer::Impl::plan_run() {
  const DatasetInfo& info = dataset.info();
  const int64_t rank_samples = samples_for_rank(info.train_size, comm.size(), comm.rank(), tail());
  const int64_t first_epoch_micro_steps = batches_per_epoch(
      samples_for_rank(std::max<int64_t>(0, info.train_size - start.samples_in_epoch),
                       comm.size(), comm.rank(), tail()),
      config.micro_batch);
  const int64_t micro_steps_per_epoch = batches_per_epoch(rank_samples, config.micro_batch);
  const RunLength length(static_cast<int>(start.epoch), config.epochs, first_epoch_micro_steps,
                         micro_steps_per_epoch, config.grad_accum, start.global_step,
                         config.max_steps);
  optimizer->set_lr_schedule(
      LrSchedule(lr_schedule_options(config, length.last_global_step(), micro_steps_per_epoch))
          .params());
  return length;
}

// Announces the run and starts its summary.
void Trainer::Impl::start_run(RunProgress& run) {
  const RunStart run_start{config.model,      flat.numel(),       to_string(config.precision),
                           config.zero_stage, comm.size(),        placement.describe(),
                           dataset.info().train_size,
                           run.length.fewest_updates_per_epoch(),
                           run.length.most_updates_per_epoch(),
                           run.length.last_global_step(),         config.micro_batch,
                           config.grad_accum, memory(),           reducer->num_buckets()};
  reporter.run_start(run_start);
  run.summary = starting_summary(run_start);
  run.summary.resumed_from = resumed_from;
  run.summary.steps_redone = reporter.steps_redone();  // Note [Resume record]
  run.summary.data_store = to_string(config.data_store);
  run.steps.epochs = config.epochs;
  run.steps.last_global_step = run.length.last_global_step();
  run.steps.global_batch = run.summary.global_batch;
  if (placement.cuda && !model->forward_flops_per_sample())
    reporter.say("MFU: unknown for %s (hpc_train counts the FLOPs of its built-in models "
                 "only); summary.json reports mfu 0\n", config.model.c_str());
}

// The first step that was taken decides the bucket layout (a read of the GPU, once).
void Trainer::Impl::rebuild_buckets_once() {
  if (reducer->layout_final() || optimizer->report().last_overflow) return;
  reducer->rebuild_buckets();  // the optimizer carries its state over (LayoutObserver)
}

// Runs the micro-step `micro` on `batches`' prepared batch: replayed from the CUDA graph where
// GraphedStep wants it (captured first, the first time), else eagerly, timed in `times`.
// Returns whether the graph ran it.
bool Trainer::Impl::run_micro_step(EpochBatches& batches, MicroStep micro, RunProgress& run) {
  const bool graph_wanted = graphed_step->wanted(
      micro.ends_update, reducer->layout_final(), batches.prepared_size() == config.micro_batch,
      run.global_step - start.global_step);
  if (graph_wanted && graphed_step->captured()) {
    // Note [One input kernel] (device_input.cpp): into the graph's buffers directly.
    DeviceBatch& graph_input = graphed_step->static_batch();
    batches.take_into(graph_input.input, graph_input.labels);
    graphed_step->replay(run.global_step, comm);
    return true;
  }
  const DeviceBatch batch = batches.take();
  if (graph_wanted &&
      graphed_step->run({in_model_layout(batch.input, channels_last), batch.labels},
                        run.global_step,
                        [&](const DeviceBatch& static_batch) {
                          step->enqueue(static_batch, micro, /*phases=*/nullptr);
                        },
                        [&] { step->discard(); }, comm, reporter))
    return true;
  step->enqueue(batch, micro, &run.times);
  if (micro.ends_update) rebuild_buckets_once();
  return false;
}

// What follows an update: the log line, throughput, the progress bar, the agreed stop and the
// checkpoint cadence. Returns false when the epoch's loop ends here (a stop, --max-steps).
bool Trainer::Impl::after_update(RunProgress& run, EpochProgress& epoch, bool replayed,
                                 bool have_batch, int64_t batch_size, int window_micro_steps) {
  ++run.global_step;
  ++run.times.steps;
  run.profiler_range.step_ended(run.global_step);
  if (!replayed) ++run.times.phase_timed_steps;
  run.reached_max_steps = config.max_steps > 0 && run.global_step >= config.max_steps;
  epoch.at = epoch.steps.after(epoch.epoch, epoch.step_in_epoch, run.global_step);
  const bool last_of_epoch = epoch.step_in_epoch + 1 >= epoch.steps.steps_per_epoch ||
                             run.reached_max_steps || !have_batch;
  if ((epoch.step_in_epoch + 1) % config.log_every == 0 || last_of_epoch) {
    const LossSum taken = take_loss_sum(run);
    run.times.loss_sum += taken.sum;
    run.times.loss_micro_steps += taken.micro_steps;
    epoch.loss_sum += taken.sum;
    run.shown_loss = log_interval(epoch.at, run);
  }
  // After the log, which waits for the GPU at its interval: asynchronous steps are counted
  // when they have run.
  if (graphed_step->take_captured_now()) {
    torch::cuda::synchronize();
    run.throughput.restart_after(run.global_step);
  } else {
    run.throughput.step_ended(run.global_step, batch_size * window_micro_steps);
  }
  reporter.progress(epoch.at, run.shown_loss);
  ++epoch.step_in_epoch;
  const auto here = [&] { return position(run, epoch.epoch, epoch.micro_steps, epoch.samples); };
  const StepAgreement::Agreed agreed = run.agreement.after_step(
      stop_signal_received(), run.checkpoint_cadence.take_minutes_elapsed());
  run.summary.stop_signal = agreed.stop_signal;
  if (run.summary.stop_signal != 0) {
    run.summary.last_checkpoint = checkpoints->save(
        here(), stop_signal_name(run.summary.stop_signal), RunCheckpoints::Write::kNow);
    return false;
  }
  const char* why =
      run.epoch_end_checkpoint_due
          ? "epoch end"
          : run.checkpoint_cadence.due(run.global_step, agreed.checkpoint_minutes_elapsed);
  if (why) {
    run.summary.last_checkpoint =
        checkpoints->save(here(), why, RunCheckpoints::Write::kBackground);
    run.checkpoint_cadence.checkpoint_written();
    run.epoch_end_checkpoint_due = false;
  }
  return !run.reached_max_steps;
}

// Epoch `epoch_index`'s start on the run's counters (a resumed epoch: at its checkpoint's
// place).
EpochProgress Trainer::Impl::begin_epoch(RunProgress& run, int epoch_index) {
  EpochProgress epoch;
  epoch.epoch = epoch_index;
  // Note [Resume position]: a resumed epoch goes on at the permutation position its
  // checkpoint had reached, whatever world size, micro-batch and accumulation reached it.
  epoch.samples = epoch_index == start.epoch ? start.samples_in_epoch : 0;
  epoch.consumed_micro_steps = epoch.samples / (int64_t{config.micro_batch} * comm.size());
  epoch.micro_steps = epoch.consumed_micro_steps;
  epoch.step_in_epoch = run.length.updates_done_in_epoch(epoch_index, epoch.consumed_micro_steps);
  epoch.steps = run.steps;
  epoch.steps.steps_per_epoch =
      run.length.updates_in_epoch(epoch_index, epoch.consumed_micro_steps);
  epoch.at = epoch.steps.after(epoch_index, epoch.step_in_epoch - 1, run.global_step);
  return epoch;
}

// Trains epoch `epoch_index` until its batches end, a stop is agreed or --max-steps is reached.
EpochProgress Trainer::Impl::train_epoch(RunProgress& run, int epoch_index) {
  EpochProgress epoch = begin_epoch(run, epoch_index);
  const DatasetInfo& info = dataset.info();
  EpochBatches batches(*train_input, dataset,
                       store ? store->start_epoch(config.seed, epoch_index, tail(), epoch.samples)
                             : rank_epoch_indices(config.seed, epoch_index, info.train_size,
                                                  comm.size(), comm.rank(), tail(),
                                                  /*shuffle=*/true, epoch.samples),
                       config.micro_batch, config.prefetch_batches, epoch_index,
                       epoch.consumed_micro_steps, train_split_resident,
                       store ? &*store : nullptr);
  if (batches.batches() != run.length.micro_steps_in_epoch(epoch_index))
    throw Error("internal: epoch " + std::to_string(epoch_index + 1) + " has " +
                std::to_string(batches.batches()) + " micro-batches, the run planned " +
                std::to_string(run.length.micro_steps_in_epoch(epoch_index)));
  epoch.complete_micro_steps = epoch.consumed_micro_steps + batches.batches();
  // The log interval starts with the epoch, holding the losses of an update begun in the epoch
  // before (Note [Run length]).
  run.times = IntervalTimes{};
  const LossSum carried = std::exchange(run.carried_loss, {});
  run.times.loss_sum = carried.sum;
  run.times.loss_micro_steps = carried.micro_steps;
  run.throughput.epoch_started();
  bool have_batch = batches.prepare_next(&run.times.data_wait_ms);
  while (have_batch) {
    const int64_t batch_size = batches.prepared_size();
    ++run.micro_step;
    if (++run.micro_steps_since_update == 1) run.profiler_range.step_begins(run.global_step + 1);
    const MicroStep micro{run.length.ends_update(run.session_micro_step),
                          run.length.window_micro_steps(run.session_micro_step)};
    ++run.session_micro_step;
    const bool replayed = run_micro_step(batches, micro, run);
    if (sample_trace.on())
      sample_trace.write(epoch_index, run.global_step + 1, batches.taken_indices());
    if (replayed) ++run.summary.graph_replays;
    ++run.loss_micro_steps;
    ++epoch.micro_steps;
    epoch.samples += batch_size * comm.size();  // every rank's batch has this size
    run.times.samples += batch_size;
    // The next batch's copy overlaps the step just queued on the GPU.
    have_batch = batches.prepare_next(&run.times.data_wait_ms);
    if (!micro.ends_update) continue;
    run.micro_steps_since_update = 0;
    if (!after_update(run, epoch, replayed, have_batch, batch_size, micro.window_micro_steps))
      break;
  }
  // Micro-steps of an update that ends in the next epoch: this epoch's loss, and the next
  // log interval's, whose update they belong to.
  run.carried_loss = take_loss_sum(run);
  epoch.loss_sum += run.carried_loss.sum;
  epoch.loader_wait_ms = batches.loader_wait_ms();
  reporter.end_progress();
  return epoch;
}

// After an epoch's steps: its loss over the ranks, the evaluation, its report and its
// checkpoint.
void Trainer::Impl::end_epoch(RunProgress& run, const EpochProgress& epoch,
                              const Stopwatch& epoch_wall) {
  EpochReport ended;
  ended.at = epoch.at;
  ended.train_s = epoch_wall.elapsed_ms() / 1e3;
  run.summary.final_train_loss =
      comm.all_reduce_scalar(epoch.loss_sum) /
      (comm.size() * static_cast<double>(
                         std::max<int64_t>(1, epoch.micro_steps - epoch.consumed_micro_steps)));
  ended.complete = epoch.micro_steps == epoch.complete_micro_steps;
  if (ended.complete) ++run.summary.epochs_completed;
  if (placement.cuda) at::globalContext().setBenchmarkCuDNN(false);  // Note [cuDNN autotuning]
  run.summary.test = evaluator->evaluate(*model);
  if (config.ema_decay > 0)
    with_ema_weights(*optimizer, flat, [&] { run.summary.test_ema = evaluator->evaluate(*model); });
  const StepReport report = optimizer->report();
  ended.train_loss = run.summary.final_train_loss;
  ended.test = run.summary.test;
  ended.test_ema = run.summary.test_ema;
  ended.wall_s = epoch_wall.elapsed_ms() / 1e3;
  ended.loader_wait_s = epoch.loader_wait_ms / 1e3;
  ended.storage_reads = run.storage_reads.epoch_ended(comm);
  ended.skipped_steps = report.skipped_steps;
  ended.loss_scale = report.loss_scale;
  reporter.epoch(ended);
  if (!config.checkpoint_epochs) return;
  // Checkpoints fall on optimizer-step boundaries: an epoch that ends inside an update has
  // its checkpoint at that update's end (Note [Run length]).
  if (run.micro_steps_since_update != 0) {
    run.epoch_end_checkpoint_due = true;
    return;
  }
  const TrainingPosition here = ended.complete
                                    ? position(run, epoch.epoch + 1, 0, 0)
                                    : position(run, epoch.epoch, epoch.micro_steps, epoch.samples);
  run.summary.last_checkpoint = checkpoints->save(
      here, ended.complete ? "epoch end" : "max steps", RunCheckpoints::Write::kBackground);
  run.checkpoint_cadence.checkpoint_written();
}

// After the last epoch: the checkpoints' writes, the exported weights, the summary's totals.
TrainSummary Trainer::Impl::finish_run(RunProgress& run, const Stopwatch& run_wall) {
  run.agreement.finish();
  checkpoints->wait_for_writes();  // Note [Background checkpoint writes]
  TrainSummary& summary = run.summary;
  if (!config.export_weights.empty() && summary.stop_signal == 0) {
    const auto export_to = [&](const std::string& path, const char* what) {
      if (comm.rank() != 0) return;
      write_weights_safetensors(path, model_checkpoint(dataset.info(), *model, run.global_step));
      reporter.say("%s exported to %s\n", what, path.c_str());
    };
    export_to(config.export_weights, "Weights");
    if (config.ema_decay > 0)  // collective: every rank takes part in assembling the EMA
      with_ema_weights(*optimizer, flat, [&] {
        export_to(ema_export_path(config.export_weights), "The weights' EMA");
      });
  }
  summary.steps = run.global_step;
  const StepReport report = optimizer->report();
  summary.skipped_steps = report.skipped_steps;
  summary.loss_scale = report.loss_scale;
  summary.memory = memory();
  summary.breakdown = run.run_times.breakdown(comm.size(), config.zero_stage >= 1);
  summary.wall_s = run_wall.elapsed_ms() / 1e3;
  summary.storage_reads = run.storage_reads.since_start(comm);
  add_throughput(summary, run.throughput, comm);
  if (store) {
    add_data_store_figures(summary, *store, run.global_step - start.global_step, comm);
    reporter.say("Data store: exchanges took %.3f ms per step (the slowest rank's mean)\n",
                 summary.data_store_exchange_ms_per_step);
  }
  add_host_memory_figures(summary, comm);
  if (placement.cuda)
    add_gpu_figures(summary, placement.cuda_device, config.precision,
                    model->forward_flops_per_sample(), comm);
  return summary;
}


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
