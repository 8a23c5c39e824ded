// What a run reports: the per-interval record and log line, the epoch's, a checkpoint's, the
// progress bar, and the run's summary (TrainSummary, summary.json); the same intervals and
// epochs as scalars for TensorBoard and DeepSpeed's CSV monitor (monitor_events). The trainer
// measures and agrees on the figures (collectives); this unit only shapes and writes them, on
// rank 0 (RunReporter).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "hpc_train/io/checkpoint.h"
#include "hpc_train/monitor/gpu_monitor.h"
#include "hpc_train/monitor/csv_monitor.h"
#include "hpc_train/monitor/metrics.h"
#include "hpc_train/monitor/storage_io.h"
#include "hpc_train/monitor/tensorboard_events.h"

namespace hpc_train {

class SampleStore;  // sample_store.h

// Note [Top-5 accuracy]
// A sample counts as correct in the top 5 when its label is among the model's 5 highest logits
// (torch.topk's choice among equal logits). A model of fewer than 5 classes has no top-5
// figure: every label would be among its top k = classes, a figure of 100% that says nothing,
// so correct_top5 and top5_accuracy stay empty there (null in JSON, left out of the log line).
inline constexpr int64_t kTopKClasses = 5;  // the k of top-k accuracy

struct EvalResult {
  double loss = 0.0;       // mean cross entropy over the split
  double accuracy = 0.0;   // correct / samples (top-1: the highest logit's class, argmax)
  int64_t correct = 0;
  int64_t samples = 0;     // summed over ranks: the whole split, each sample once
  std::optional<int64_t> correct_top5;  // Note [Top-5 accuracy]: empty below 5 classes
  std::optional<double> top5_accuracy;
  int64_t num_classes = 0;
  // The confusion matrix, row-major: confusion[label * num_classes + predicted] samples of class
  // `label` that the model put in class `predicted` (top-1); its diagonal sums to `correct`.
  std::vector<int64_t> confusion;

