// What the threads of the cross-entropy kernels do (cross_entropy.cu; Note [Fused cross-entropy]
// in cross_entropy.h), as functions that compile for the GPU and for the host: the kernels call
// them per row and per element, and test_kernel_items calls them on the CPU against
// LibTorch's cross_entropy and its gradient.
//
// Logits [rows, classes] row-major in the model dtype, labels int64; all arithmetic in fp32.
// A row's loss is log(sum exp(x - max)) + max - x[label], LibTorch's log_softmax and nll_loss
// in one; the gradient of the mean loss is (softmax - one_hot(label)) x grad / rows, from the
// row's log-sum-exp kept by the forward. A label outside [0, classes) makes the row's loss NaN
// (and its gradient NaN) instead of a read out of bounds; the dataset's checks keep labels in
// range before training starts.
//
// With label smoothing e (torch's CrossEntropyLoss(label_smoothing=e)) the target is
// (1 - e) one_hot + e / classes: a row's loss is (1 - e)(lse - x[label]) + e (lse - mean_k x[k]),
// the gradient (softmax - (1 - e) one_hot - e / classes) x grad / rows.
#pragma once

#include <cmath>
#include <cstdint>

#ifdef __CUDACC__
#define HPC_TRAIN_LOSS_FUNCTION __host__ __device__ __forceinline__
#else
#define HPC_TRAIN_LOSS_FUNCTION inline
#endif

namespace hpc_train {

// The problem: its shape, and the loss's label smoothing (0: none).
struct CrossEntropyShape {
  int64_t rows = 0, classes = 0;
  float label_smoothing = 0.0f;
};

// Row `row`'s loss; its log-sum-exp into *lse.
template <typename T, typename Convert>
HPC_TRAIN_LOSS_FUNCTION float cross_entropy_row(const CrossEntropyShape& s, const T* logits,
                                                const int64_t* labels, int64_t row, float* lse) {
  const T* x = logits + row * s.classes;
  float largest = -INFINITY;
  for (int64_t k = 0; k < s.classes; ++k) largest = fmaxf(largest, Convert::to_float(x[k]));
  float sum = 0.0f;
  float sum_of_logits = 0.0f;  // for label smoothing
  for (int64_t k = 0; k < s.classes; ++k) {
    const float value = Convert::to_float(x[k]);
    sum += expf(value - largest);
    sum_of_logits += value;
  }
  *lse = largest + logf(sum);
  const int64_t label = labels[row];
  if (label < 0 || label >= s.classes) return NAN;
  const float nll = *lse - Convert::to_float(x[label]);
  if (s.label_smoothing == 0.0f) return nll;
  const float smooth = *lse - sum_of_logits / static_cast<float>(s.classes);
  return (1.0f - s.label_smoothing) * nll + s.label_smoothing * smooth;
}

// The gradient's element `element` (row-major) of the mean loss, scaled by *grad_loss.
template <typename T, typename Convert>
HPC_TRAIN_LOSS_FUNCTION void cross_entropy_grad_element(const CrossEntropyShape& s,
                                                        const T* logits, const int64_t* labels,
                                                        const float* lse, const float* grad_loss,
                                                        int64_t element, T* grad_logits) {
  const int64_t row = element / s.classes, k = element % s.classes;
  const int64_t label = labels[row];
  const float target = (k == label ? 1.0f - s.label_smoothing : 0.0f) +
                       s.label_smoothing / static_cast<float>(s.classes);
  const float softmax = expf(Convert::to_float(logits[element]) - lse[row]);
  const float scale = *grad_loss / static_cast<float>(s.rows);
  const float value = label < 0 || label >= s.classes ? NAN : (softmax - target) * scale;
  grad_logits[element] = Convert::template from_float<T>(value);
}

}  // namespace hpc_train
