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
    : dataset_(dataset), split_(split), device_(device), dtype_(dtype),
      channels_last_(channels_last), seed_(seed), batch_samples_(batch_samples),
      prefetch_batches_(prefetch_batches), comm_(comm),
      input_(dataset.info(), device, dtype, AugmentOptions{}, seed, comm.rank(), batch_samples) {}

void Evaluator::add_to_sums(const torch::Tensor& logits, const torch::Tensor& labels, int64_t count,
                            torch::Tensor& loss_total, torch::Tensor& correct_total) {
  const torch::Tensor counted = logits.narrow(0, 0, count).to(torch::kFloat);
  const torch::Tensor counted_labels = labels.narrow(0, 0, count);
  loss_total.add_(torch::nn::functional::cross_entropy(
      counted, counted_labels,
      torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum)));
  correct_total.add_(counted.argmax(1).eq(counted_labels).sum());
}

void Evaluator::warm_up(const torch::Tensor& logits) const {
  const auto on_device = torch::TensorOptions().device(device_);
  torch::Tensor loss_total = torch::zeros({}, on_device.dtype(torch::kDouble));
  torch::Tensor correct_total = torch::zeros({}, on_device.dtype(torch::kLong));
  add_to_sums(logits, torch::zeros({logits.size(0)}, on_device.dtype(torch::kLong)),
              logits.size(0), loss_total, correct_total);
}

torch::Tensor Evaluator::sample_input() const {
  const DatasetInfo& info = dataset_.info();
  return in_model_layout(torch::zeros({batch_samples_, info.channels, info.height, info.width},
                                      torch::TensorOptions().dtype(dtype_).device(device_)),
                         channels_last_);
}

EvalResult Evaluator::evaluate(TrainableModel& model) {
  broadcast_buffers(model, comm_);
  torch::NoGradGuard no_grad;
  model.eval();
  std::vector<int64_t> indices =
      rank_epoch_indices(seed_, 0, dataset_.info().size(split_), comm_.size(), comm_.rank(),
                         EpochTail::kUneven, /*shuffle=*/false);
  // Note [One evaluation shape]: the last batch filled up with copies of the last sample.
  const auto share = static_cast<int64_t>(indices.size());
  if (share > 0)
    indices.resize(batches_per_epoch(share, batch_samples_) * batch_samples_, indices.back());
  int64_t samples = 0;
  // Sums stay on the device until the end: no wait for the GPU per batch.
  const auto on_device = torch::TensorOptions().device(device_);
  torch::Tensor loss_total = torch::zeros({}, on_device.dtype(torch::kDouble));
  torch::Tensor correct_total = torch::zeros({}, on_device.dtype(torch::kLong));
  // Adds the batch's first samples, those of the share, to the sums.
  auto add_batch = [&](const DeviceBatch& batch) {
    const int64_t count = std::min(batch_samples_, share - samples);
    add_to_sums(model.forward(in_model_layout(batch.input, channels_last_)), batch.labels, count,
                loss_total, correct_total);
    samples += count;
  };
  if (resident_) {
    const auto padded = static_cast<int64_t>(indices.size());
    for (int64_t begin = 0, b = 0; begin < padded; begin += batch_samples_, ++b) {
      input_.prepare_resident(
          {indices.begin() + begin, indices.begin() + begin + batch_samples_}, b, 0);
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