  // Samples of each class in the split (the confusion matrix's row sums).
  std::vector<int64_t> class_samples() const;
  // Each class's top-1 accuracy (its diagonal entry over its row sum); empty for a class that
  // the split holds no sample of.
  std::vector<std::optional<double>> class_accuracy() const;
  // loss, accuracy, correct, samples, top5_accuracy, correct_top5 (null below 5 classes) and
  // class_accuracy (a list, null for a class without samples), each key after `prefix`.
  nlohmann::json to_json(const std::string& prefix) const;
  // What the log lines add after the top-1 figure: ", top-5 99.12%" (nothing below 5 classes)
  // and "; per class 82.1 97.3 ... %" (up to kListedClassAccuracies classes; beyond, the lowest
  // and the highest with their class).
  std::string describe_top5_and_classes() const;
};
inline constexpr int64_t kListedClassAccuracies = 20;

// Bytes this rank holds, by kind (what ZeRO partitions).
struct MemoryBytes {
  int64_t parameters = 0;       // the flat parameter buffer (model dtype)
  int64_t gradients = 0;        // the flat gradient buffer, plus the stage-2 partition
  int64_t optimizer_state = 0;  // Adam moments, plus fp32 master weights when separate
};

// Where a step's time goes, per optimizer step, averaged over the run (milliseconds), and what
// the gradient collectives moved. The phases (forward to optimizer) and the communication
// figures are timed on the host, so only in eager steps (a step replayed from a CUDA graph is
// one launch): they average over phase_timed_steps, data_wait_ms over every step.
struct StepBreakdown {
  int64_t phase_timed_steps = 0;  // the eager steps the phases were timed in
  double data_wait_ms = 0.0;   // blocked on the loader
  double forward_ms = 0.0;
  double backward_ms = 0.0;    // collectives started from the hooks run inside it
  double comm_wait_ms = 0.0;   // exposed communication: waiting after backward
  double optimizer_ms = 0.0;   // unscale, clip, update, all-gather
  double comm_bytes_per_step = 0.0;
  double busbw_gb_s = 0.0;     // nccl-tests' bus bandwidth, a lower bound (IntervalTimes)
  nlohmann::json to_json() const;
};

struct TrainSummary {
  int world_size = 1;
  std::string model;
  int64_t parameters = 0;
  int epochs_completed = 0;
  int64_t steps = 0;
  int64_t global_batch = 0;
  double final_train_loss = 0.0;  // mean over the last epoch's steps (or those run of it)
  EvalResult test;
  std::optional<EvalResult> test_ema;  // --ema-decay: the last evaluation of the weights' EMA
  double wall_s = 0.0;            // the whole run, evaluation included
  double samples_per_s = 0.0;     // training samples per second over all ranks, first step excluded
  double ms_per_step = 0.0;       // likewise
  // Before those steps: the libraries' first use, cuDNN's autotuning, the eager steps before
  // the CUDA graph capture and the capture (ThroughputClock::warmup_ms; the slowest rank's)
  double warmup_s = 0.0;
  int64_t skipped_steps = 0;      // fp16 overflows
  int64_t graph_replays = 0;      // GPU: steps replayed from the captured CUDA graph (--cuda-graph)
  double loss_scale = 1.0;        // at the end
  MemoryBytes memory;             // rank 0's
  StepBreakdown breakdown;        // rank 0's
  int zero_stage = 0;
  std::string precision;
  std::string placement;          // rank 0's device and backend
  double training_flops_per_sample = 0.0;  // GPU: 3 x the forward's (models.h)
  double mfu = 0.0;               // GPU: model FLOPs utilisation against the GPU's peak; 0 = unknown
  std::vector<int64_t> peak_allocated_bytes_per_rank;  // GPU: LibTorch's allocator peak, by rank
  // Each process's peak resident memory (getrusage's ru_maxrss), by rank: on the CPU where the
  // tensors live, with the libraries and the data besides.
  std::vector<int64_t> peak_host_rss_bytes_per_rank;
  StorageReadsByRank storage_reads;  // from the first epoch's start to the end (storage_io.h)
  std::string resumed_from;       // the checkpoint this run continued from; empty = fresh start
  int64_t steps_redone = 0;       // logged after resumed_from, trained again: Note [Resume record]
  std::string last_checkpoint;    // the last checkpoint written; empty = none
  int stop_signal = 0;            // SIGUSR1/SIGTERM that stopped the run after a checkpoint; 0 = ran to the end
  std::string data_store = "file";  // --data-store
  // --data-store memory: the bytes each rank read from the dataset into its store, by rank, and
  // the slowest rank's time in the store's exchanges per optimizer step of this run.
  std::vector<int64_t> data_store_read_bytes_per_rank;
  double data_store_exchange_ms_per_step = 0.0;
  nlohmann::json to_json() const;
};

// Micro-batch losses added up, and how many.
struct LossSum {
  double sum = 0.0;
  int64_t micro_steps = 0;
};

// One log interval's sums over its optimizer steps (times in milliseconds).
struct IntervalTimes {
  int64_t steps = 0;
  int64_t phase_timed_steps = 0;  // eager steps (StepBreakdown)
  int64_t samples = 0;  // this rank's
  double loss_sum = 0.0;  // this rank's micro-batch losses in the interval's updates
  int64_t loss_micro_steps = 0;  // how many
  double data_wait_ms = 0.0;
  double forward_ms = 0.0;
  double backward_ms = 0.0;
  double comm_wait_ms = 0.0;
  double optimizer_ms = 0.0;
  double comm_span_ms = 0.0;
  int64_t comm_bytes = 0;
  Stopwatch wall;

  void add(const IntervalTimes& other) {
    steps += other.steps;
    phase_timed_steps += other.phase_timed_steps;
    samples += other.samples;
    loss_sum += other.loss_sum;
    loss_micro_steps += other.loss_micro_steps;
    data_wait_ms += other.data_wait_ms;
    forward_ms += other.forward_ms;
    backward_ms += other.backward_ms;
    comm_wait_ms += other.comm_wait_ms;
    optimizer_ms += other.optimizer_ms;
    comm_span_ms += other.comm_span_ms;
    comm_bytes += other.comm_bytes;
  }

