#include "hpc_train/monitor/run_report.h"

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <ctime>
#include <fstream>

#include <sys/resource.h>

#include "hpc_train/comm/comm.h"
#include "hpc_train/data/sample_store.h"
#include "hpc_train/model/models.h"
#include "hpc_train/runtime/stop_signal.h"

namespace hpc_train {

std::vector<int64_t> EvalResult::class_samples() const {
  std::vector<int64_t> samples_of(static_cast<size_t>(num_classes), 0);
  for (int64_t label = 0; label < num_classes; ++label)
    for (int64_t predicted = 0; predicted < num_classes; ++predicted)
      samples_of[label] += confusion[label * num_classes + predicted];
  return samples_of;
}

std::vector<std::optional<double>> EvalResult::class_accuracy() const {
  const std::vector<int64_t> samples_of = class_samples();
  std::vector<std::optional<double>> accuracy(samples_of.size());
  for (int64_t label = 0; label < num_classes; ++label)
    if (samples_of[label] > 0)
      accuracy[label] = static_cast<double>(confusion[label * num_classes + label]) /
                        static_cast<double>(samples_of[label]);
  return accuracy;
}

nlohmann::json EvalResult::to_json(const std::string& prefix) const {
  nlohmann::json per_class = nlohmann::json::array();
  for (const std::optional<double>& value : class_accuracy())
    per_class.push_back(value ? nlohmann::json(*value) : nlohmann::json(nullptr));
  auto or_null = [](const auto& value) {
    return value ? nlohmann::json(*value) : nlohmann::json(nullptr);
  };
  return {{prefix + "loss", loss},
          {prefix + "accuracy", accuracy},
          {prefix + "correct", correct},
          {prefix + "samples", samples},
          {prefix + "top5_accuracy", or_null(top5_accuracy)},
          {prefix + "correct_top5", or_null(correct_top5)},
          {prefix + "class_accuracy", per_class}};
}

std::string EvalResult::describe_top5_and_classes() const {
  char text[64];
  std::string line;
  if (top5_accuracy) {
    std::snprintf(text, sizeof text, ", top-5 %.2f%%", 100.0 * *top5_accuracy);
    line += text;
  }
  const std::vector<std::optional<double>> per_class = class_accuracy();
  if (per_class.empty()) return line;
  if (num_classes <= kListedClassAccuracies) {
    line += "; per class";
    for (const std::optional<double>& value : per_class) {
      if (value) std::snprintf(text, sizeof text, " %.1f", 100.0 * *value);
      line += value ? text : " -";
    }
    return line + " %";
  }
  int64_t lowest = -1, highest = -1;
  for (int64_t label = 0; label < num_classes; ++label) {
    if (!per_class[label]) continue;
    if (lowest < 0 || *per_class[label] < *per_class[lowest]) lowest = label;
    if (highest < 0 || *per_class[label] > *per_class[highest]) highest = label;
  }
  if (lowest < 0) return line;
  std::snprintf(text, sizeof text, "; per class %.1f%% (class %lld) to %.1f%% (class %lld)",
                100.0 * *per_class[lowest], static_cast<long long>(lowest),
                100.0 * *per_class[highest], static_cast<long long>(highest));
  return line + text;
}

nlohmann::json TrainSummary::to_json() const {
  nlohmann::json summary = {{"world_size", world_size},
          {"model", model},
          {"parameters", parameters},
          {"zero_stage", zero_stage},
          {"precision", precision},
          {"placement", placement},
          {"epochs_completed", epochs_completed},
          {"steps", steps},
          {"global_batch", global_batch},
          {"final_train_loss", final_train_loss},
          {"wall_s", wall_s},
          {"samples_per_s", samples_per_s},
          {"ms_per_step", ms_per_step},
          {"warmup_s", warmup_s},
          {"skipped_steps", skipped_steps},
          {"graph_replays", graph_replays},
          {"loss_scale", loss_scale},
          {"parameter_bytes_per_rank", memory.parameters},
          {"gradient_bytes_per_rank", memory.gradients},
          {"optimizer_state_bytes_per_rank", memory.optimizer_state},
          {"training_flops_per_sample", training_flops_per_sample},
          {"mfu", mfu},
          {"peak_allocated_bytes_per_rank", peak_allocated_bytes_per_rank},
          {"peak_host_rss_bytes_per_rank", peak_host_rss_bytes_per_rank},
          {"resumed_from", resumed_from},
          {"steps_redone", steps_redone},
          {"last_checkpoint", last_checkpoint},
          {"stopped_by", stop_signal != 0 ? stop_signal_name(stop_signal) : ""},
          {"data_store",
           {{"kind", data_store},
            {"read_bytes_per_rank", data_store_read_bytes_per_rank},
            {"exchange_ms_per_step", data_store_exchange_ms_per_step}}},
          {"step_breakdown", breakdown.to_json()}};
  summary.update(storage_reads.to_json());
  summary.update(test.to_json("test_"));
  if (test_ema) summary.update(test_ema->to_json("test_ema_"));
  return summary;
}

nlohmann::json StepBreakdown::to_json() const {
  return {{"phase_timed_steps", phase_timed_steps},
          {"data_wait_ms", data_wait_ms},   {"forward_ms", forward_ms},
          {"backward_ms", backward_ms},     {"comm_wait_ms", comm_wait_ms},
          {"optimizer_ms", optimizer_ms},   {"comm_bytes_per_step", comm_bytes_per_step},
          {"busbw_gb_s", busbw_gb_s}};
}

StepsLeft steps_left(const StepPosition& at) {
  StepsLeft left;
  left.run = std::max<int64_t>(0, at.last_global_step - at.global_step);
  left.epoch =
      std::min(left.run, std::max<int64_t>(0, at.steps_per_epoch - (at.step_in_epoch + 1)));
  // This epoch's end is still to come (an epoch stopped by --max-steps is evaluated too), then
  // one for each (part of an) epoch of the steps after it.
  const int64_t later_steps = left.run - left.epoch;
  left.evaluations =
      1 + (later_steps + at.steps_per_epoch - 1) / std::max<int64_t>(1, at.steps_per_epoch);
  return left;
}

Eta estimate_eta(const StepsLeft& left, double ms_per_step, double evaluation_s) {
  Eta eta;
  eta.epoch_s = static_cast<double>(left.epoch) * ms_per_step / 1e3;
  eta.run_s = static_cast<double>(left.run) * ms_per_step / 1e3 +
              static_cast<double>(left.evaluations) * evaluation_s;
  return eta;
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const long long whole_s = std::llround(seconds);
  char text[48];
  if (whole_s < 3600)
    std::snprintf(text, sizeof text, "%lld:%02lld", whole_s / 60, whole_s % 60);
  else
    std::snprintf(text, sizeof text, "%lld:%02lld:%02lld", whole_s / 3600, whole_s / 60 % 60,
                  whole_s % 60);
  return text;
}

std::string describe_eta(const Eta& eta) {
  return "ETA epoch " + format_duration(eta.epoch_s) + ", run " + format_duration(eta.run_s);
}

void report_interval(const IntervalReport& r, JsonlWriter& metrics, bool print,
                     double evaluation_s) {
  const StepBreakdown& b = r.breakdown;
  const StepPosition& at = r.at;
  const Eta eta = estimate_eta(steps_left(at), r.ms_per_step, evaluation_s);
  nlohmann::json record = {{"kind", "train"},
                           {"epoch", at.epoch + 1},
                           {"step", at.global_step},
                           {"step_in_epoch", at.step_in_epoch + 1},
                           {"samples", at.samples_seen()},
                           {"loss", r.loss},
                           {"lr", r.lr},
                           {"samples_per_s", r.samples_per_s},
                           {"ms_per_step", r.ms_per_step},
                           {"buckets", r.buckets},
                           {"loss_scale", r.loss_scale},
                           {"skipped_steps", r.skipped_steps},
                           {"parameter_bytes", r.memory.parameters},
                           {"gradient_bytes", r.memory.gradients},
                           {"optimizer_state_bytes", r.memory.optimizer_state},
                           {"eta_epoch_s", eta.epoch_s},
                           {"eta_run_s", eta.run_s}};
  record.update(b.to_json());
  if (r.gpu) record.update(r.gpu->to_json());
  metrics.write(record);
  if (print) {
    std::printf("Epoch [%d/%d], Step [%lld/%lld], Loss: %.4f, %.1f samples/s, %.2f ms/step ",
                at.epoch + 1, at.epochs, static_cast<long long>(at.step_in_epoch + 1),
                static_cast<long long>(at.steps_per_epoch), r.loss, r.samples_per_s, r.ms_per_step);
    if (b.phase_timed_steps > 0)
      std::printf("(fwd %.1f, bwd %.1f, comm wait %.1f, opt %.1f; %.2f MB/step at %.2f GB/s busbw)",
                  b.forward_ms, b.backward_ms, b.comm_wait_ms, b.optimizer_ms,
                  b.comm_bytes_per_step / 1e6, b.busbw_gb_s);
    else
      std::printf("(CUDA graph replays; data wait %.2f)", b.data_wait_ms);
    if (r.show_loss_scale)
      std::printf(", loss scale %g, skipped %lld", r.loss_scale,
                  static_cast<long long>(r.skipped_steps));
    if (r.gpu && r.gpu->measured) std::printf("; %s", r.gpu->describe().c_str());
    // Last, so that the fields before keep their places (scripts read them).
    std::printf("; %s\n", describe_eta(eta).c_str());
  }
  std::fflush(stdout);
}

void print_progress_bar(int epoch, int epochs, int64_t step_in_epoch, int64_t steps_per_epoch,
                        double loss, const std::string& rate_and_eta) {
  constexpr int kBarWidth = 30;
  const int filled = static_cast<int>(kBarWidth * (step_in_epoch + 1) / steps_per_epoch);
  std::string bar(filled, '#');
  bar.resize(kBarWidth, '.');
  // Trailing blanks cover what a longer previous drawing left.
  std::printf("\rEpoch [%d/%d] [%s] %lld/%lld Loss: %.4f%s    ", epoch + 1, epochs, bar.c_str(),
              static_cast<long long>(step_in_epoch + 1), static_cast<long long>(steps_per_epoch),
              loss, rate_and_eta.c_str());
  std::fflush(stdout);
}

std::vector<ScalarEvent> interval_events(const IntervalReport& r) {
  const int64_t step = r.at.samples_seen();
  const std::string prefix = "Train/Samples/";
  std::vector<ScalarEvent> events = {{prefix + "train_loss", r.loss, step},
                                     {prefix + "lr", r.lr, step}};
  if (r.show_loss_scale) {
    events.push_back({prefix + "loss_scale", r.loss_scale, step});
    events.push_back({prefix + "skipped_steps", static_cast<double>(r.skipped_steps), step});
  }
  events.push_back({prefix + "samples_per_s", r.samples_per_s, step});
  events.push_back({prefix + "ms_per_step", r.ms_per_step, step});
  const StepBreakdown& b = r.breakdown;
  events.push_back({prefix + "elapsed_time_ms_data_wait", b.data_wait_ms, step});
  if (b.phase_timed_steps > 0) {
    events.push_back({prefix + "elapsed_time_ms_forward", b.forward_ms, step});
    events.push_back({prefix + "elapsed_time_ms_backward", b.backward_ms, step});
    events.push_back({prefix + "elapsed_time_ms_comm_wait", b.comm_wait_ms, step});
    events.push_back({prefix + "elapsed_time_ms_step", b.optimizer_ms, step});
    events.push_back({prefix + "comm_bytes_per_step", b.comm_bytes_per_step, step});
    events.push_back({prefix + "busbw_gb_s", b.busbw_gb_s, step});
  }
  // The GPU figures under their metrics.jsonl names (min and max over the ranks); NVML's are
  // null when nothing was measured, and then left out.
  if (r.gpu) {
    // Named: items() refers into the object, and a temporary in a range-for's initialiser dies
    // before the loop runs (every GPU run's second log interval crashed on that:
    // bench/results-notes.md, run_report.cpp GPU figures).
    const nlohmann::json gpu = r.gpu->to_json();
    for (const auto& item : gpu.items()) {
      if (item.value().is_number())
        events.push_back({prefix + item.key(), item.value().get<double>(), step});
    }
  }
  return events;
}

std::vector<ScalarEvent> epoch_events(const EpochReport& r) {
  const int64_t step = r.at.samples_seen();
  std::vector<ScalarEvent> events = {{"Train/Samples/epoch_train_loss", r.train_loss, step},
                                     {"Test/Samples/test_loss", r.test.loss, step},
                                     {"Test/Samples/test_accuracy", r.test.accuracy, step}};
  if (r.test.top5_accuracy)
    events.push_back({"Test/Samples/test_top5_accuracy", *r.test.top5_accuracy, step});
  return events;
}

int64_t highest_logged_step(const std::string& path) {
  std::ifstream in(path);
  int64_t highest = 0;
  std::string line;
  while (std::getline(in, line)) {
    const nlohmann::json record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!record.is_object()) continue;  // not JSON (parse's "discarded" value) or not a record
    const auto kind = record.find("kind");
    const auto step = record.find("step");
    if (kind == record.end() || *kind != "train" || step == record.end() ||
        !step->is_number_integer())
      continue;
    highest = std::max(highest, step->get<int64_t>());
  }
  return highest;
}

