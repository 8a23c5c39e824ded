#include "hpc_train/train/evaluation.h"

#include <torch/torch.h>

#include <algorithm>
#include <optional>
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

EvalSums::EvalSums(int64_t num_classes, c10::Device device) : num_classes_(num_classes) {
  const auto on_device = torch::TensorOptions().device(device);
  loss_total_ = torch::zeros({}, on_device.dtype(torch::kDouble));
  if (num_classes >= kTopKClasses) correct_top5_ = torch::zeros({}, on_device.dtype(torch::kLong));
  confusion_ = torch::zeros({num_classes * num_classes}, on_device.dtype(torch::kLong));
}

void EvalSums::add(const torch::Tensor& logits, const torch::Tensor& labels, int64_t count) {
  const torch::Tensor counted = logits.narrow(0, 0, count).to(torch::kFloat);
  const torch::Tensor counted_labels = labels.narrow(0, 0, count);
  loss_total_.add_(torch::nn::functional::cross_entropy(
      counted, counted_labels,
      torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum)));
  // Row label, column prediction: a count added at label * classes + prediction. (Not
  // bincount: on a GPU it reads the largest index back to size its output, a wait per batch.)
  const torch::Tensor cells = counted_labels * num_classes_ + counted.argmax(1);
  confusion_.index_add_(0, cells, torch::ones_like(cells));
  if (correct_top5_.defined())
    correct_top5_.add_(std::get<1>(counted.topk(kTopKClasses, 1))
                           .eq(counted_labels.unsqueeze(1))
                           .any(1)
                           .sum());
}

EvalResult EvalSums::reduce(Communicator& comm, int64_t samples) const {
  // One wait for the device, one collective (Note [Evaluation sums]): the loss, the samples, the
  // top-5 hits, then the confusion matrix.
  const torch::Tensor confusion = confusion_.to(torch::kDouble).cpu();
  std::vector<double> sums = {loss_total_.item<double>(), static_cast<double>(samples),
                              correct_top5_.defined() ? correct_top5_.item<double>() : 0.0};
  sums.insert(sums.end(), confusion.data_ptr<double>(),
              confusion.data_ptr<double>() + confusion.numel());
  comm.all_reduce_doubles(sums, ReduceOp::kSum, "evaluation sums");
  EvalResult result;
  result.num_classes = num_classes_;
  result.samples = static_cast<int64_t>(sums[1]);
  result.confusion.assign(sums.begin() + 3, sums.end());
  for (int64_t label = 0; label < num_classes_; ++label)
    result.correct += result.confusion[label * num_classes_ + label];
  if (correct_top5_.defined()) result.correct_top5 = static_cast<int64_t>(sums[2]);
  if (result.samples > 0) {
    const auto samples_total = static_cast<double>(result.samples);
    result.loss = sums[0] / samples_total;
    result.accuracy = static_cast<double>(result.correct) / samples_total;
    if (result.correct_top5)
      result.top5_accuracy = static_cast<double>(*result.correct_top5) / samples_total;
  }
  return result;
}

namespace {

// Note [Evaluation sums]: predictions, like the sums, stay on the device until the share is
// done. The columns of one sample as they travel to rank 0 (as doubles: exact for the
// indices and classes, and for the fp32 probabilities).
class PredictionRows {
 public:
  explicit PredictionRows(int64_t num_classes)
      : top_k_(std::min(kTopKClasses, num_classes)) {}

  void add(const torch::Tensor& logits, const torch::Tensor& labels, int64_t count) {
    const torch::Tensor counted = logits.narrow(0, 0, count).to(torch::kFloat);
    auto [probabilities, classes] = torch::softmax(counted, 1).topk(top_k_, 1);
    labels_.push_back(labels.narrow(0, 0, count));
    predicted_.push_back(counted.argmax(1));
    classes_.push_back(classes);
    probabilities_.push_back(probabilities);
  }

