// Note [Evaluation sums]: the loss, top-1, top-5, per-class accuracy and confusion matrix that
// EvalSums adds up on the device and sums over ranks, against references computed here with
// plain loops (log-sum-exp in double, a sort per row), at 1 and 3 ranks: each rank adds its
// rank-strided part of the same samples, in batches whose padding rows must not count.
#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>
#include <vector>

#include "hpc_train/comm/comm.h"
#include "hpc_train/monitor/run_report.h"
#include "hpc_train/train/evaluation.h"

using hpc_train::Communicator;
using hpc_train::EvalResult;
using hpc_train::EvalSums;
using hpc_train::kTopKClasses;

namespace {

struct Reference {
  double loss = 0.0;
  int64_t correct = 0;
  int64_t correct_top5 = 0;
  std::vector<int64_t> confusion;
};

// The figures of `logits` [n, classes] and `labels` [n], one sample at a time.
Reference reference(const torch::Tensor& logits, const torch::Tensor& labels) {
  const int64_t n = logits.size(0), classes = logits.size(1);
  const auto x = logits.to(torch::kDouble).contiguous();
  const double* values = x.data_ptr<double>();
  Reference ref;
  ref.confusion.assign(static_cast<size_t>(classes * classes), 0);
  for (int64_t i = 0; i < n; ++i) {
    const double* row = values + i * classes;
    const int64_t label = labels[i].item<int64_t>();
    const double highest = *std::max_element(row, row + classes);
    double exp_sum = 0.0;
    for (int64_t c = 0; c < classes; ++c) exp_sum += std::exp(row[c] - highest);
    ref.loss += highest + std::log(exp_sum) - row[label];
    const int64_t predicted = std::max_element(row, row + classes) - row;
    ref.confusion[label * classes + predicted] += 1;
    ref.correct += predicted == label;
    std::vector<int64_t> order(static_cast<size_t>(classes));
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return row[a] > row[b]; });
    if (classes >= kTopKClasses)
      ref.correct_top5 += std::find(order.begin(), order.begin() + kTopKClasses, label) !=
                          order.begin() + kTopKClasses;
  }
  return ref;
}

// Adds this rank's rank-strided rows of (logits, labels) to `sums`, `batch` rows at a time, each
// batch filled up with rows of garbage (as Evaluator's last batch is) that must not count.
int64_t add_share(EvalSums& sums, const torch::Tensor& logits, const torch::Tensor& labels,
                  int64_t batch, const Communicator& comm) {
  const torch::Tensor rows = torch::arange(comm.rank(), logits.size(0), comm.size());
  const torch::Tensor mine = logits.index_select(0, rows), my_labels = labels.index_select(0, rows);
  for (int64_t begin = 0; begin < mine.size(0); begin += batch) {
    const int64_t count = std::min(batch, mine.size(0) - begin);
    const torch::Tensor filler = torch::randn({batch - count, logits.size(1)}) * 100.0;
    sums.add(torch::cat({mine.narrow(0, begin, count), filler}),
             torch::cat({my_labels.narrow(0, begin, count),
                         torch::zeros({batch - count}, torch::kLong)}),
             count);
  }
  return mine.size(0);
}