namespace {

// "2026-12-04T15:14:00Z": now, in UTC (ISO 8601).
std::string utc_time_now() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

}  // namespace

RunReporter::RunReporter(const TrainerOutput& output, int rank)
    : printing_(output.print && rank == 0), progress_bar_(output.progress_bar) {
  if (rank != 0) return;
  if (!output.run_dir.empty()) metrics_ = JsonlWriter(output.run_dir + "/metrics.jsonl");
  if (!output.tensorboard_dir.empty()) tensorboard_ = TensorBoardWriter(output.tensorboard_dir);
  if (!output.csv_monitor_dir.empty()) csv_monitor_ = CsvMonitorWriter(output.csv_monitor_dir);
}

void RunReporter::monitor(const std::vector<ScalarEvent>& events) {
  tensorboard_.write(events);
  csv_monitor_.write(events);
}

void RunReporter::say(const char* format, ...) {
  if (!printing_) return;
  va_list arguments;
  va_start(arguments, format);
  std::vprintf(format, arguments);
  va_end(arguments);
  std::fflush(stdout);
}

void RunReporter::run_start(const RunStart& s) {
  std::string steps_per_epoch = std::to_string(s.steps_per_epoch);
  if (s.steps_per_epoch_max != s.steps_per_epoch)
    steps_per_epoch += "-" + std::to_string(s.steps_per_epoch_max);
  say("Training %s (%lld parameters, %s, ZeRO stage %d) on %d rank(s) (rank 0: %s): %lld samples, "
      "%s steps per epoch, %lld steps in all, global batch %lld (%d x %d micro-steps x %d ranks)\n"
      "Per rank: parameters %.2f MB, gradients %.2f MB, optimizer state %.2f MB; "
      "%zu gradient buckets\n",
      s.model.c_str(), static_cast<long long>(s.parameters), s.precision.c_str(), s.zero_stage,
      s.world_size, s.placement.c_str(), static_cast<long long>(s.train_samples),
      steps_per_epoch.c_str(), static_cast<long long>(s.total_steps),
      static_cast<long long>(int64_t{s.micro_batch} * s.grad_accum * s.world_size), s.micro_batch,
      s.grad_accum, s.world_size, s.memory.parameters / 1e6, s.memory.gradients / 1e6,
      s.memory.optimizer_state / 1e6, s.buckets);
  if (!tensorboard_.path().empty())
    say("TensorBoard events: %s (watch with: tensorboard --logdir %s)\n",
        tensorboard_.path().c_str(),
        tensorboard_.path().substr(0, tensorboard_.path().rfind('/')).c_str());
  if (!csv_monitor_.directory().empty())
    say("CSV monitor: %s/<tag>.csv\n", csv_monitor_.directory().c_str());
}

