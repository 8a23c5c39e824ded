// The training loss: the mean cross-entropy of the logits against the labels, in fp32 whatever
// the model dtype (LibTorch's cross_entropy(logits.to(kFloat), labels)), with torch's label
// smoothing (--label-smoothing; cross_entropy_items.h gives the formula).
//
// Note [Fused cross-entropy]
// LibTorch runs it as a cast of the logits to fp32, log_softmax and nll_loss, and backward as
// nll_loss's (a zero fill and a scatter), log_softmax's and the cast back: about seven launches
// on tensors of a micro-batch's few hundred to thousand values, each a few microseconds, which
// count in a step as short as simple_cnn's (bench/results-notes.md, Note [Fused cross-entropy]).
// On a GPU two kernels of ours do it (src/train/cross_entropy.cu): the forward computes every
// row's log-sum-exp and the mean loss, the backward the logits' gradient (softmax - one-hot) x
// grad / rows straight in the model dtype. The arithmetic is fp32, as LibTorch's, in another
// order: the loss and gradient agree with LibTorch's to fp32 rounding (tests/test_kernel_items.cpp
// states the bounds), not bit for bit. Everywhere else LibTorch's ops run.
#pragma once

#include <torch/types.h>

namespace hpc_train {

// logits [rows, classes], labels [rows] int64 in [0, classes), label_smoothing in [0, 1).
// Returns the mean loss, fp32 [].
torch::Tensor mean_cross_entropy(const torch::Tensor& logits, const torch::Tensor& labels,
                                 double label_smoothing = 0.0);

// Whether mean_cross_entropy runs the fused kernels for these inputs (the tests ask); false in
// a build without CUDA.
bool fused_cross_entropy_applies(const torch::Tensor& logits, const torch::Tensor& labels);

namespace detail {
// The build's fused path (cross_entropy_cuda.cpp, cross_entropy_cpu.cpp).
torch::Tensor fused_cross_entropy(const torch::Tensor& logits, const torch::Tensor& labels,
                                  double label_smoothing);
}  // namespace detail

}  // namespace hpc_train