  // nccl-tests' convention: algbw = bytes / time; all-reduce busbw = algbw * 2(n-1)/n,
  // reduce-scatter busbw = algbw * (n-1)/n. The time is each backward's span from its first
  // collective's start to the last one's observed end, so the figure is a lower bound.
  StepBreakdown breakdown(int world_size, bool reduce_scatter) const {
    const double n = world_size;
    const double per_step = 1.0 / static_cast<double>(std::max<int64_t>(1, steps));
    const double per_timed_step = 1.0 / static_cast<double>(std::max<int64_t>(1, phase_timed_steps));
    const double bus_factor = reduce_scatter ? (n - 1.0) / n : 2.0 * (n - 1.0) / n;
    StepBreakdown b;
    b.phase_timed_steps = phase_timed_steps;
    b.data_wait_ms = data_wait_ms * per_step;
    b.forward_ms = forward_ms * per_timed_step;
    b.backward_ms = backward_ms * per_timed_step;
    b.comm_wait_ms = comm_wait_ms * per_timed_step;
    b.optimizer_ms = optimizer_ms * per_timed_step;
    b.comm_bytes_per_step = static_cast<double>(comm_bytes) * per_timed_step;
    b.busbw_gb_s = comm_span_ms > 0 ? comm_bytes / (comm_span_ms * 1e6) * bus_factor : 0.0;
    return b;
  }
};

// Note [Step position]: where the step just taken stands in the run. The trainer fills one from
// its counters after each optimizer step, and everything that places a step reads it: the log
// line's and the bar's "Epoch [e/E], Step [s/S]", the metrics record's step, the ETA's steps
// left (steps_left, Note [ETA]) and the monitors' x axis (samples_seen, Note [Monitor tags]).
struct StepPosition {
  int epoch = 0;  // 0-based
  int epochs = 0;
  int64_t step_in_epoch = 0;  // 0-based
  int64_t steps_per_epoch = 0;  // this epoch's (Note [Run length] in run_length.h)
  int64_t global_step = 0;   // optimizer steps taken or skipped in the run, this one included
  int64_t last_global_step = 0;  // the global step the run ends at (--max-steps included)
  int64_t global_batch = 0;  // samples one optimizer step takes, over all ranks