void RunReporter::interval(const IntervalReport& report) {
  recent_samples_per_s_ = report.samples_per_s;
  recent_ms_per_step_ = report.ms_per_step;
  report_interval(report, metrics_, printing_ && !progress_bar_, evaluation_s_);
  monitor(interval_events(report));
}

void RunReporter::progress(const StepPosition& at, double loss) {
  if (!printing_ || !progress_bar_) return;
  std::string rate_and_eta;
  if (recent_ms_per_step_ > 0) {
    const Eta eta = estimate_eta(steps_left(at), recent_ms_per_step_, evaluation_s_);
    char rate[64];
    std::snprintf(rate, sizeof rate, ", %.1f samples/s, ", recent_samples_per_s_);
    rate_and_eta = rate + describe_eta(eta);
  }
  print_progress_bar(at.epoch, at.epochs, at.step_in_epoch, at.steps_per_epoch, loss,
                     rate_and_eta);
}

void RunReporter::end_progress() {
  if (printing_ && progress_bar_) std::printf("\n");
}

void RunReporter::checkpoint(const TrainingPosition& position, const char* why,
                             const std::string& path, double wait_s, bool background) {
  metrics_.write({{"kind", "checkpoint"},
                  {"step", position.global_step},
                  {"epoch", position.epoch + 1},
                  {"why", why},
                  {"path", path},
                  {"wait_s", wait_s},
                  {"background", background}});
  // A bar being drawn is ended first.
  say("%sCheckpoint (%s) after step %lld: %s in %.2f s%s\n", progress_bar_ ? "\n" : "", why,
      static_cast<long long>(position.global_step), path.c_str(), wait_s,
      background ? " (its file written in the background)" : "");
}