  // Every rank's rows at rank 0, in split order; `indices`: this rank's samples, in the order
  // added. Collective.
  void gather(const std::vector<int64_t>& indices, Communicator& comm, SplitPredictions& out) {
    const int64_t width = 3 + 2 * top_k_;  // index, label, predicted, classes, probabilities
    const auto share = static_cast<int64_t>(indices.size());
    std::vector<double> rows(static_cast<size_t>(share * width));
    if (share > 0) {
      const auto as_double = [](std::vector<torch::Tensor>& parts) {
        return torch::cat(parts).to(torch::kDouble).cpu().contiguous();
      };
      const torch::Tensor labels = as_double(labels_), predicted = as_double(predicted_),
                          classes = as_double(classes_), probabilities = as_double(probabilities_);
      for (int64_t i = 0; i < share; ++i) {
        double* row = rows.data() + i * width;
        row[0] = static_cast<double>(indices[i]);
        row[1] = labels.data_ptr<double>()[i];
        row[2] = predicted.data_ptr<double>()[i];
        std::copy_n(classes.data_ptr<double>() + i * top_k_, top_k_, row + 3);
        std::copy_n(probabilities.data_ptr<double>() + i * top_k_, top_k_, row + 3 + top_k_);
      }
    }
    const int64_t row_bytes = width * static_cast<int64_t>(sizeof(double));
    const std::vector<int64_t> shares = comm.gather_count(share, 0, "prediction rows");
    std::vector<int64_t> send_bytes(comm.size(), 0), recv_bytes(comm.size(), 0);
    send_bytes[0] = share * row_bytes;
    int64_t total = 0;
    for (size_t r = 0; r < shares.size(); ++r) {
      recv_bytes[r] = shares[r] * row_bytes;
      total += shares[r];
    }
    std::vector<double> all(static_cast<size_t>(total * width));
    comm.all_to_all_bytes(reinterpret_cast<const uint8_t*>(rows.data()), send_bytes,
                          reinterpret_cast<uint8_t*>(all.data()), recv_bytes, "prediction rows");
    if (comm.rank() != 0) return;
    std::vector<int64_t> order(static_cast<size_t>(total));
    for (int64_t i = 0; i < total; ++i) order[i] = i;
    std::sort(order.begin(), order.end(),
              [&](int64_t a, int64_t b) { return all[a * width] < all[b * width]; });
    out = SplitPredictions{};
    out.top_classes_per_sample = top_k_;
    for (const int64_t i : order) {
      const double* row = all.data() + i * width;
      out.index.push_back(static_cast<int64_t>(row[0]));
      out.label.push_back(static_cast<int64_t>(row[1]));
      out.predicted.push_back(static_cast<int64_t>(row[2]));
      for (int64_t k = 0; k < top_k_; ++k) {
        out.top_classes.push_back(static_cast<int64_t>(row[3 + k]));
        out.top_probabilities.push_back(static_cast<float>(row[3 + top_k_ + k]));
      }
    }
  }

 private:
  int64_t top_k_;
  std::vector<torch::Tensor> labels_, predicted_, classes_, probabilities_;
};

}  // namespace

void Evaluator::warm_up(const torch::Tensor& logits) const {
  EvalSums sums(dataset_.info().num_classes, device_);
  const auto labels_options = torch::TensorOptions().device(device_).dtype(torch::kLong);
  sums.add(logits, torch::zeros({logits.size(0)}, labels_options), logits.size(0));
}

torch::Tensor Evaluator::sample_input() const {
  const DatasetInfo& info = dataset_.info();
  return in_model_layout(torch::zeros({batch_samples_, info.channels, info.height, info.width},
                                      torch::TensorOptions().dtype(dtype_).device(device_)),
                         channels_last_);
}

EvalResult Evaluator::evaluate(TrainableModel& model, SplitPredictions* predictions) {
  broadcast_buffers(model, comm_);
  torch::NoGradGuard no_grad;
  model.eval();
  std::vector<int64_t> indices =
      rank_epoch_indices(seed_, 0, dataset_.info().size(split_), comm_.size(), comm_.rank(),
                         EpochTail::kUneven, /*shuffle=*/false);
  // Note [One evaluation shape]: the last batch filled up with copies of the last sample.
  const auto share = static_cast<int64_t>(indices.size());
  // The share's samples in order, for the predictions' rows (the loader takes `indices`).
  const std::vector<int64_t> share_indices = predictions ? indices : std::vector<int64_t>{};
  if (share > 0)
    indices.resize(batches_per_epoch(share, batch_samples_) * batch_samples_, indices.back());
  int64_t samples = 0;
  EvalSums sums(dataset_.info().num_classes, device_);
  std::optional<PredictionRows> rows;
  if (predictions) rows.emplace(dataset_.info().num_classes);
  // Adds the batch's first samples, those of the share, to the sums.
  auto add_batch = [&](const DeviceBatch& batch) {
    const int64_t count = std::min(batch_samples_, share - samples);
    const torch::Tensor logits = model.forward(in_model_layout(batch.input, channels_last_));
    sums.add(logits, batch.labels, count);
    if (rows) rows->add(logits, batch.labels, count);
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
  EvalResult result = sums.reduce(comm_, samples);
  if (rows) rows->gather(share_indices, comm_, *predictions);
  return result;
}

void Evaluator::keep_split_resident() {
  input_.keep_split_resident(dataset_, split_);
  resident_ = true;
}

}  // namespace hpc_train