TEST(EvaluationSums, MatchTheReferenceOverRanks) {
  Communicator comm(MPI_COMM_WORLD);
  for (const int64_t classes : {12, 5, 3}) {
    torch::manual_seed(7 + classes);  // the same samples on every rank
    const int64_t n = 101;
    const torch::Tensor logits = torch::randn({n, classes}) * 3.0;
    const torch::Tensor labels = torch::randint(classes, {n}, torch::kLong);
    EvalSums sums(classes, torch::kCPU);
    const int64_t share = add_share(sums, logits, labels, /*batch=*/8, comm);
    const EvalResult result = sums.reduce(comm, share);
    const Reference ref = reference(logits, labels);
    SCOPED_TRACE("classes " + std::to_string(classes));
    EXPECT_EQ(result.samples, n);
    EXPECT_EQ(result.num_classes, classes);
    EXPECT_NEAR(result.loss, ref.loss / n, 1e-5);
    EXPECT_EQ(result.correct, ref.correct);
    EXPECT_DOUBLE_EQ(result.accuracy, static_cast<double>(ref.correct) / n);
    EXPECT_EQ(result.confusion, ref.confusion);
    if (classes >= kTopKClasses) {
      ASSERT_TRUE(result.correct_top5.has_value());
      EXPECT_EQ(*result.correct_top5, ref.correct_top5);
      EXPECT_DOUBLE_EQ(*result.top5_accuracy, static_cast<double>(ref.correct_top5) / n);
      EXPECT_GE(*result.correct_top5, result.correct);
    } else {
      // Note [Top-5 accuracy]: no top-5 figure below 5 classes.
      EXPECT_FALSE(result.correct_top5.has_value());
      EXPECT_FALSE(result.top5_accuracy.has_value());
    }
    if (classes == 5) EXPECT_EQ(result.correct_top5, n);  // every label is in the top 5 of 5
  }
}

// A hand-computed case: 3 classes, 4 samples (two of class 0, one of class 1, none of class 2).
TEST(EvaluationSums, HandComputedConfusionAndClassAccuracy) {
  Communicator comm(MPI_COMM_WORLD);
  const torch::Tensor logits = torch::tensor({{2.0f, 0.0f, 0.0f},    // 0 -> 0
                                              {0.0f, 1.0f, 0.0f},    // 0 -> 1
                                              {0.0f, 0.0f, 3.0f},    // 1 -> 2
                                              {0.0f, 0.0f, 0.0f}})   // filler, not counted
                                 .view({4, 3});
  const torch::Tensor labels = torch::tensor({0, 0, 1, 2}, torch::kLong);
  EvalSums sums(3, torch::kCPU);
  // Only rank 0 holds samples: the other ranks add nothing and still take part.
  if (comm.rank() == 0) sums.add(logits, labels, 3);
  const EvalResult result = sums.reduce(comm, comm.rank() == 0 ? 3 : 0);
  EXPECT_EQ(result.samples, 3);
  EXPECT_EQ(result.correct, 1);
  EXPECT_EQ(result.confusion, (std::vector<int64_t>{1, 1, 0, 0, 0, 1, 0, 0, 0}));
  EXPECT_EQ(result.class_samples(), (std::vector<int64_t>{2, 1, 0}));
  const std::vector<std::optional<double>> per_class = result.class_accuracy();
  ASSERT_EQ(per_class.size(), 3u);
  EXPECT_DOUBLE_EQ(*per_class[0], 0.5);
  EXPECT_DOUBLE_EQ(*per_class[1], 0.0);
  EXPECT_FALSE(per_class[2].has_value());
  // -log softmax of the label: (log(e^2 + 2) - 2) + log(e^0 + e^1 + e^0) + (log(2 + e^3))
  const double expected = (std::log(std::exp(2.0) + 2.0) - 2.0) +
                          std::log(2.0 + std::exp(1.0)) + std::log(2.0 + std::exp(3.0));
  EXPECT_NEAR(result.loss, expected / 3.0, 1e-6);

  const nlohmann::json json = result.to_json("test_");
  EXPECT_EQ(json["test_correct"], 1);
  EXPECT_TRUE(json["test_top5_accuracy"].is_null());
  EXPECT_EQ(json["test_class_accuracy"], nlohmann::json::parse("[0.5, 0.0, null]"));
  EXPECT_EQ(result.describe_top5_and_classes(), "; per class 50.0 0.0 - %");
}

TEST(EvaluationSums, LogTextOfManyClasses) {
  EvalResult result;
  result.num_classes = 30;
  result.confusion.assign(30 * 30, 0);
  for (int64_t c = 0; c < 30; ++c) result.confusion[c * 30 + c] = 1;
  result.confusion[7 * 30 + 1] = 3;  // class 7: 1 of 4
  result.top5_accuracy = 0.96;
  EXPECT_EQ(result.describe_top5_and_classes(),
            ", top-5 96.00%; per class 25.0% (class 7) to 100.0% (class 0)");
}

}  // namespace