void RunReporter::epoch(const EpochReport& r) {
  evaluation_s_ = std::max(0.0, r.wall_s - r.train_s);
  nlohmann::json record = {{"kind", "epoch"},
                  {"epoch", r.at.epoch + 1},
                  {"complete", r.complete},
                  {"steps", r.at.global_step},
                  {"samples", r.at.samples_seen()},
                  {"train_loss", r.train_loss},
                  {"epoch_train_s", r.train_s},
                  {"epoch_s", r.wall_s},
                  {"loader_wait_s", r.loader_wait_s},
                  {"skipped_steps", r.skipped_steps},
                  {"loss_scale", r.loss_scale}};
  record.update(r.storage_reads.to_json());
  record.update(r.test.to_json("test_"));
  if (r.test_ema) record.update(r.test_ema->to_json("test_ema_"));
  metrics_.write(record);
  monitor(epoch_events(r));
  say("Epoch [%d/%d] %s in %.1f s: train loss %.4f, test loss %.4f, test accuracy %.2f%% "
      "(%lld/%lld)%s\n",
      r.at.epoch + 1, r.at.epochs, r.complete ? "done" : "stopped (max steps)", r.wall_s,
      r.train_loss, r.test.loss, 100.0 * r.test.accuracy, static_cast<long long>(r.test.correct),
      static_cast<long long>(r.test.samples), r.test.describe_top5_and_classes().c_str());
  if (r.test_ema)
    say("  EMA of the weights: test loss %.4f, test accuracy %.2f%% (%lld/%lld)%s\n",
        r.test_ema->loss, 100.0 * r.test_ema->accuracy,
        static_cast<long long>(r.test_ema->correct), static_cast<long long>(r.test_ema->samples),
        r.test_ema->describe_top5_and_classes().c_str());
}