  // global_step x the global batch, as DeepSpeed counts global_samples (a padded epoch tail
  // counts as a whole batch there too).
  int64_t samples_seen() const { return global_step * global_batch; }
  // The position after step `step_in_epoch` of `epoch`, the run's `global_step`-th, in this
  // position's run.
  StepPosition after(int at_epoch, int64_t at_step_in_epoch, int64_t at_global_step) const {
    StepPosition at = *this;
    at.epoch = at_epoch;
    at.step_in_epoch = at_step_in_epoch;
    at.global_step = at_global_step;
    return at;
  }
};

// One log interval as every rank agreed on it (the trainer's log_interval fills it).
struct IntervalReport {
  StepPosition at;  // the interval's last step
  double loss = 0.0;  // mean over the interval's micro-batches and the ranks
  double lr = 0.0;
  double samples_per_s = 0.0;
  double ms_per_step = 0.0;
  size_t buckets = 0;
  bool show_loss_scale = false;  // fp16
  double loss_scale = 1.0;
  int64_t skipped_steps = 0;
  MemoryBytes memory;
  StepBreakdown breakdown;
  std::optional<GpuSpread> gpu;  // GPU runs
};

// Note [ETA]: what is left of an epoch and of the run, for the log line and the bar (and
// metrics.jsonl's eta_epoch_s, eta_run_s), so that a Slurm user can size --time. The steps left
// times the recent step time (the last log interval's ms_per_step), and for the run also the
// evaluations left times the last epoch's evaluation time (none is known before the first
// epoch's end: until then the run's ETA counts the steps only). Pure arithmetic, tested alone.
struct StepsLeft {
  int64_t epoch = 0;       // optimizer steps left in this epoch, after the step just taken
  int64_t run = 0;         // in the whole run (--epochs, cut by --max-steps)
  int64_t evaluations = 0; // epoch ends still to come, each evaluated (this epoch's included)
};
// After the step `at`.
StepsLeft steps_left(const StepPosition& at);

struct Eta {
  double epoch_s = 0.0;  // this epoch's training steps
  double run_s = 0.0;    // the run's steps and evaluations
};
// `evaluation_s`: one evaluation's time, 0 = not known yet.
Eta estimate_eta(const StepsLeft& left, double ms_per_step, double evaluation_s);

// "0:07", "3:41", "1:02:03" (m:ss below an hour, else h:mm:ss); "?" for a time that is not a
// finite non-negative number.
std::string format_duration(double seconds);
// "ETA epoch 0:12, run 3:41"
std::string describe_eta(const Eta& eta);

// Where a run's reports go.
struct TrainerOutput {
  std::string run_dir;      // rank 0 appends metrics.jsonl here; empty = no files
  bool print = true;        // rank 0 prints progress and epoch lines
  bool progress_bar = false;  // a bar redrawn in place (a terminal) instead of log lines
  std::string tensorboard_dir;  // rank 0 writes TensorBoard event files here; empty = none
  std::string csv_monitor_dir;  // rank 0 writes DeepSpeed's csv_monitor files here; empty = none
};

// What the run's first line says.
struct RunStart {
  std::string model;
  int64_t parameters = 0;
  std::string precision;
  int zero_stage = 0;
  int world_size = 1;
  std::string placement;  // rank 0's
  int64_t train_samples = 0;
  // Optimizer steps in an epoch: steps_per_epoch, or one more where accumulation windows carry
  // over epoch boundaries (Note [Run length] in run_length.h)
  int64_t steps_per_epoch = 0;
  int64_t steps_per_epoch_max = 0;
  int64_t total_steps = 0;  // the run's last global step, as the LR schedule plans it
  int micro_batch = 0;
  int grad_accum = 1;
  MemoryBytes memory;
  size_t buckets = 0;
};

// A run's summary as it starts: what `start` says of the run (model, size, ranks, precision,
// placement, global batch); the rest is filled as the run goes.
TrainSummary starting_summary(const RunStart& start);

// One epoch's end, agreed by all ranks.
struct EpochReport {
  StepPosition at;  // the epoch's last step (the epoch, the run's steps and samples so far)
  bool complete = true;  // false: stopped by --max-steps
  double train_loss = 0.0;
  EvalResult test;
  std::optional<EvalResult> test_ema;  // --ema-decay: the EMA of the weights on the test split
  double train_s = 0.0;  // the epoch's training loop
  double wall_s = 0.0;   // with evaluation
  double loader_wait_s = 0.0;
  StorageReadsByRank storage_reads;  // since the previous epoch's end (storage_io.h)
  int64_t skipped_steps = 0;
  double loss_scale = 1.0;
};

// Note [Resume record]
// A run resumed from a checkpoint (--resume) writes into the run directory that the earlier
// runs wrote: it appends to metrics.jsonl and adds an event file to the TensorBoard folder, so
// that the directory keeps one history across restarts (an elastic supervisor's at a smaller
// world size, a requeued job's). The earlier runs may have logged steps after the checkpoint,
// which this run trains again: the cost of the restart. So before its first train record rank
// 0 writes a "resume" record: the checkpoint and its step, the world size that wrote it and
// this run's, and steps_redone, the highest step of the earlier train records minus the
// checkpoint's (never below 0). The log line and summary.json (resumed_from, steps_redone) say
// the same. hpc_train_report takes the train and epoch records after a resume record as
// replacing the earlier ones past its step.
//
// Note [Resume in TensorBoard]
// The resumed run's event file starts with a SessionLog START at the checkpoint's samples seen
// (the scalars' step, Note [Monitor tags]) plus one. TensorBoard's event loader (its
// purge_orphaned_data, on by default) then drops the earlier files' events at that step or
// later: the steps this run trains again. Plus one, because it drops the events at the START's
// step too, and the checkpoint step's own (its log interval, an epoch's evaluation) are not
// written again. TensorBoard's Rust data server ignores SessionLog, but drops a series' points
// at or after the step of a later point, which the resumed run's first points are.

// A resumed run's start (RunCheckpoints::resume fills it).
struct ResumeReport {
  std::string checkpoint;         // the file resumed from
  StepPosition at;                // the checkpoint's step and epoch, at this run's global batch
  int64_t samples_in_epoch = 0;   // where the epoch goes on (Note [Resume position])
  int world_size = 1;             // this run's
  int checkpoint_world_size = 1;  // the run's that wrote the checkpoint
};

// The highest "step" of the "train" records in the metrics.jsonl at `path`; 0 when there is
// none (no file, no train record). Lines that are not such a record (a last line that a killed
// run left half written) are passed over.
int64_t highest_logged_step(const std::string& path);

// Rank 0's voice: metrics.jsonl records and stdout (log lines, or the progress bar when
// output.progress_bar). On other ranks, and with printing off, the calls write nothing.
class RunReporter {
 public:
  RunReporter(const TrainerOutput& output, int rank);

