// --init-weights (initial_weights.h): the match of a file against a model by name and shape,
// its description, and the load into a model's parameters and buffers: values bitwise (or as
// rounded by the dtype conversion), strict refusals naming each tensor and both shapes, a partial
// load that leaves the rest untouched, integer buffers, unknown dtypes. A small TrainableModel
// of three tensors stands for a network; tests/test_torchscript.sh loads real ones.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "hpc_train/error.h"
#include "hpc_train/model/initial_weights.h"
#include "hpc_train/io/safetensors.h"
#include "expect_error.h"

using namespace hpc_train;
namespace fs = std::filesystem;

namespace {

// weight [2, 3] (a parameter), running_mean [3] and num_batches_tracked [] (int64) as buffers.
class SmallModel : public TrainableModel {
 public:
  SmallModel()
      : weight_(torch::arange(6, torch::kFloat).reshape({2, 3}).requires_grad_()),
        running_mean_(torch::full({3}, -1.0f)),
        count_(torch::zeros({}, torch::kLong)) {}
  torch::Tensor forward(const torch::Tensor& images) override { return images; }
  std::vector<NamedTensor> named_parameters() const override { return {{"fc.weight", weight_}}; }
  std::vector<NamedTensor> named_buffers() const override {
    return {{"bn.running_mean", running_mean_}, {"bn.num_batches_tracked", count_}};
  }
  void train(bool) override {}
  void to(const torch::Device&, torch::Dtype dtype) override {
    weight_.set_data(weight_.to(dtype));
    running_mean_.set_data(running_mean_.to(dtype));
  }
  const std::string& identity() const override { return identity_; }
  std::optional<double> forward_flops_per_sample() const override { return std::nullopt; }

  torch::Tensor weight_, running_mean_, count_;
  std::string identity_ = "small";
};

struct FileTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  torch::Tensor values;  // converted to `dtype`'s torch type when written
};

class InitialWeightsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "hpc_train_init_weights_XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const std::vector<FileTensor>& tensors) {
    const std::string path = (fs::path(dir_) / name).string();
    std::vector<torch::Tensor> keep;
    std::vector<SafetensorsEntry> entries;
    for (const FileTensor& t : tensors) {
      static const std::map<std::string, torch::Dtype> dtypes = {
          {"F32", torch::kFloat}, {"F16", torch::kHalf}, {"BF16", torch::kBFloat16},
          {"F64", torch::kDouble}, {"I64", torch::kLong}, {"I32", torch::kInt}};
      torch::Tensor data = dtypes.count(t.dtype)
                               ? t.values.to(dtypes.at(t.dtype)).contiguous()
                               : torch::zeros({static_cast<int64_t>(
                                     safetensors_dtype_bytes(t.dtype) *
                                     std::max<int64_t>(1, torch::tensor(t.shape).prod().item<int64_t>()))},
                                              torch::kByte);
      keep.push_back(data);
      entries.push_back({t.name, t.dtype, t.shape, data.data_ptr(),
                         static_cast<size_t>(data.numel() * data.element_size())});
    }
    write_safetensors(path, entries);
    return path;
  }

  // The DataError's message (fails when there is none, or when it does not name the file).
  std::string refusal(const std::string& path, bool partial, TrainableModel& model) {
    return ::test_support::data_error_naming(
        path, [&] { load_initial_weights(path, partial, model, "small"); });
  }

  std::string dir_;
};

