#include "hpc_train/trainer.h"

#include <torch/torch.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <optional>

#include "hpc_train/batch_loader.h"
#include "hpc_train/comm.h"
#include "hpc_train/epoch_plan.h"
#include "hpc_train/error.h"
#include "hpc_train/flat_parameters.h"
#include "hpc_train/metrics.h"
#include "hpc_train/models.h"
#include "hpc_train/optimizer.h"

namespace hpc_train {

namespace {

// Evaluation batches are larger than training ones: no gradients are kept, and the result does
// not depend on the batch size.
constexpr int64_t kEvalBatchSamples = 256;

// Step-time breakdown of the current log interval, milliseconds summed over its steps.
struct IntervalTimes {
  int64_t steps = 0;
  int64_t samples = 0;
  double loss_sum = 0.0;
  double data_wait_ms = 0.0;
  double forward_ms = 0.0;
  double backward_ms = 0.0;
  double comm_ms = 0.0;
  double optimizer_ms = 0.0;
  Stopwatch wall;
};

}  // namespace

void set_compute_threads(int threads) { at::set_num_threads(std::max(1, threads)); }

nlohmann::json TrainSummary::to_json() const {
  return {{"world_size", world_size},
          {"model", model},
          {"parameters", parameters},
          {"epochs_completed", epochs_completed},
          {"steps", steps},
          {"global_batch", global_batch},
          {"final_train_loss", final_train_loss},
          {"test_loss", test.loss},
          {"test_accuracy", test.accuracy},
          {"test_correct", test.correct},
          {"test_samples", test.samples},
          {"wall_s", wall_s},
          {"samples_per_s", samples_per_s},
          {"ms_per_step", ms_per_step}};
}

struct Trainer::Impl {
  TrainConfig config;
  const DatasetFile& dataset;
  Communicator comm;
  TrainerOutput output;
  std::shared_ptr<Model> model;
  FlatParameters flat;
  std::optional<FlatAdam> optimizer;
  torch::Tensor mean;  // [1, C, 1, 1]
  torch::Tensor std;
  JsonlWriter metrics;
  bool is_printer = false;  // rank 0 with printing on

  Impl(const TrainConfig& c, const DatasetFile& d, MPI_Comm mpi_comm, TrainerOutput out)
      : config(c), dataset(d), comm(mpi_comm), output(std::move(out)) {
    const DatasetInfo& info = dataset.info();
    if (samples_for_rank(info.train_size, comm.size(), comm.rank(),
                         config.drop_last ? EpochTail::kDrop : EpochTail::kPad) == 0)
      throw ConfigError("the train split of " + dataset.path() + " has " +
                        std::to_string(info.train_size) + " samples, fewer than the " +
                        std::to_string(comm.size()) + " ranks; use fewer ranks or more data");
    torch::manual_seed(config.seed);
    model = make_model(config.model, {info.channels, info.height, info.width, info.num_classes});
    std::vector<std::string> names;
    std::vector<at::Tensor> parameters;
    for (const auto& item : model->named_parameters()) {
      names.push_back(item.key());
      parameters.push_back(item.value());
    }
    flat = FlatParameters(names, std::move(parameters));
    // Every rank starts from rank 0's parameters and buffers.
    comm.broadcast(flat.values(), 0).wait();
    broadcast_buffers();
    optimizer.emplace(adam_options(config.optimizer, config.lr, config.beta1, config.beta2,
                                   config.eps, config.weight_decay),
                      flat.values());
    mean = torch::tensor(info.mean).view({1, info.channels, 1, 1});
    std = torch::tensor(info.std).view({1, info.channels, 1, 1});
    is_printer = output.print && comm.rank() == 0;
    if (comm.rank() == 0 && !output.run_dir.empty())
      metrics = JsonlWriter(output.run_dir + "/metrics.jsonl");
  }

  // Batch-norm running statistics are updated by each rank from its own batches; like DDP's
  // broadcast_buffers, rank 0's are the model's. They matter only in evaluation (and export).
  void broadcast_buffers() {
    for (auto& buffer : model->buffers()) {
      at::Tensor contiguous = buffer.contiguous();
      comm.broadcast(contiguous, 0).wait();
      if (!contiguous.is_same(buffer)) buffer.copy_(contiguous);
    }
  }

  torch::Tensor to_model_input(const HostBatch& batch) const {
    const DatasetInfo& info = dataset.info();
    // from_blob does not own the bytes: the conversion below copies before `batch` is reused.
    const torch::Tensor bytes = torch::from_blob(
        const_cast<uint8_t*>(batch.images.data()),
        {batch.size, info.channels, info.height, info.width}, torch::kUInt8);
    return bytes.to(torch::kFloat).div_(255.0).sub_(mean).div_(std);
  }