  bool printing() const { return printing_; }
  // A line of its own (e.g. "Resumed from ..."), when printing; printf's format.
  void say(const char* format, ...) __attribute__((format(printf, 2, 3)));

  void run_start(const RunStart& start);
  // The interval's record, and its log line unless the progress bar is shown.
  void interval(const IntervalReport& report);
  // The bar at the step `at`, when shown; its rate and ETA are the last interval's (Note [ETA]).
  void progress(const StepPosition& at, double loss);
  // Ends the bar's line (an epoch's loop is over), when shown.
  void end_progress();
  // A checkpoint taken: `wait_s` is how long the training waited for it; `background`, that
  // its file is still being written (Note [Background checkpoint writes]).
  void checkpoint(const TrainingPosition& position, const char* why, const std::string& path,
                  double wait_s, bool background);
  void epoch(const EpochReport& report);
  // A resumed run's start (Note [Resume record], Note [Resume in TensorBoard]): the resume
  // record, the log line, TensorBoard's SessionLog START. Before the first interval.
  void resumed(const ResumeReport& report);
  // The resume record's steps_redone; 0 for a fresh start, and on the other ranks.
  int64_t steps_redone() const { return steps_redone_; }

 private:
  void monitor(const std::vector<ScalarEvent>& events);

  bool printing_ = false;
  bool progress_bar_ = false;
  // Note [ETA]: the last interval's rate and the last epoch's evaluation time.
  double recent_samples_per_s_ = 0.0;
  double recent_ms_per_step_ = 0.0;  // 0 = no interval yet
  double evaluation_s_ = 0.0;        // 0 = no epoch ended yet
  int64_t steps_redone_ = 0;         // Note [Resume record]
  JsonlWriter metrics_;
  TensorBoardWriter tensorboard_;
  CsvMonitorWriter csv_monitor_;
};

// Note [Monitor tags]: the scalars of an interval and of an epoch, for TensorBoard and the CSV
// monitor, named as DeepSpeed's engine names them (Train/Samples/train_loss, .../lr,
// .../loss_scale with fp16, .../elapsed_time_ms_forward, _backward, _step) so that dashboards
// made for DeepSpeed runs work, with the step being samples seen (DeepSpeed's global_samples).
// What DeepSpeed does not log gets a name in the same style, after the metrics.jsonl key
// (docs/monitoring.md, "TensorBoard and CSV files"). The timed phases only when the interval
// had eager steps.
std::vector<ScalarEvent> interval_events(const IntervalReport& report);
std::vector<ScalarEvent> epoch_events(const EpochReport& report);

// The interval's record in `metrics` (a closed writer writes nothing), and its log line on
// stdout when `print`.
// `evaluation_s` as estimate_eta's.
void report_interval(const IntervalReport& report, JsonlWriter& metrics, bool print,
                     double evaluation_s = 0.0);

// "\rEpoch [e/E] [#####.....] s/S Loss: x", redrawn in place (a terminal), then `rate_and_eta`
// (", 401.7 samples/s, ETA epoch 0:12, run 3:41"; empty before the first log interval).
void print_progress_bar(int epoch, int epochs, int64_t step_in_epoch, int64_t steps_per_epoch,
                        double loss, const std::string& rate_and_eta = "");

// Training throughput of this rank over the run's steady state: from the end of the first step
// (set-up and first-use costs), or of the step that captured the CUDA graph, to the end. What
// came before is the warm-up: the libraries' first use (cuDNN's autotuning among it), the eager
// steps before the capture and the capture.
class ThroughputClock {
 public:
  // Times the steps after `global_step`, from now; the warm-up starts now.
  explicit ThroughputClock(int64_t global_step) : timed_after_step_(global_step) {}
  // Step `global_step` ended now, having trained `samples` samples on this rank.
  void step_ended(int64_t global_step, int64_t samples) {
    if (global_step > timed_after_step_) {
      ++steps_;
      samples_ += samples;
      ms_ += step_wall_.elapsed_ms();
    } else if (global_step == timed_after_step_) {
      warmup_ms_ = since_start_.elapsed_ms();
    }
    step_wall_.restart();
  }
  // The step loop of an epoch starts (evaluation and checkpoints between epochs are not steps).
  void epoch_started() { step_wall_.restart(); }
  // Forgets what was timed: only the steps after `global_step`, which ended now, count; the
  // warm-up lasted until now.
  void restart_after(int64_t global_step) {
    timed_after_step_ = global_step;
    steps_ = samples_ = 0;
    ms_ = 0.0;
    warmup_ms_ = since_start_.elapsed_ms();
    step_wall_.restart();
  }

