#include "hpc_train/model/model_names.h"

namespace hpc_train {

// Families together, small to large; models.h says what each name is.
const std::vector<std::string>& model_names() {
  static const std::vector<std::string> names = {
      "simple_cnn",        "resnet18",          "resnet34",          "resnet50",
      "resnet18_imagenet", "resnet34_imagenet", "resnet50_imagenet", "wide_resnet16_8",
      "vgg11_bn",          "vgg16_bn"};
  return names;
}

std::string model_names_text() {
  std::string text;
  for (const std::string& name : model_names()) text += (text.empty() ? "" : ", ") + name;
  return text;
}

}  // namespace hpc_train
