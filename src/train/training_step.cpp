#include "hpc_train/train/training_step.h"

#include <ATen/Context.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/StreamGuard.h>
#include <torch/torch.h>

#include "hpc_train/comm/reducer.h"
#include "hpc_train/monitor/metrics.h"
#include "hpc_train/optim/zero_optimizer.h"
#include "hpc_train/train/cross_entropy.h"
#include "hpc_train/train/run_options.h"

namespace hpc_train {

TrainingStep::TrainingStep(TrainableModel& model, Reducer& reducer, ZeroOptimizer& optimizer,
                           int world_size, const TrainConfig& config, bool channels_last,
                           bool cuda, const torch::Device& device)
    : model_(model), reducer_(reducer), optimizer_(optimizer), world_size_(world_size),
      config_(config), channels_last_(channels_last), cuda_(cuda),
      loss_sum_(torch::zeros({}, torch::TensorOptions().dtype(torch::kDouble).device(device))) {}

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
void TrainingStep::enqueue(const DeviceBatch& batch, MicroStep micro, IntervalTimes* phases) {
  Stopwatch phase;
  if (cuda_)  // Note [cuDNN autotuning] (run_options.h)
    at::globalContext().setBenchmarkCuDNN(cudnn_autotunes(config_, batch.labels.size(0)));
  model_.train();
  const torch::Tensor logits = model_.forward(in_model_layout(batch.input, channels_last_));
  // Note [Fused cross-entropy]
  const torch::Tensor loss = mean_cross_entropy(logits, batch.labels, config_.label_smoothing);
  if (phases) phases->forward_ms += phase.elapsed_ms();
  phase.restart();
  reducer_.begin_backward(micro.ends_update);
  const double averaging = 1.0 / (world_size_ * static_cast<double>(micro.window_micro_steps));
  loss.backward(optimizer_.loss_gradient(loss, averaging));
  if (phases) phases->backward_ms += phase.elapsed_ms();
  const double comm_wait_ms = reducer_.finish_backward();
  // Every micro-step's: partitioned gradients are reduced inside the window too (Note
  // [Partitioned gradients] in reducer.h); a micro-step that reduced nothing adds zeros.
  if (phases) {
    phases->comm_wait_ms += comm_wait_ms;
    phases->comm_span_ms += reducer_.comm_span_ms();
    phases->comm_bytes += reducer_.bytes_last_backward();
  }
  loss_sum_.add_(loss.detach());
  if (!micro.ends_update) return;
  phase.restart();
  // On a GPU overflows and the loss scale stay there; the log reads them (ZeroOptimizer::report).
  optimizer_.step();
  if (phases) phases->optimizer_ms += phase.elapsed_ms();
}

void TrainingStep::discard() { reducer_.discard_backward(); }

double TrainingStep::take_loss_sum() {
  const double sum = loss_sum_.item<double>();
  loss_sum_.zero_();
  return sum;
}

// Note [Training step warm-up]
// CUDA loads a library's kernels (one fatbinary of cuDNN, cuBLAS, LibTorch or hpc_train) at the
// first launch of one of them: the origin's first step spent most of its time in such loads, on
// autograd's thread, after the model phase had spent most of its own in its loads. The driver
// loads on several threads at once: three groups of first uses finished sooner on three threads
// than on one (bench/results-notes.md, Note [Training step warm-up]). So on a GPU, while the
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

}  // namespace hpc_train