  int64_t steps() const { return steps_; }
  int64_t samples() const { return samples_; }
  double ms() const { return ms_; }
  // From the clock's start to the end of the last untimed step (evaluation between epochs
  // included); 0 before that step has ended.
  double warmup_ms() const { return warmup_ms_; }

 private:
  int64_t timed_after_step_;
  int64_t steps_ = 0;
  int64_t samples_ = 0;
  double ms_ = 0.0;
  double warmup_ms_ = 0.0;
  Stopwatch step_wall_;
  Stopwatch since_start_;
};

// Every rank's storage reads (storage_io.h) over the run and over each epoch, gathered at
// rank 0 (Note [Storage reads per epoch] in run_report.cpp); unknown counters as -1.
class StorageReadClock {
 public:
  StorageReadClock();  // the run's start
  // Every rank's reads since the previous call, the first time since the start. Collective.
  StorageReadsByRank epoch_ended(Communicator& comm);
  // Every rank's reads since the start. Collective.
  StorageReadsByRank since_start(Communicator& comm) const;

 private:
  std::optional<StorageReadBytes> run_start_;
  std::optional<StorageReadBytes> epoch_start_;
};

// The run's samples/s (every rank's timed samples over the slowest rank's time: it sets the
// pace) and ms/step into `summary`, left 0 when no step was timed; and the slowest rank's
// warm-up. Collective.
void add_throughput(TrainSummary& summary, const ThroughputClock& throughput, Communicator& comm);

// What the read-once store did over `steps` optimizer steps of this run, into `summary`: every
// rank's bytes read (gathered to rank 0) and the slowest rank's exchange time per step.
// Collective.
void add_data_store_figures(TrainSummary& summary, const SampleStore& store, int64_t steps,
                            Communicator& comm);

// Every rank's peak resident memory so far (gathered to rank 0) into `summary`. Collective.
void add_host_memory_figures(TrainSummary& summary, Communicator& comm);

// A GPU run's figures into `summary`: every rank's allocator peak (gathered to rank 0), and the
// training FLOPs per sample and MFU where the model's forward FLOPs are known
// (`forward_flops`; a TorchScript module's are not: its mfu stays 0, "unknown"). After
// add_throughput. Collective.
void add_gpu_figures(TrainSummary& summary, int cuda_device, Precision precision,
                     std::optional<double> forward_flops, Communicator& comm);

}  // namespace hpc_train
