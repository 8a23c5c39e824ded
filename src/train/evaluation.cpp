#include "hpc_train/train/evaluation.h"

#include <torch/torch.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "hpc_train/data/batch_loader.h"
#include "hpc_train/data/epoch_plan.h"
#include "hpc_train/train/training_state.h"

namespace hpc_train {

Evaluator::Evaluator(const DatasetFile& dataset, Split split, c10::Device device,
                     c10::ScalarType dtype, bool channels_last, uint64_t seed,
                     int64_t batch_samples, int prefetch_batches, Communicator& comm)
    : dataset_(dataset), split_(split), device_(device), channels_last_(channels_last),
      seed_(seed), batch_samples_(batch_samples), prefetch_batches_(prefetch_batches),
      comm_(comm),
      input_(dataset.info(), device, dtype, AugmentOptions{}, seed, comm.rank(), batch_samples) {}

EvalResult Evaluator::evaluate(TrainableModel& model) {
  broadcast_buffers(model, comm_);
  torch::NoGradGuard no_grad;
  model.eval();
  std::vector<int64_t> indices =
      rank_epoch_indices(seed_, 0, dataset_.info().size(split_), comm_.size(), comm_.rank(),
                         EpochTail::kUneven, /*shuffle=*/false);
  int64_t samples = 0;
  // Sums stay on the device until the end: no wait for the GPU per batch.
  const auto on_device = torch::TensorOptions().device(device_);
  torch::Tensor loss_total = torch::zeros({}, on_device.dtype(torch::kDouble));
  torch::Tensor correct_total = torch::zeros({}, on_device.dtype(torch::kLong));
  auto add_batch = [&](const DeviceBatch& batch) {
    const torch::Tensor logits =
        model.forward(in_model_layout(batch.input, channels_last_)).to(torch::kFloat);
    loss_total.add_(torch::nn::functional::cross_entropy(
        logits, batch.labels,
        torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum)));
    correct_total.add_(logits.argmax(1).eq(batch.labels).sum());
    samples += batch.labels.size(0);
  };
  if (resident_) {
    const auto count = static_cast<int64_t>(indices.size());
    for (int64_t begin = 0, b = 0; begin < count; begin += batch_samples_, ++b) {
      const int64_t end = std::min(count, begin + batch_samples_);
      input_.prepare_resident({indices.begin() + begin, indices.begin() + end}, b, 0);
      add_batch(input_.take());
    }
  } else {
    BatchLoader loader(dataset_, split_, std::move(indices), batch_samples_, prefetch_batches_);
    HostBatch host_batch;
    while (loader.next(host_batch)) add_batch(input_.to_device(host_batch, 0));
  }
  EvalResult result;
  result.samples = comm_.all_reduce_count(samples);
  result.correct = comm_.all_reduce_count(correct_total.item<int64_t>());
  const double total_loss = comm_.all_reduce_scalar(loss_total.item<double>());
  if (result.samples > 0) {
    result.loss = total_loss / static_cast<double>(result.samples);
    result.accuracy = static_cast<double>(result.correct) / static_cast<double>(result.samples);
  }
  return result;
}

void Evaluator::keep_split_resident() {
  input_.keep_split_resident(dataset_, split_);
  resident_ = true;
}

}  // namespace hpc_train
