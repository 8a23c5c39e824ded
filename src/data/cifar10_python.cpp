// The CIFAR-10 "python version" (cifar-10-batches-py, what torchvision downloads): six pickled
// dicts of b'data' (a uint8 numpy array, one 3072-byte row an image: the R, G and B planes of
// 32x32, as the binary version's records) and b'labels' (a list of ints), and batches.meta with
// b'label_names'. Read through the restricted pickle reader (pickle_reader.h).
#include <filesystem>

#include "data/source_formats.h"
#include "hpc_train/data/pickle_reader.h"
#include "hpc_train/error.h"

namespace hpc_train {
namespace {

namespace fs = std::filesystem;
using Kind = PickleValue::Kind;

constexpr int64_t kCifarSide = 32;
constexpr int64_t kCifarImageBytes = 3 * kCifarSide * kCifarSide;
constexpr int kTrainBatches = 5;

Pickle read_pickle_file(const std::string& path) {
  if (!regular_file_exists(path)) throw DataError(path + ": no such file");
  const std::vector<uint8_t> bytes = read_whole_file(path);
  if (bytes.empty()) throw DataError(path + ": empty file");
  return parse_pickle(path, bytes.data(), bytes.size());
}

const PickleValue& entry(const std::string& path, const PickleValue& dict, const std::string& key,
                         Kind kind) {
  if (dict.kind != Kind::kDict)
    throw DataError(path + ": holds a " + pickle_kind_name(dict.kind) + ", expected a dict");
  const PickleValue* value = dict.find(key);
  if (!value) throw DataError(path + ": no '" + key + "' in its dict");
  if (value->kind != kind)
    throw DataError(path + ": '" + key + "' is a " + pickle_kind_name(value->kind) +
                    ", expected a " + pickle_kind_name(kind));
  return *value;
}

// Appends one batch's images and labels.
void read_batch(const std::string& path, std::vector<uint8_t>& images,
                std::vector<int64_t>& labels, int64_t num_classes) {
  const Pickle pickle = read_pickle_file(path);
  const PickleValue& data = entry(path, *pickle.root, "data", Kind::kArray);
  const PickleValue& label_list = entry(path, *pickle.root, "labels", Kind::kList);
  if (data.dtype != "|u1" && data.dtype != "=u1" && data.dtype != "<u1")
    throw DataError(path + ": 'data' has dtype '" + data.dtype.substr(1) + "', expected uint8");
  if (data.shape.size() != 2 || data.shape[1] != kCifarImageBytes)
    throw DataError(path + ": 'data' is not N x 3072 (3x32x32 images, one a row)");
  if (static_cast<size_t>(data.shape[0]) != label_list.items.size())
    throw DataError(path + ": 'data' has " + std::to_string(data.shape[0]) + " images but " +
                    "'labels' has " + std::to_string(label_list.items.size()) + " labels");
  std::vector<int64_t> batch_labels;
  for (size_t i = 0; i < label_list.items.size(); ++i) {
    const PickleValue& label = *label_list.items[i];
    if (label.kind != Kind::kInt)
      throw DataError(path + ": labels[" + std::to_string(i) + "] is a " +
                      pickle_kind_name(label.kind) + ", expected an int");
    batch_labels.push_back(label.integer);
  }
  check_labels(path, batch_labels, num_classes);
  labels.insert(labels.end(), batch_labels.begin(), batch_labels.end());
  images.insert(images.end(), data.array_data.begin(), data.array_data.end());
}

}  // namespace

DatasetContents read_cifar10_python_dataset(const std::string& source_dir,
                                            const ConvertOptions& options) {
  // The archive unpacks into cifar-10-batches-py/; accept that folder or its parent.
  std::string dir = source_dir;
  std::error_code error;
  const fs::path nested = fs::path(source_dir) / "cifar-10-batches-py";
  if (!fs::exists(fs::path(source_dir) / "batches.meta", error) &&
      fs::exists(nested / "batches.meta", error))
    dir = nested.string();

  DatasetContents contents;
  DatasetInfo& info = contents.info;
  const std::string meta_path = (fs::path(dir) / "batches.meta").string();
  {
    const Pickle meta = read_pickle_file(meta_path);
    const PickleValue& names = entry(meta_path, *meta.root, "label_names", Kind::kList);
    for (size_t k = 0; k < names.items.size(); ++k) {
      if (!names.items[k]->is_string())
        throw DataError(meta_path + ": label_names[" + std::to_string(k) + "] is a " +
                        pickle_kind_name(names.items[k]->kind) + ", expected a string");
      info.class_names.push_back(names.items[k]->bytes);
    }
    if (info.class_names.empty()) throw DataError(meta_path + ": label_names is empty");
  }
  info.num_classes = static_cast<int64_t>(info.class_names.size());
  info.channels = 3;
  info.height = info.width = kCifarSide;
  info.source = "cifar10 python pickles in " + dir;
  for (int b = 1; b <= kTrainBatches; ++b)
    read_batch((fs::path(dir) / ("data_batch_" + std::to_string(b))).string(),
               contents.train_images, contents.train_labels, info.num_classes);
  read_batch((fs::path(dir) / "test_batch").string(), contents.test_images, contents.test_labels,
             info.num_classes);
  keep_first(contents.train_images, contents.train_labels, info.sample_bytes(), options.max_train);
  keep_first(contents.test_images, contents.test_labels, info.sample_bytes(), options.max_test);
  return contents;
}

}  // namespace hpc_train