std::vector<FileTensor> full_state() {
  return {{"fc.weight", "F32", {2, 3}, torch::tensor({0.5f, -1.25f, 3.0f, 1e-3f, 7.0f, -2.0f}).reshape({2, 3})},
          {"bn.running_mean", "F32", {3}, torch::tensor({0.1f, 0.2f, 0.3f})},
          {"bn.num_batches_tracked", "I64", {}, torch::tensor(17, torch::kLong)}};
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(MatchWeights, ByNameAndShape) {
  const std::vector<NamedShape> model = {{"a", {2}}, {"b", {3, 4}}, {"c", {}}, {"d", {5}}};
  const std::vector<NamedShape> file = {{"x", {1}}, {"c", {}}, {"b", {4, 3}}, {"a", {2}}};
  const WeightsMatch match = match_weights(file, model);
  EXPECT_EQ(match.matched, (std::vector<std::string>{"a", "c"}));
  ASSERT_EQ(match.missing.size(), 1u);
  EXPECT_EQ(match.missing[0].name, "d");
  ASSERT_EQ(match.unexpected.size(), 1u);
  EXPECT_EQ(match.unexpected[0].name, "x");
  ASSERT_EQ(match.mismatched.size(), 1u);
  EXPECT_EQ(match.mismatched[0].file_shape, (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(match.mismatched[0].model_shape, (std::vector<int64_t>{3, 4}));
  EXPECT_FALSE(match.complete());
  EXPECT_EQ(describe_unmatched(match),
            "b is [4, 3] in the file, [3, 4] in the model; missing d [5]; unexpected x [1]");
  EXPECT_TRUE(match_weights(model, model).complete());

  std::vector<NamedShape> many;
  for (int i = 0; i < 5; ++i) many.push_back({"t" + std::to_string(i), {1}});
  EXPECT_EQ(describe_unmatched(match_weights({}, many), 2), "missing t0 [1]; missing t1 [1]; and 3 more");
}

TEST_F(InitialWeightsTest, LoadsEveryTensorBitwise) {
  SmallModel model;
  const WeightsMatch match =
      load_initial_weights(write("full.safetensors", full_state()), false, model, "small");
  EXPECT_TRUE(match.complete());
  for (const FileTensor& t : full_state()) {
    const auto& tensor = t.name == "fc.weight"         ? model.weight_
                         : t.name == "bn.running_mean" ? model.running_mean_
                                                       : model.count_;
    EXPECT_TRUE(torch::equal(tensor, t.values.to(tensor.scalar_type()))) << t.name;
  }
  EXPECT_EQ(model.count_.scalar_type(), torch::kLong);
  EXPECT_TRUE(model.weight_.requires_grad());       // still a parameter
  EXPECT_FALSE(model.weight_.grad_fn());            // a leaf: the copy recorded nothing
}

TEST_F(InitialWeightsTest, ConvertsDtypesBothWays) {
  // A 16-bit file into an fp32 model: the file's values exactly (every 16-bit value is a float).
  for (const char* dtype : {"F16", "BF16", "F64"}) {
    std::vector<FileTensor> state = full_state();
    for (FileTensor& t : state)
      if (t.dtype == "F32") t.dtype = dtype;
    SmallModel model;
    load_initial_weights(write(std::string(dtype) + ".safetensors", state), false, model, "small");
    const torch::Dtype file_dtype = std::string(dtype) == "F16"    ? torch::kHalf
                                    : std::string(dtype) == "BF16" ? torch::kBFloat16
                                                                   : torch::kDouble;
    EXPECT_TRUE(torch::equal(model.weight_, state[0].values.to(file_dtype).to(torch::kFloat))) << dtype;
  }
  // An fp32 file into a bf16 model: rounded as a cast rounds.
  SmallModel model;
  model.to(torch::kCPU, torch::kBFloat16);
  load_initial_weights(write("f32.safetensors", full_state()), false, model, "small");
  EXPECT_TRUE(torch::equal(model.weight_, full_state()[0].values.to(torch::kBFloat16)));
}

TEST_F(InitialWeightsTest, IntegerBuffersTakeWholeNumbersOnly) {
  std::vector<FileTensor> state = full_state();
  state[2] = {"bn.num_batches_tracked", "F32", {}, torch::tensor(17.0f)};  // a 16-bit run's export
  SmallModel model;
  load_initial_weights(write("whole.safetensors", state), false, model, "small");
  EXPECT_EQ(model.count_.item<int64_t>(), 17);
  EXPECT_EQ(model.count_.scalar_type(), torch::kLong);
  state[2].values = torch::tensor(17.5f);
  EXPECT_TRUE(contains(refusal(write("fraction.safetensors", state), false, model),
                       "bn.num_batches_tracked"));
}

TEST_F(InitialWeightsTest, StrictNamesEveryTensorThatDoesNotFit) {
  SmallModel model;
  std::vector<FileTensor> state = full_state();
  state.erase(state.begin() + 1);                                         // missing running_mean
  state.push_back({"head.bias", "F32", {4}, torch::zeros({4})});         // unexpected
  state[0] = {"fc.weight", "F32", {3, 2}, torch::zeros({3, 2})};          // another shape
  const std::string message = refusal(write("bad.safetensors", state), false, model);
  EXPECT_TRUE(contains(message, "missing bn.running_mean [3]")) << message;
  EXPECT_TRUE(contains(message, "unexpected head.bias [4]")) << message;
  EXPECT_TRUE(contains(message, "fc.weight is [3, 2] in the file, [2, 3] in the model")) << message;
  EXPECT_TRUE(contains(message, "do not fit the model small")) << message;
  EXPECT_TRUE(contains(message, "--init-weights-partial")) << message;
  // Nothing was loaded.
  EXPECT_TRUE(torch::equal(model.weight_, torch::arange(6, torch::kFloat).reshape({2, 3})));
  EXPECT_EQ(model.count_.item<int64_t>(), 0);
}

TEST_F(InitialWeightsTest, PartialLoadsWhatFitsAndReportsTheRest) {
  SmallModel model;
  std::vector<FileTensor> state = full_state();
  state[0] = {"fc.weight", "F32", {5, 3}, torch::zeros({5, 3})};  // a new head's shape
  state.push_back({"old_head.weight", "F32", {1}, torch::zeros({1})});
  const WeightsMatch match =
      load_initial_weights(write("head.safetensors", state), true, model, "small");
  EXPECT_EQ(match.matched, (std::vector<std::string>{"bn.running_mean", "bn.num_batches_tracked"}));
  ASSERT_EQ(match.mismatched.size(), 1u);
  EXPECT_EQ(match.mismatched[0].name, "fc.weight");
  ASSERT_EQ(match.unexpected.size(), 1u);
  EXPECT_TRUE(torch::equal(model.weight_, torch::arange(6, torch::kFloat).reshape({2, 3})));  // kept
  EXPECT_TRUE(torch::equal(model.running_mean_, full_state()[1].values));
  EXPECT_EQ(model.count_.item<int64_t>(), 17);

  // A partial load of which nothing fits is a wrong file.
  const std::string message = refusal(
      write("nothing.safetensors", {{"other", "F32", {2}, torch::zeros({2})}}), true, model);
  EXPECT_TRUE(contains(message, "no tensor")) << message;
}

TEST_F(InitialWeightsTest, RefusesDtypesWithoutATorchType) {
  std::vector<FileTensor> state = full_state();
  state[1] = {"bn.running_mean", "F8_E4M3", {3}, torch::Tensor()};
  SmallModel model;
  const std::string message = refusal(write("f8.safetensors", state), false, model);
  EXPECT_TRUE(contains(message, "bn.running_mean") && contains(message, "F8_E4M3")) << message;
  EXPECT_TRUE(contains(refusal((fs::path(dir_) / "absent.safetensors").string(), false, model),
                       "cannot open"));
}

}  // namespace