void RunReporter::resumed(const ResumeReport& r) {
  const int64_t step = r.at.global_step;
  // Note [Resume record]: metrics_ writes on rank 0 only, where the earlier records are read.
  if (!metrics_.path().empty())
    steps_redone_ = std::max<int64_t>(0, highest_logged_step(metrics_.path()) - step);
  metrics_.write({{"kind", "resume"},
                  {"step", step},
                  {"checkpoint", r.checkpoint},
                  {"world_size", r.world_size},
                  {"checkpoint_world_size", r.checkpoint_world_size},
                  {"steps_redone", steps_redone_},
                  {"time", utc_time_now()}});
  // Note [Resume in TensorBoard]
  tensorboard_.session_start(r.at.samples_seen() + 1, r.checkpoint,
                             "resumed at step " + std::to_string(step) + " on " +
                                 std::to_string(r.world_size) + " rank(s)");
  // The line's head is what scripts grep (tests/test_resume.sh); the redone steps come last.
  say("Resumed from %s: step %lld, epoch %lld, %lld samples into it (saved by %d rank(s), "
      "continuing on %d); %lld step(s) logged after it are redone\n",
      r.checkpoint.c_str(), static_cast<long long>(step), static_cast<long long>(r.at.epoch + 1),
      static_cast<long long>(r.samples_in_epoch), r.checkpoint_world_size, r.world_size,
      static_cast<long long>(steps_redone_));
}

