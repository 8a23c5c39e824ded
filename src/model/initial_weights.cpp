#include "hpc_train/model/initial_weights.h"

#include <torch/torch.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <set>

#include "hpc_train/error.h"
#include "hpc_train/io/safetensors.h"

namespace hpc_train {
namespace {

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

// The safetensors dtypes LibTorch has (every LibTorch this builds with).
const std::map<std::string, torch::Dtype>& known_dtypes() {
  static const std::map<std::string, torch::Dtype> dtypes = {
      {"F64", torch::kDouble}, {"F32", torch::kFloat}, {"F16", torch::kHalf},
      {"BF16", torch::kBFloat16}, {"I64", torch::kLong}, {"I32", torch::kInt},
      {"I16", torch::kShort},  {"I8", torch::kChar},   {"U8", torch::kByte},
      {"BOOL", torch::kBool}};
  return dtypes;
}

// The tensor `name` of the file, as a CPU tensor of the file's dtype.
torch::Tensor read_tensor(const std::string& path, const SafetensorsHeader& header,
                          const SafetensorsTensorInfo& info) {
  const auto dtype = known_dtypes().find(info.dtype);
  if (dtype == known_dtypes().end()) {
    std::string known;
    for (const auto& entry : known_dtypes()) known += (known.empty() ? "" : ", ") + entry.first;
    throw DataError(path + ": tensor " + info.name + " has dtype " + info.dtype +
                    ", which cannot be loaded into a model; known here: " + known);
  }
  const std::vector<uint8_t> bytes = read_safetensors_tensor(path, header, info.name);
  torch::Tensor tensor = torch::empty(info.shape, torch::TensorOptions().dtype(dtype->second));
  // The header's validation made bytes = product(shape) x element size; safetensors is
  // little-endian, as every host this runs on.
  if (!bytes.empty()) std::memcpy(tensor.data_ptr(), bytes.data(), bytes.size());
  return tensor;
}

void append_list(std::string& text, const std::vector<std::string>& items, size_t max_listed) {
  if (items.empty()) return;
  if (!text.empty()) text += "; ";
  for (size_t i = 0; i < items.size() && i < max_listed; ++i) text += (i ? "; " : "") + items[i];
  if (items.size() > max_listed)
    text += "; and " + std::to_string(items.size() - max_listed) + " more";
}

}  // namespace

WeightsMatch match_weights(const std::vector<NamedShape>& file,
                           const std::vector<NamedShape>& model) {
  std::map<std::string, const NamedShape*> in_file;
  for (const NamedShape& tensor : file) in_file.emplace(tensor.name, &tensor);
  std::set<std::string> in_model;
  WeightsMatch match;
  for (const NamedShape& tensor : model) {
    in_model.insert(tensor.name);
    const auto found = in_file.find(tensor.name);
    if (found == in_file.end())
      match.missing.push_back(tensor);
    else if (found->second->shape != tensor.shape)
      match.mismatched.push_back({tensor.name, found->second->shape, tensor.shape});
    else
      match.matched.push_back(tensor.name);
  }
  for (const NamedShape& tensor : file)
    if (in_model.count(tensor.name) == 0) match.unexpected.push_back(tensor);
  return match;
}

std::string describe_weights_loaded(const WeightsMatch& match, const std::string& path) {
  const size_t model_tensors =
      match.matched.size() + match.missing.size() + match.mismatched.size();
  if (match.complete())
    return "Initial weights: all " + std::to_string(model_tensors) + " tensors from " + path;
  return "Initial weights: " + std::to_string(match.matched.size()) + " of the model's " +
         std::to_string(model_tensors) + " tensors from " + path + " (partial); left: " +
         describe_unmatched(match, SIZE_MAX);
}

std::string describe_unmatched(const WeightsMatch& match, size_t max_listed) {
  std::vector<std::string> missing, unexpected, mismatched;
  for (const NamedShape& t : match.missing) missing.push_back("missing " + t.name + " " + shape_text(t.shape));
  for (const NamedShape& t : match.unexpected)
    unexpected.push_back("unexpected " + t.name + " " + shape_text(t.shape));
  for (const WeightsMatch::Mismatch& t : match.mismatched)
    mismatched.push_back(t.name + " is " + shape_text(t.file_shape) + " in the file, " +
                         shape_text(t.model_shape) + " in the model");
  std::string text;
  append_list(text, mismatched, max_listed);
  append_list(text, missing, max_listed);
  append_list(text, unexpected, max_listed);
  return text;
}

WeightsMatch load_initial_weights(const std::string& path, bool partial, TrainableModel& model,
                                  const std::string& model_name) {
  const SafetensorsHeader header = read_safetensors_header(path);
  std::vector<NamedShape> file;
  for (const SafetensorsTensorInfo& tensor : header.tensors) file.push_back({tensor.name, tensor.shape});
  std::vector<TrainableModel::NamedTensor> state = model.named_parameters();
  for (TrainableModel::NamedTensor& buffer : model.named_buffers()) state.push_back(std::move(buffer));
  std::vector<NamedShape> expected;
  for (const TrainableModel::NamedTensor& tensor : state)
    expected.push_back({tensor.name, tensor.tensor.sizes().vec()});

  const WeightsMatch match = match_weights(file, expected);
  if (!partial && !match.complete())
    throw DataError(path + ": the weights do not fit the model " + model_name +
                    " (a strict load): " + describe_unmatched(match) +
                    ". --init-weights-partial loads the tensors that fit and lists the others");
  if (match.matched.empty())
    throw DataError(path + ": no tensor of the file fits the model " + model_name + ": " +
                    describe_unmatched(match, 3));

  // Every tensor read and checked before the first is copied: a file refused halfway leaves
  // the model as it was.
  const std::set<std::string> matched(match.matched.begin(), match.matched.end());
  std::vector<std::pair<torch::Tensor, torch::Tensor>> copies;  // (model's, file's)
  for (const TrainableModel::NamedTensor& target : state) {
    if (matched.count(target.name) == 0) continue;
    torch::Tensor source = read_tensor(path, header, *header.find(target.name));
    if (!target.tensor.is_floating_point() && source.is_floating_point() &&
        !(source.eq(source.trunc()) & torch::isfinite(source)).all().item<bool>())
      throw DataError(path + ": tensor " + target.name + " holds fractions or non-finite "
                      "values; the model's " + target.name + " is " +
                      std::string(c10::toString(target.tensor.scalar_type())) +
                      " (whole numbers)");
    copies.emplace_back(target.tensor, std::move(source));
  }
  torch::NoGradGuard no_grad;
  // copy_ converts the dtype and copies to the model's device.
  for (auto& [model_tensor, file_tensor] : copies) model_tensor.copy_(file_tensor);
  return match;
}

}  // namespace hpc_train
