// convert imagefolder (image_folder.h): the plan (classes, files, the split), the decoding over
// the ranks, PIL's bilinear resize, and the gather to rank 0, which writes the file.
#include "hpc_train/data/image_folder.h"

#include <mpi.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <system_error>
#include <utility>
#include <vector>

#include "hpc_train/data/dataset_file.h"
#include "hpc_train/error.h"
#include "hpc_train/runtime/runtime.h"

namespace hpc_train {

namespace {

namespace fs = std::filesystem;

constexpr int64_t kChannels = 3;

struct ImageEntry {
  std::string path;
  int64_t label = 0;
};

// What rank 0 lists and every rank converts: the classes and the files of each split, in the
// file's order.
struct ImageFolderPlan {
  std::vector<std::string> class_names;
  std::vector<ImageEntry> train;
  std::vector<ImageEntry> test;
  std::string source;  // the file's `source` attribute
  // Rank 0's working directory, where the paths above (as the tree was named) start: the ranks
  // that read them may start elsewhere (Note [One listing of the tree]).
  std::string listed_in;
};

bool is_hidden(const fs::path& path) {
  const std::string name = path.filename().string();
  return !name.empty() && name[0] == '.';
}

bool is_image_name(const fs::path& path) {
  std::string extension = path.extension().string();
  std::transform(extension.begin(), extension.end(), extension.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return extension == ".jpg" || extension == ".jpeg" || extension == ".png";
}

bool directory_exists(const fs::path& path) {
  std::error_code error;
  return fs::is_directory(path, error);
}

// The class folders directly under `dir`, sorted bytewise.
std::vector<std::string> list_classes(const fs::path& dir) {
  std::vector<std::string> names;
  std::error_code error;
  for (fs::directory_iterator it(dir, error), end; !error && it != end; it.increment(error))
    if (!is_hidden(it->path()) && directory_exists(it->path()))
      names.push_back(it->path().filename().string());
  if (error) throw DataError(dir.string() + ": cannot list: " + error.message());
  std::sort(names.begin(), names.end());
  return names;
}

// The image files under a class folder, recursively (symbolic links followed), sorted by path.
std::vector<std::string> list_images(const fs::path& class_dir) {
  std::vector<std::string> paths;
  std::error_code error;
  fs::recursive_directory_iterator it(class_dir, fs::directory_options::follow_directory_symlink,
                                      error);
  for (const fs::recursive_directory_iterator end; !error && it != end; it.increment(error)) {
    if (is_hidden(it->path())) {
      if (directory_exists(it->path())) it.disable_recursion_pending();
      continue;
    }
    std::error_code type_error;
    if (fs::is_regular_file(it->path(), type_error) && is_image_name(it->path()))
      paths.push_back(it->path().string());
  }
  if (error) throw DataError(class_dir.string() + ": cannot list: " + error.message());
  std::sort(paths.begin(), paths.end());
  if (paths.empty())
    throw DataError(class_dir.string() + ": no .jpg, .jpeg or .png files (an empty class)");
  return paths;
}

// A portable generator (SplitMix64): the split of a seed is the same with every standard library,
// which std::shuffle and the std distributions do not promise.
uint64_t next_random(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

ImageFolderPlan plan_image_folder(const std::string& root, const ImageFolderOptions& options) {
  if (!directory_exists(root)) throw DataError(root + ": no such directory (the image tree)");
  ImageFolderPlan plan;
  plan.listed_in = fs::current_path().string();
  const fs::path train_dir = fs::path(root) / "train", val_dir = fs::path(root) / "val";
  const bool split_layout = directory_exists(train_dir) || directory_exists(val_dir);
  const std::string expected =
      " (expected ROOT/train/<class>/ and ROOT/val/<class>/, or ROOT/<class>/ with "
      "--test-fraction)";
  if (split_layout) {
    if (!directory_exists(train_dir) || !directory_exists(val_dir))
      throw DataError(root + ": has " + (directory_exists(train_dir) ? "train/ but no val/" :
                                                                    "val/ but no train/") +
                      expected);
    if (options.test_fraction)
      throw ConfigError("--test-fraction splits a single tree ROOT/<class>/; " + root +
                        " has train/ and val/, which are the splits");
    plan.class_names = list_classes(train_dir);
    const std::vector<std::string> val_classes = list_classes(val_dir);
    auto require_subset = [&](const std::vector<std::string>& these,
                              const std::vector<std::string>& those, const fs::path& here,
                              const fs::path& there) {
      for (const std::string& name : these)
        if (!std::binary_search(those.begin(), those.end(), name))
          throw DataError(root + ": class '" + name + "' is in " + here.string() +
                          " but not in " + there.string() +
                          " (train/ and val/ must have the same class folders)");
    };
    require_subset(plan.class_names, val_classes, train_dir, val_dir);
    require_subset(val_classes, plan.class_names, val_dir, train_dir);
  } else {
    if (!options.test_fraction)
      throw ConfigError(root + " has no train/ and val/: a single tree ROOT/<class>/ needs "
                        "--test-fraction F (0 <= F < 1), the share of each class to test on");
    plan.class_names = list_classes(root);
  }
  if (plan.class_names.empty())
    throw DataError((split_layout ? train_dir.string() : root) + ": no class folders" + expected);
  if (plan.class_names.size() < 2)
    throw DataError((split_layout ? train_dir.string() : root) + ": one class folder ('" +
                    plan.class_names[0] + "'); a classifier needs at least 2");

  uint64_t random_state = options.seed;
  for (size_t label = 0; label < plan.class_names.size(); ++label) {
    const std::string& name = plan.class_names[label];
    if (split_layout) {
      for (std::string& path : list_images(train_dir / name))
        plan.train.push_back({std::move(path), static_cast<int64_t>(label)});
      for (std::string& path : list_images(val_dir / name))
        plan.test.push_back({std::move(path), static_cast<int64_t>(label)});
      continue;
    }
    std::vector<std::string> paths = list_images(fs::path(root) / name);
    const int64_t count = static_cast<int64_t>(paths.size());
    // Every class keeps at least one train image.
    const int64_t test_count =
        std::min(count - 1, static_cast<int64_t>(std::llround(*options.test_fraction * count)));
    std::vector<int64_t> order(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) order[static_cast<size_t>(i)] = i;
    for (int64_t i = count - 1; i > 0; --i)  // Fisher-Yates
      std::swap(order[static_cast<size_t>(i)],
                order[next_random(random_state) % static_cast<uint64_t>(i + 1)]);
    std::vector<bool> is_test(static_cast<size_t>(count), false);
    for (int64_t i = 0; i < test_count; ++i) is_test[static_cast<size_t>(order[i])] = true;
    for (int64_t i = 0; i < count; ++i)
      (is_test[static_cast<size_t>(i)] ? plan.test : plan.train)
          .push_back({std::move(paths[static_cast<size_t>(i)]), static_cast<int64_t>(label)});
  }

  char size_text[64];
  std::snprintf(size_text, sizeof size_text, "%lldx%lld",
                static_cast<long long>(options.height), static_cast<long long>(options.width));
  plan.source = "imagefolder " + root;
  if (split_layout) {
    plan.source += " (train/ and val/)";
  } else {
    char split_text[96];
    std::snprintf(split_text, sizeof split_text, " (test fraction %g, seed %llu)",
                  *options.test_fraction, static_cast<unsigned long long>(options.seed));
    plan.source += split_text;
  }
  plan.source += std::string(", RGB, scaled to cover ") + size_text +
                 " (bilinear, as PIL) and centre-cropped";
  return plan;
}

// Note [One listing of the tree]: rank 0 alone lists the tree and sends the plan to the other
// ranks. A listing is a metadata walk of a shared file system (one stat or more a file); N ranks
// walking a million files at once would load its metadata server N times over, and ranks that
// saw the tree change in between would decode different plans. The plan travels as one string of
// NUL-terminated fields (no path or folder name holds a NUL byte): the three counts, the source,
// rank 0's working directory, the class names, then a label and a path for each train image and
// each test image. Messages name a file as the tree was named; it is opened from rank 0's folder.
std::string encode_plan(const ImageFolderPlan& plan) {
  std::string bytes;
  auto field = [&bytes](const std::string& text) { (bytes += text) += '\0'; };
  for (size_t count : {plan.class_names.size(), plan.train.size(), plan.test.size()})
    field(std::to_string(count));
  field(plan.source);
  field(plan.listed_in);
  for (const std::string& name : plan.class_names) field(name);
  for (const std::vector<ImageEntry>* split : {&plan.train, &plan.test})
    for (const ImageEntry& entry : *split) {
      field(std::to_string(entry.label));
      field(entry.path);
    }
  return bytes;
}

ImageFolderPlan decode_plan(const std::string& bytes) {
  size_t at = 0;
  auto field = [&]() {
    const size_t end = bytes.find('\0', at);
    if (end == std::string::npos) throw std::logic_error("convert imagefolder: a cut plan");
    std::string text = bytes.substr(at, end - at);
    at = end + 1;
    return text;
  };
  auto number = [&]() { return static_cast<int64_t>(std::stoll(field())); };
  ImageFolderPlan plan;
  const int64_t classes = number(), train = number(), test = number();
  plan.source = field();
  plan.listed_in = field();
  for (int64_t c = 0; c < classes; ++c) plan.class_names.push_back(field());
  for (auto [split, count] : {std::pair{&plan.train, train}, std::pair{&plan.test, test}})
    for (int64_t i = 0; i < count; ++i) {
      ImageEntry entry;
      entry.label = number();
      entry.path = field();
      split->push_back(std::move(entry));
    }
  return plan;
}

// --- Resizing: PIL's Image.resize(BILINEAR) (libImaging/Resample.c), in its fixed point -----

constexpr int kPrecisionBits = 32 - 8 - 2;  // PIL's PRECISION_BITS for 8-bit images

// The taps of output positions [first, first + count) of a resize from in_size to out_size.
struct Taps {
  std::vector<int64_t> start;  // first input position of each output position
  std::vector<int64_t> size;   // its number of taps
  std::vector<int32_t> weights;  // `stride` a position, fixed point
  int64_t stride = 0;
};

Taps bilinear_taps(int64_t in_size, int64_t out_size, int64_t first, int64_t count) {
  const double scale = static_cast<double>(in_size) / static_cast<double>(out_size);
  const double filter_scale = std::max(scale, 1.0);  // shrinking widens the triangle
  const double support = 1.0 * filter_scale;          // the bilinear filter's support is 1
  Taps taps;
  taps.stride = static_cast<int64_t>(std::ceil(support)) * 2 + 1;
  taps.start.resize(static_cast<size_t>(count));
  taps.size.resize(static_cast<size_t>(count));
  taps.weights.assign(static_cast<size_t>(count * taps.stride), 0);
  std::vector<double> weights(static_cast<size_t>(taps.stride));
  for (int64_t i = 0; i < count; ++i) {
    const double center = (static_cast<double>(first + i) + 0.5) * scale;
    // PIL's truncations toward zero, on purpose: the same taps give the same pixels.
    const int64_t lo = std::max<int64_t>(static_cast<int>(center - support + 0.5), 0);
    const int64_t hi = std::min<int64_t>(static_cast<int>(center + support + 0.5), in_size);
    const int64_t n = std::min(hi - lo, taps.stride);
    double total = 0.0;
    for (int64_t t = 0; t < n; ++t) {
      const double x = (static_cast<double>(t + lo) - center + 0.5) / filter_scale;
      weights[static_cast<size_t>(t)] = std::max(0.0, 1.0 - std::fabs(x));
      total += weights[static_cast<size_t>(t)];
    }
    taps.start[static_cast<size_t>(i)] = lo;
    taps.size[static_cast<size_t>(i)] = n;
    for (int64_t t = 0; t < n; ++t) {
      const double w = total != 0.0 ? weights[static_cast<size_t>(t)] / total : 0.0;
      taps.weights[static_cast<size_t>(i * taps.stride + t)] =
          static_cast<int32_t>(0.5 + w * (1 << kPrecisionBits));  // w >= 0
    }
  }
  return taps;
}

uint8_t fixed_to_byte(int64_t sum) {
  return static_cast<uint8_t>(std::clamp<int64_t>(sum >> kPrecisionBits, 0, 255));
}

}  // namespace

void parse_image_folder_size(const std::string& text, ImageFolderOptions& options) {
  const size_t x = text.find('x');
  const std::string height_text = text.substr(0, x);
  const std::string width_text = x == std::string::npos ? height_text : text.substr(x + 1);
  auto parse_side = [&](const std::string& side, int64_t& value) {
    const char* end = side.data() + side.size();
    const auto result = std::from_chars(side.data(), end, value);
    return !side.empty() && result.ec == std::errc() && result.ptr == end && value >= 1 &&
           value <= kMaxImageFolderSide;
  };
  if (!parse_side(height_text, options.height) || !parse_side(width_text, options.width))
    throw ConfigError("--size '" + text + "': expected HxW (or S for SxS) with each side in [1, " +
                      std::to_string(kMaxImageFolderSide) + "], e.g. --size 224x224");
}

void resize_and_crop(const DecodedImage& image, int64_t height, int64_t width, uint8_t* chw) {
  const int64_t in_h = image.height, in_w = image.width;
  // The smallest size of the image's aspect ratio that covers height x width, sides rounded.
  int64_t scaled_h = height, scaled_w = width;
  if (width * in_h >= height * in_w)
    scaled_h = std::max(height, (2 * in_h * width + in_w) / (2 * in_w));
  else
    scaled_w = std::max(width, (2 * in_w * height + in_h) / (2 * in_h));
  const int64_t top = (scaled_h - height) / 2, left = (scaled_w - width) / 2;

  // Horizontal pass first, then vertical, each rounded to bytes in between, as PIL does.
  const Taps across = bilinear_taps(in_w, scaled_w, left, width);
  const Taps down = bilinear_taps(in_h, scaled_h, top, height);
  std::vector<uint8_t> rows(static_cast<size_t>(in_h * width * kChannels));
  for (int64_t y = 0; y < in_h; ++y) {
    const uint8_t* in_row = image.rgb.data() + y * in_w * kChannels;
    uint8_t* out_row = rows.data() + y * width * kChannels;
    for (int64_t x = 0; x < width; ++x) {
      const int32_t* k = across.weights.data() + x * across.stride;
      const uint8_t* in = in_row + across.start[static_cast<size_t>(x)] * kChannels;
      for (int64_t c = 0; c < kChannels; ++c) {
        int64_t sum = int64_t{1} << (kPrecisionBits - 1);
        for (int64_t t = 0; t < across.size[static_cast<size_t>(x)]; ++t)
          sum += int64_t{in[t * kChannels + c]} * k[t];
        out_row[x * kChannels + c] = fixed_to_byte(sum);
      }
    }
  }
  const int64_t plane = height * width;
  for (int64_t y = 0; y < height; ++y) {
    const int32_t* k = down.weights.data() + y * down.stride;
    const uint8_t* in = rows.data() + down.start[static_cast<size_t>(y)] * width * kChannels;
    for (int64_t x = 0; x < width; ++x)
      for (int64_t c = 0; c < kChannels; ++c) {
        int64_t sum = int64_t{1} << (kPrecisionBits - 1);
        for (int64_t t = 0; t < down.size[static_cast<size_t>(y)]; ++t)
          sum += int64_t{in[(t * width + x) * kChannels + c]} * k[t];
        chw[c * plane + y * width + x] = fixed_to_byte(sum);
      }
  }
}

ImageFolderSummary convert_image_folder(const Runtime& runtime, const std::string& root,
                                        const std::string& output_path,
                                        const ImageFolderOptions& options) {
  ImageFolderPlan plan;
  int64_t total = 0;
  const int64_t sample_bytes = kChannels * options.height * options.width;
  // Note [Image folder writes]: with a parallel HDF5 every rank writes its own images into the
  // file (MPI-IO); with a serial one (or --rank-zero-writes) rank 0 gathers them and writes.
  const bool collective = collective_dataset_writes_available() && !options.rank_zero_writes;
  // Everything that can be refused without decoding: the options and the output's folder on
  // every rank; the tree on rank 0, which lists it (Note [One listing of the tree]).
  std::string encoded_plan;
  run_agreed_phase(runtime, [&] {
    if (!image_decoding_available())
      throw ConfigError("convert imagefolder: " + image_decoder_libraries());
    if (options.test_fraction && !(*options.test_fraction >= 0.0 && *options.test_fraction < 1.0))
      throw ConfigError("--test-fraction must be in [0, 1), got " +
                        std::to_string(*options.test_fraction));
    const fs::path directory = fs::absolute(output_path).parent_path();
    if (!directory_exists(directory))
      throw DataError("cannot write " + output_path + ": no such directory " +
                      directory.string());
    if (runtime.rank() != 0) return;
    encoded_plan = encode_plan(plan_image_folder(root, options));
    if (encoded_plan.size() > static_cast<size_t>(INT32_MAX))
      throw DataError(root + ": the list of its files takes " +
                      memory_text(static_cast<double>(encoded_plan.size())) +
                      ", over the 2 GiB one conversion sends to its ranks");
  });
  plan = decode_plan(broadcast_string(runtime.world(), encoded_plan, 0));
  encoded_plan = {};
  run_agreed_phase(runtime, [&] {
    total = static_cast<int64_t>(plan.train.size() + plan.test.size());
    if (total > INT32_MAX)
      throw DataError(root + ": " + std::to_string(total) + " images, over the 2^31 one "
                      "conversion handles");
    // Each rank holds its decoded block and its share (collective write); or rank 0 holds the
    // gathered images and the dataset built from them. A node's ranks share its memory.
    const double block_bytes = std::ceil(static_cast<double>(total) / runtime.world_size()) *
                               static_cast<double>(sample_bytes);
    const double node_bytes = collective ? 2.0 * block_bytes * runtime.local_size()
                              : runtime.rank() == 0
                                  ? 2.0 * static_cast<double>(total) * sample_bytes
                                  : 0.0;
    if (node_bytes > static_cast<double>(physical_memory_bytes()))
      throw DataError(root + ": " + std::to_string(total) + " images of " +
                      std::to_string(sample_bytes) + " bytes need " + memory_text(node_bytes) +
                      (collective ? " on each node" : " on rank 0") + ", more than this node's " +
                      memory_text(static_cast<double>(physical_memory_bytes())) + "; " +
                      (collective ? "use more nodes or " : "") + "convert a smaller --size");
  });

  // Rank r decodes the contiguous block [begin(r), begin(r + 1)) of train, then test, images.
  const int ranks = runtime.world_size();
  auto block_begin = [&](int rank) { return total * rank / ranks; };
  const int64_t begin = block_begin(runtime.rank()), end = block_begin(runtime.rank() + 1);
  std::vector<uint8_t> pixels(static_cast<size_t>((end - begin) * sample_bytes));
  std::vector<uint8_t> decoded(static_cast<size_t>(end - begin), 0);  // 1: ok, 0: skipped
  run_agreed_phase(runtime, [&] {
    std::vector<char> bytes;
    for (int64_t i = begin; i < end; ++i) {
      const int64_t train_size = static_cast<int64_t>(plan.train.size());
      const ImageEntry& entry = i < train_size ? plan.train[static_cast<size_t>(i)]
                                               : plan.test[static_cast<size_t>(i - train_size)];
      try {
        std::ifstream file(fs::path(plan.listed_in) / entry.path, std::ios::binary);
        if (!file) throw DataError(entry.path + ": cannot open");
        bytes.assign(std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>());
        if (!file.good() && !file.eof()) throw DataError(entry.path + ": cannot read");
        const DecodedImage image = decode_image(
            entry.path, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
        resize_and_crop(image, options.height, options.width,
                        pixels.data() + (i - begin) * sample_bytes);
        decoded[static_cast<size_t>(i - begin)] = 1;
      } catch (const DataError& e) {
        if (!options.skip_bad_images)
          throw DataError(std::string(e.what()) +
                          " (--skip-bad-images skips files that do not decode)");
        std::fprintf(stderr, "hpc_train_data: skipped %s\n", e.what());
      }
    }
  });

  ImageFolderSummary summary;
  summary.classes = static_cast<int64_t>(plan.class_names.size());
  DatasetInfo info;
  info.num_classes = summary.classes;
  info.class_names = plan.class_names;
  info.channels = kChannels;
  info.height = options.height;
  info.width = options.width;
  info.source = plan.source;
  const int64_t train_size = static_cast<int64_t>(plan.train.size());

  if (collective) {
    run_agreed_phase(runtime, [&] {
      // The decoded images of this block go to [first, ...) of each split: after those of the
      // ranks before (the blocks are in file order).
      int64_t mine[2] = {0, 0}, before[2] = {0, 0}, totals[2] = {0, 0};
      for (int64_t i = begin; i < end; ++i)
        if (decoded[static_cast<size_t>(i - begin)]) ++mine[i < train_size ? 0 : 1];
      MPI_CHECK(MPI_Exscan(mine, before, 2, MPI_INT64_T, MPI_SUM, runtime.world()));
      if (runtime.rank() == 0) before[0] = before[1] = 0;  // MPI_Exscan leaves rank 0's undefined
      MPI_CHECK(MPI_Allreduce(mine, totals, 2, MPI_INT64_T, MPI_SUM, runtime.world()));
      DatasetShare share;
      share.first_train = before[0];
      share.first_test = before[1];
      for (int64_t i = begin; i < end; ++i) {
        if (!decoded[static_cast<size_t>(i - begin)]) continue;
        const bool train = i < train_size;
        const ImageEntry& entry = train ? plan.train[static_cast<size_t>(i)]
                                        : plan.test[static_cast<size_t>(i - train_size)];
        auto& images = train ? share.train_images : share.test_images;
        (train ? share.train_labels : share.test_labels).push_back(entry.label);
        const uint8_t* sample = pixels.data() + (i - begin) * sample_bytes;
        images.insert(images.end(), sample, sample + sample_bytes);
      }
      pixels = {};
      info.train_size = totals[0];
      info.test_size = totals[1];
      summary.train = totals[0];
      summary.test = totals[1];
      summary.skipped = total - totals[0] - totals[1];
      write_dataset_file_collective(runtime.world(), output_path, info, share);
    });
    return summary;
  }

  run_agreed_phase(runtime, [&] {
    std::vector<int> counts(static_cast<size_t>(ranks)), displacements(static_cast<size_t>(ranks));
    for (int r = 0; r < ranks; ++r) {
      displacements[static_cast<size_t>(r)] = static_cast<int>(block_begin(r));
      counts[static_cast<size_t>(r)] = static_cast<int>(block_begin(r + 1) - block_begin(r));
    }
    const bool root_rank = runtime.rank() == 0;
    std::vector<uint8_t> all_decoded(root_rank ? static_cast<size_t>(total) : 0);
    std::vector<uint8_t> all_pixels(root_rank ? static_cast<size_t>(total * sample_bytes) : 0);
    MPI_Datatype sample_type = MPI_DATATYPE_NULL;
    MPI_CHECK(MPI_Type_contiguous(static_cast<int>(sample_bytes), MPI_BYTE, &sample_type));
    MPI_CHECK(MPI_Type_commit(&sample_type));
    const int mine = static_cast<int>(end - begin);
    const int gather_status =
        MPI_Gatherv(decoded.data(), mine, MPI_UINT8_T, all_decoded.data(), counts.data(),
                    displacements.data(), MPI_UINT8_T, 0, runtime.world());
    const int gather_pixels_status =
        MPI_Gatherv(pixels.data(), mine, sample_type, all_pixels.data(), counts.data(),
                    displacements.data(), sample_type, 0, runtime.world());
    MPI_Type_free(&sample_type);
    MPI_CHECK(gather_status);
    MPI_CHECK(gather_pixels_status);
    if (!root_rank) return;

    DatasetContents contents;
    contents.info = info;
    for (int64_t i = 0; i < total; ++i) {
      if (!all_decoded[static_cast<size_t>(i)]) {
        ++summary.skipped;
        continue;
      }
      const bool train = i < train_size;
      const ImageEntry& entry = train ? plan.train[static_cast<size_t>(i)]
                                      : plan.test[static_cast<size_t>(i - train_size)];
      auto& images = train ? contents.train_images : contents.test_images;
      (train ? contents.train_labels : contents.test_labels).push_back(entry.label);
      const uint8_t* sample = all_pixels.data() + i * sample_bytes;
      images.insert(images.end(), sample, sample + sample_bytes);
    }
    all_pixels = {};
    summary.train = static_cast<int64_t>(contents.train_labels.size());
    summary.test = static_cast<int64_t>(contents.test_labels.size());
    write_dataset_file(output_path, std::move(contents));
  });
  return summary;
}

}  // namespace hpc_train