  static torch::Tensor to_labels(const HostBatch& batch) {
    return torch::from_blob(const_cast<int64_t*>(batch.labels.data()), {batch.size},
                            torch::kLong);
  }

  // Note [Gradient averaging]
  // Each rank's loss is the mean over its micro-batch, and every rank's micro-batch has the same
  // size (the epoch plan pads or drops so that it does). The mean of the ranks' gradients is
  // then the gradient of the mean loss over the global batch: we sum by all-reduce and divide by
  // the world size, which makes N ranks with micro-batch b match 1 rank with batch N*b.
  double train_step(const HostBatch& batch, IntervalTimes& times) {
    Stopwatch phase;
    model->train();
    const torch::Tensor logits = model->forward(to_model_input(batch));
    const torch::Tensor loss = torch::nn::functional::cross_entropy(logits, to_labels(batch));
    times.forward_ms += phase.elapsed_ms();
    phase.restart();
    loss.backward();
    times.backward_ms += phase.elapsed_ms();
    phase.restart();
    comm.all_reduce(flat.grads()).wait();
    if (comm.size() > 1) flat.grads().div_(comm.size());
    times.comm_ms += phase.elapsed_ms();
    phase.restart();
    optimizer->step(flat.values(), flat.grads());
    flat.zero_grads();
    times.optimizer_ms += phase.elapsed_ms();
    return loss.item<double>();
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
    HostBatch batch;
    while (loader.next(batch)) {
      const torch::Tensor logits = model->forward(to_model_input(batch));
      const torch::Tensor labels = to_labels(batch);
      loss_sum += torch::nn::functional::cross_entropy(
                      logits, labels,
                      torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                      .item<double>();
      correct += logits.argmax(1).eq(labels).sum().item<int64_t>();
      samples += batch.size;
    }
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

  void print_progress_bar(int epoch, int64_t step_in_epoch, int64_t steps_per_epoch,
                          double loss) const {
    constexpr int kBarWidth = 30;
    const int filled = static_cast<int>(kBarWidth * (step_in_epoch + 1) / steps_per_epoch);
    std::string bar(filled, '#');
    bar.resize(kBarWidth, '.');
    std::printf("\rEpoch [%d/%d] [%s] %lld/%lld Loss: %.4f", epoch + 1, config.epochs,
                bar.c_str(), static_cast<long long>(step_in_epoch + 1),
                static_cast<long long>(steps_per_epoch), loss);
    std::fflush(stdout);
  }

  // Rank 0's log line and metrics record for the interval that ends with this step.
  // Collective (the interval's loss is averaged over ranks).
  void log_interval(int epoch, int64_t step_in_epoch, int64_t steps_per_epoch,
                    int64_t global_step, IntervalTimes& times) {
    const double loss =
        comm.all_reduce_scalar(times.loss_sum) / (comm.size() * static_cast<double>(times.steps));
    const double interval_ms = times.wall.elapsed_ms();
    const double samples_per_s = 1e3 * times.samples * comm.size() / interval_ms;
    const double steps = static_cast<double>(times.steps);
    metrics.write({{"kind", "train"},
                   {"epoch", epoch + 1},
                   {"step", global_step},
                   {"step_in_epoch", step_in_epoch + 1},
                   {"loss", loss},
                   {"samples_per_s", samples_per_s},
                   {"ms_per_step", interval_ms / steps},
                   {"data_wait_ms", times.data_wait_ms / steps},
                   {"forward_ms", times.forward_ms / steps},
                   {"backward_ms", times.backward_ms / steps},
                   {"comm_ms", times.comm_ms / steps},
                   {"optimizer_ms", times.optimizer_ms / steps}});
    if (is_printer && !output.progress_bar)
      std::printf("Epoch [%d/%d], Step [%lld/%lld], Loss: %.4f, %.1f samples/s, %.2f ms/step\n",
                  epoch + 1, config.epochs, static_cast<long long>(step_in_epoch + 1),
                  static_cast<long long>(steps_per_epoch), loss, samples_per_s,
                  interval_ms / steps);
    std::fflush(stdout);
    times = IntervalTimes{};
  }

  TrainSummary run() {
    Stopwatch run_wall;
    const DatasetInfo& info = dataset.info();
    const EpochTail tail = config.drop_last ? EpochTail::kDrop : EpochTail::kPad;
    const int64_t rank_samples = samples_for_rank(info.train_size, comm.size(), comm.rank(), tail);
    const int64_t steps_per_epoch = batches_per_epoch(rank_samples, config.micro_batch);
    TrainSummary summary;
    summary.world_size = comm.size();
    summary.model = config.model;
    summary.parameters = flat.numel();
    summary.global_batch = static_cast<int64_t>(config.micro_batch) * comm.size();
    if (is_printer)
      std::printf("Training %s (%lld parameters) on %d rank(s): %lld samples, %lld steps per "
                  "epoch, global batch %lld\n",
                  config.model.c_str(), static_cast<long long>(flat.numel()), comm.size(),
                  static_cast<long long>(info.train_size),
                  static_cast<long long>(steps_per_epoch),
                  static_cast<long long>(summary.global_batch));

    int64_t global_step = 0;
    int64_t samples_after_first_step = 0;  // per rank
    double train_ms_after_first_step = 0.0;
    bool reached_max_steps = false;
    for (int epoch = 0; epoch < config.epochs && !reached_max_steps; ++epoch) {
      Stopwatch epoch_wall;
      BatchLoader loader(dataset, Split::kTrain,
                         rank_epoch_indices(config.seed, epoch, info.train_size, comm.size(),
                                            comm.rank(), tail, /*shuffle=*/true),
                         config.micro_batch, config.prefetch_batches);
      IntervalTimes times;
      double epoch_loss_sum = 0.0;
      int64_t epoch_steps = 0;
      HostBatch batch;
      for (int64_t step_in_epoch = 0;; ++step_in_epoch) {
        Stopwatch step_wall;
        if (!loader.next(batch)) break;
        times.data_wait_ms += step_wall.elapsed_ms();
        const double loss = train_step(batch, times);
        ++global_step;
        ++epoch_steps;
        epoch_loss_sum += loss;
        times.loss_sum += loss;
        times.samples += batch.size;
        ++times.steps;
        if (global_step > 1) {
          samples_after_first_step += batch.size;
          train_ms_after_first_step += step_wall.elapsed_ms();
        }
        if (is_printer && output.progress_bar)
          print_progress_bar(epoch, step_in_epoch, steps_per_epoch, loss);
        reached_max_steps = config.max_steps > 0 && global_step >= config.max_steps;
        const bool last_of_epoch = step_in_epoch + 1 == steps_per_epoch || reached_max_steps;
        if ((step_in_epoch + 1) % config.log_every == 0 || last_of_epoch)
          log_interval(epoch, step_in_epoch, steps_per_epoch, global_step, times);
        if (reached_max_steps) break;
      }
      if (is_printer && output.progress_bar) std::printf("\n");
      const double epoch_train_ms = epoch_wall.elapsed_ms();
      summary.final_train_loss =
          comm.all_reduce_scalar(epoch_loss_sum) / (comm.size() * std::max<int64_t>(1, epoch_steps));
      const bool epoch_complete = epoch_steps == steps_per_epoch;
      if (epoch_complete) ++summary.epochs_completed;
      summary.test = evaluate();
      metrics.write({{"kind", "epoch"},
                     {"epoch", epoch + 1},
                     {"complete", epoch_complete},
                     {"steps", global_step},
                     {"train_loss", summary.final_train_loss},
                     {"test_loss", summary.test.loss},
                     {"test_accuracy", summary.test.accuracy},
                     {"epoch_train_s", epoch_train_ms / 1e3},
                     {"epoch_s", epoch_wall.elapsed_ms() / 1e3},
                     {"loader_wait_s", loader.wait_ms() / 1e3}});
      if (is_printer)
        std::printf("Epoch [%d/%d] %s in %.1f s: train loss %.4f, test loss %.4f, test accuracy "
                    "%.2f%% (%lld/%lld)\n",
                    epoch + 1, config.epochs, epoch_complete ? "done" : "stopped (max steps)",
                    epoch_wall.elapsed_ms() / 1e3, summary.final_train_loss, summary.test.loss,
                    100.0 * summary.test.accuracy, static_cast<long long>(summary.test.correct),
                    static_cast<long long>(summary.test.samples));
      std::fflush(stdout);
    }
    summary.steps = global_step;
    summary.wall_s = run_wall.elapsed_ms() / 1e3;
    if (global_step > 1 && train_ms_after_first_step > 0) {
      // Per-rank rates times ranks; the slowest rank sets the pace, so take its time.
      const double slowest_ms = comm.all_reduce_scalar(train_ms_after_first_step, ReduceOp::kMax);
      summary.samples_per_s =
          1e3 * comm.all_reduce_count(samples_after_first_step) / slowest_ms;
      summary.ms_per_step = slowest_ms / static_cast<double>(global_step - 1);
    }
    return summary;
  }
};

Trainer::Trainer(const TrainConfig& config, const DatasetFile& dataset, MPI_Comm comm,
                 TrainerOutput output)
    : impl_(std::make_unique<Impl>(config, dataset, comm, std::move(output))) {}

Trainer::~Trainer() = default;

TrainSummary Trainer::run() { return impl_->run(); }

EvalResult Trainer::evaluate() { return impl_->evaluate(); }

at::Tensor Trainer::flat_parameters() const { return impl_->flat.values(); }

}  // namespace hpc_train