void add_throughput(TrainSummary& summary, const ThroughputClock& throughput, Communicator& comm) {
  summary.warmup_s =
      comm.all_reduce_scalar(throughput.warmup_ms(), ReduceOp::kMax, "warm-up ms") / 1e3;
  if (throughput.steps() == 0 || throughput.ms() <= 0) return;  // the same on every rank
  const double slowest_ms = comm.all_reduce_scalar(throughput.ms(), ReduceOp::kMax);
  summary.samples_per_s = 1e3 * comm.all_reduce_count(throughput.samples()) / slowest_ms;
  summary.ms_per_step = slowest_ms / static_cast<double>(throughput.steps());
}

TrainSummary starting_summary(const RunStart& start) {
  TrainSummary summary;
  summary.world_size = start.world_size;
  summary.model = start.model;
  summary.parameters = start.parameters;
  summary.zero_stage = start.zero_stage;
  summary.precision = start.precision;
  summary.placement = start.placement;
  summary.global_batch =
      static_cast<int64_t>(start.micro_batch) * start.grad_accum * start.world_size;
  return summary;
}

void add_data_store_figures(TrainSummary& summary, const SampleStore& store, int64_t steps,
                            Communicator& comm) {
  summary.data_store_read_bytes_per_rank =
      comm.gather_count(store.read_bytes(), 0, "data store read bytes");
  summary.data_store_exchange_ms_per_step =
      comm.all_reduce_scalar(store.exchange_ms(), ReduceOp::kMax, "data store exchange ms") /
      static_cast<double>(std::max<int64_t>(1, steps));
}

void add_host_memory_figures(TrainSummary& summary, Communicator& comm) {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  constexpr int64_t kBytesPerMaxrssUnit = 1024;  // Linux counts ru_maxrss in KiB
  summary.peak_host_rss_bytes_per_rank = comm.gather_count(
      static_cast<int64_t>(usage.ru_maxrss) * kBytesPerMaxrssUnit, 0, "peak resident bytes");
}

void add_gpu_figures(TrainSummary& summary, int cuda_device, Precision precision,
                     std::optional<double> forward_flops, Communicator& comm) {
  summary.peak_allocated_bytes_per_rank =
      comm.gather_count(allocator_peak_bytes(cuda_device), 0, "peak allocated bytes");
  if (!forward_flops) return;
  // LibTorch lets cuDNN convolve fp32 in TF32 by default, and convolutions dominate.
  const double peak = peak_flops_per_s(cuda_device_name(cuda_device), precision,
                                       /*fp32_as_tf32=*/true);
  summary.training_flops_per_sample = kTrainingFlopsPerForwardFlop * *forward_flops;
  summary.mfu = model_flops_utilization(summary.training_flops_per_sample, summary.samples_per_s,
                                        comm.size(), peak);
}

// Note [Storage reads per epoch]: each rank's /proc/self/io counters are taken where the first
// epoch starts and at every epoch's end (StorageReadClock), and the differences gathered at
// rank 0, as the GPU's peak allocation is. They count the whole process over the span: the
// loader thread's samples (with what it prefetched for the next steps), evaluation's test split,
// checkpoints written and read back; and in bytes of pages, so a sample read cold costs its
// bytes rounded up to pages.
// A rank without the counters reports -1 (null in the JSON): unknown, which 0 would hide.
namespace {

StorageReadsByRank gather_storage_reads(const std::optional<StorageReadBytes>& reads,
                                        Communicator& comm) {
  StorageReadsByRank by_rank;
  by_rank.storage_read_bytes =
      comm.gather_count(reads ? reads->storage_read_bytes : -1, 0, "storage read bytes");
  by_rank.syscall_read_bytes =
      comm.gather_count(reads ? reads->syscall_read_bytes : -1, 0, "read syscall bytes");
  return by_rank;
}

}  // namespace

StorageReadClock::StorageReadClock()
    : run_start_(process_storage_reads()), epoch_start_(run_start_) {}

StorageReadsByRank StorageReadClock::epoch_ended(Communicator& comm) {
  const std::optional<StorageReadBytes> now = process_storage_reads();
  const std::optional<StorageReadBytes> epoch = storage_reads_between(epoch_start_, now);
  epoch_start_ = now;
  return gather_storage_reads(epoch, comm);
}

StorageReadsByRank StorageReadClock::since_start(Communicator& comm) const {
  return gather_storage_reads(storage_reads_between(run_start_, process_storage_reads()), comm);
}

}  // namespace hpc_train
