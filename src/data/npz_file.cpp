#include "hpc_train/data/npz_file.h"

#include <cerrno>
#include <cstdio>
#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>

#include "data/source_formats.h"
#include "hpc_train/error.h"
#include "hpc_train/io/byte_order.h"
#include "hpc_train/io/zip_archive.h"
#include "hpc_train/runtime/runtime.h"

namespace hpc_train {
namespace {

constexpr char kNpyMagic[] = "\x93NUMPY";
constexpr size_t kNpyMagicBytes = 6;

// The tiny grammar of a .npy header: a Python dict literal of strings, booleans and tuples of
// integers, e.g. {'descr': '<i8', 'fortran_order': False, 'shape': (3, 28, 28), }
class NpyHeaderParser {
 public:
  NpyHeaderParser(const std::string& text, const std::string& where) : text_(text), where_(where) {}

  void parse(NpyArray& array, bool& fortran_order) {
    bool have_descr = false, have_fortran = false, have_shape = false;
    expect('{');
    while (true) {
      skip_space();
      if (peek() == '}') break;
      const std::string key = string_value();
      expect(':');
      skip_space();
      if (key == "descr") {
        if (peek() != '\'' && peek() != '"')
          fail("descr is not a plain dtype string (a structured dtype?)");
        array.descr = string_value();
        have_descr = true;
      } else if (key == "fortran_order") {
        fortran_order = bool_value();
        have_fortran = true;
      } else if (key == "shape") {
        array.shape = tuple_value();
        have_shape = true;
      } else {
        fail("unknown key '" + key + "'");
      }
      skip_space();
      if (peek() == ',') {
        ++at_;
        continue;
      }
      expect('}');
      --at_;
    }
    ++at_;
    if (!have_descr || !have_fortran || !have_shape)
      fail("it lacks one of descr, fortran_order, shape");
  }

 private:
  [[noreturn]] void fail(const std::string& why) {
    throw DataError(where_ + "the .npy header is not the dict numpy writes: " + why);
  }
  char peek() const { return at_ < text_.size() ? text_[at_] : '\0'; }
  void skip_space() {
    while (at_ < text_.size() && (text_[at_] == ' ' || text_[at_] == '\n' || text_[at_] == '\t'))
      ++at_;
  }
  void expect(char c) {
    skip_space();
    if (peek() != c) fail(std::string("expected '") + c + "' at byte " + std::to_string(at_));
    ++at_;
  }
  std::string string_value() {
    skip_space();
    const char quote = peek();
    if (quote != '\'' && quote != '"') fail("expected a string at byte " + std::to_string(at_));
    const size_t end = text_.find(quote, at_ + 1);
    if (end == std::string::npos) fail("an unterminated string");
    std::string value = text_.substr(at_ + 1, end - at_ - 1);
    at_ = end + 1;
    return value;
  }
  bool bool_value() {
    for (const auto& [word, value] : {std::pair{"True", true}, std::pair{"False", false}}) {
      const size_t length = std::strlen(word);
      if (text_.compare(at_, length, word) == 0) {
        at_ += length;
        return value;
      }
    }
    fail("fortran_order is neither True nor False");
  }
  std::vector<int64_t> tuple_value() {
    std::vector<int64_t> values;
    expect('(');
    while (true) {
      skip_space();
      if (peek() == ')') break;
      if (peek() < '0' || peek() > '9') fail("a shape entry that is not a non-negative integer");
      int64_t value = 0;
      while (peek() >= '0' && peek() <= '9') {
        if (__builtin_mul_overflow(value, int64_t{10}, &value) ||
            __builtin_add_overflow(value, int64_t{peek() - '0'}, &value))
          fail("a shape entry over 2^63");
        ++at_;
      }
      if (peek() == 'L') ++at_;  // Python 2's long literals
      values.push_back(value);
      skip_space();
      if (peek() == ',') {
        ++at_;
        continue;
      }
      if (peek() != ')') fail("expected ',' or ')' in the shape");
    }
    ++at_;
    if (values.size() > 32) fail("a shape of " + std::to_string(values.size()) + " dimensions");
    return values;
  }

  const std::string& text_;
  const std::string& where_;
  size_t at_ = 0;
};

}  // namespace

int64_t NpyArray::count() const {
  int64_t product = 1;
  for (int64_t dim : shape) product *= dim;  // parse_npy checked it fits
  return product;
}

NpyArray parse_npy(const std::string& where_name, std::vector<uint8_t> bytes) {
  const std::string where = where_name + ": ";
  NpyArray array;
  array.where = where_name;
  if (bytes.size() < kNpyMagicBytes + 2 || std::memcmp(bytes.data(), kNpyMagic, kNpyMagicBytes) != 0)
    throw DataError(where + "not a .npy array (no \\x93NUMPY magic)");
  const int major = bytes[6];
  uint64_t header_start = 0, header_bytes = 0;
  if (major == 1) {
    header_start = 10;
    if (bytes.size() < header_start) throw DataError(where + "truncated .npy header");
    header_bytes = load_little_endian<uint16_t>(bytes.data() + 8);
  } else if (major == 2 || major == 3) {
    header_start = 12;
    if (bytes.size() < header_start) throw DataError(where + "truncated .npy header");
    header_bytes = load_little_endian<uint32_t>(bytes.data() + 8);
  } else {
    throw DataError(where + ".npy format version " + std::to_string(major) +
                    ", this reader knows 1, 2 and 3");
  }
  if (header_bytes > bytes.size() - header_start)
    throw DataError(where + "truncated .npy header: it says " + std::to_string(header_bytes) +
                    " bytes, the member has " + std::to_string(bytes.size() - header_start));
  const std::string header(reinterpret_cast<const char*>(bytes.data() + header_start),
                           header_bytes);
  bool fortran_order = false;
  NpyHeaderParser(header, where).parse(array, fortran_order);

  const std::string& descr = array.descr;
  if (descr.size() < 3 || std::string("<>|=").find(descr[0]) == std::string::npos)
    throw DataError(where + "dtype '" + descr + "' is not a plain numeric dtype");
  array.kind = descr[1];
  int64_t item_bytes = 0;
  for (size_t i = 2; i < descr.size(); ++i) {
    if (descr[i] < '0' || descr[i] > '9' || item_bytes > 1'000'000)
      throw DataError(where + "dtype '" + descr + "' is not a plain numeric dtype");
    item_bytes = item_bytes * 10 + (descr[i] - '0');
  }
  if (item_bytes < 1) throw DataError(where + "dtype '" + descr + "' has no item size");
  array.item_bytes = item_bytes;
  if (descr[0] == '>' && item_bytes > 1)
    throw DataError(where + "dtype '" + descr + "' is big-endian; save it little-endian "
                    "(array.astype('<" + descr.substr(1) + "'))");
  if (fortran_order)
    throw DataError(where + "fortran_order is True; save a C-ordered array "
                    "(numpy.ascontiguousarray)");

  std::string shape_text;
  uint64_t expected_bytes = static_cast<uint64_t>(item_bytes);
  bool too_large = false;
  for (size_t i = 0; i < array.shape.size(); ++i) {
    shape_text += (i ? "x" : "") + std::to_string(array.shape[i]);
    too_large |= __builtin_mul_overflow(expected_bytes, static_cast<uint64_t>(array.shape[i]),
                                        &expected_bytes);
  }
  too_large |= expected_bytes > static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  const uint64_t data_bytes = bytes.size() - header_start - header_bytes;
  if (too_large)
    throw DataError(where + "shape (" + shape_text + ") of " + descr + " is over 2^63 bytes");
  if (data_bytes != expected_bytes)
    throw DataError(where + (data_bytes < expected_bytes ? "truncated" : "too long") + ": " +
                    std::to_string(data_bytes) + " data bytes, shape (" + shape_text + ") of " +
                    descr + " needs " + std::to_string(expected_bytes));
  array.data_offset = static_cast<size_t>(header_start + header_bytes);
  array.bytes = std::move(bytes);
  return array;
}

}  // namespace hpc_train

// ---- The npz converter (source_formats.h)

namespace hpc_train {
namespace {

const char* const kArrayNames[] = {"x_train", "y_train", "x_test", "y_test"};

struct ImageShape {
  int64_t channels = 0, height = 0, width = 0;
  std::string text() const {
    return std::to_string(channels) + "x" + std::to_string(height) + "x" + std::to_string(width);
  }
};

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "(";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + (shape.size() == 1 ? ",)" : ")");
}

// The images of x as [N, C, H, W] (transposed from N, H, W, C for nhwc).
std::vector<uint8_t> images_nchw(const NpyArray& x, ImageLayout layout, ImageShape& shape) {
  if (x.kind != 'u' || x.item_bytes != 1)
    throw DataError(x.where + ": dtype '" + x.descr + "', expected uint8 images ('|u1'; " +
                    "convert with x.astype(numpy.uint8) after scaling to 0..255)");
  const std::vector<int64_t>& s = x.shape;
  if (s.size() == 3) {
    shape = ImageShape{1, s[1], s[2]};
  } else if (s.size() == 4) {
    shape = layout == ImageLayout::kNhwc ? ImageShape{s[3], s[1], s[2]}
                                         : ImageShape{s[1], s[2], s[3]};
  } else {
    throw DataError(x.where + ": shape " + shape_text(s) + " has " + std::to_string(s.size()) +
                    " dimensions; images are N,H,W or N,H,W,C (nhwc) / N,C,H,W (nchw)");
  }
  if (shape.channels < 1 || shape.height < 1 || shape.width < 1)
    throw DataError(x.where + ": images of " + shape.text() + " (C x H x W); each must be >= 1");
  // parse_npy checked N x C x H x W fits; a split of no images does not bound C x H x W.
  uint64_t sample_bytes = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(shape.channels),
                             static_cast<uint64_t>(shape.height), &sample_bytes) ||
      __builtin_mul_overflow(sample_bytes, static_cast<uint64_t>(shape.width), &sample_bytes) ||
      sample_bytes > static_cast<uint64_t>(INT32_MAX))
    throw DataError(x.where + ": images of " + shape.text() + " (over 2^31 bytes each)");
  const int64_t n = s[0];
  if (layout == ImageLayout::kNchw || s.size() == 3 || shape.channels == 1)
    return std::vector<uint8_t>(x.data(), x.data() + x.count());
  std::vector<uint8_t> images(static_cast<size_t>(x.count()));
  const int64_t c_count = shape.channels, pixels = shape.height * shape.width;
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* in = x.data() + i * c_count * pixels;
    uint8_t* out = images.data() + i * c_count * pixels;
    for (int64_t p = 0; p < pixels; ++p)
      for (int64_t c = 0; c < c_count; ++c) out[c * pixels + p] = in[p * c_count + c];
  }
  return images;
}

std::vector<int64_t> labels_of(const NpyArray& y, int64_t expected_count, const std::string& x_where) {
  const bool integer = (y.kind == 'i' || y.kind == 'u') &&
                       (y.item_bytes == 1 || y.item_bytes == 2 || y.item_bytes == 4 ||
                        y.item_bytes == 8);
  if (!integer)
    throw DataError(y.where + ": dtype '" + y.descr + "', expected integer labels " +
                    "(int8..int64 or uint8..uint64)");
  if (y.shape.size() != 1)
    throw DataError(y.where + ": shape " + shape_text(y.shape) + ", expected 1-D labels (N,)");
  if (y.shape[0] != expected_count)
    throw DataError(y.where + " has " + std::to_string(y.shape[0]) + " labels but " + x_where +
                    " has " + std::to_string(expected_count) + " images");
  std::vector<int64_t> labels(static_cast<size_t>(y.shape[0]));
  for (size_t i = 0; i < labels.size(); ++i) {
    const uint8_t* p = y.data() + i * static_cast<size_t>(y.item_bytes);
    const auto item_bytes = static_cast<size_t>(y.item_bytes);
    int64_t value = 0;
    if (y.kind == 'u') {
      const uint64_t bits = load_little_endian(p, item_bytes);
      if (bits > static_cast<uint64_t>(INT64_MAX))
        throw DataError(y.where + ": label[" + std::to_string(i) + "] = " + std::to_string(bits) +
                        " is over 2^63");
      value = static_cast<int64_t>(bits);
    } else {
      value = load_little_endian_signed(p, item_bytes);
    }
    if (value < 0)
      throw DataError(y.where + ": label[" + std::to_string(i) + "] = " + std::to_string(value) +
                      " is negative");
    labels[i] = value;
  }
  return labels;
}

}  // namespace

DatasetContents read_npz_dataset(const std::string& path, const ConvertOptions& options) {
  const std::vector<ZipEntry> entries = read_zip_directory(path);
  // The four arrays live in memory together (read_zip_member checks each alone): refuse before
  // reading any when their sum cannot fit.
  uint64_t total_bytes = 0;
  for (const ZipEntry& entry : entries)
    for (const char* name : kArrayNames)
      if (entry.name == std::string(name) + ".npy" &&
          __builtin_add_overflow(total_bytes, entry.uncompressed_bytes, &total_bytes))
        total_bytes = UINT64_MAX;
  const int64_t memory_bytes = physical_memory_bytes();
  if (memory_bytes > 0 && total_bytes > static_cast<uint64_t>(memory_bytes))
    throw DataError(path + ": x_train, y_train, x_test and y_test are " +
                    memory_text(static_cast<double>(total_bytes)) +
                    " uncompressed, more than this machine's memory (" +
                    memory_text(static_cast<double>(memory_bytes)) + ")");
  std::vector<NpyArray> arrays;
  for (const char* name : kArrayNames) {
    const std::string member = std::string(name) + ".npy";
    const ZipEntry* found = nullptr;
    std::string listed;
    for (const ZipEntry& entry : entries) {
      if (entry.name == member) found = &entry;
      listed += (listed.empty() ? "" : ", ") + entry.name;
    }
    if (!found)
      throw DataError(path + ": no array " + name + " (zip member " + member + "); the file has " +
                      (listed.empty() ? std::string("no members") : listed) +
                      "; numpy.savez(path, x_train=..., y_train=..., x_test=..., y_test=...)");
    // Every member is bounded by the memory check above.
    arrays.push_back(parse_npy(path + ": " + member,
                               read_zip_member(path, *found, std::numeric_limits<uint64_t>::max())));
  }
  const NpyArray &x_train = arrays[0], &y_train = arrays[1], &x_test = arrays[2],
                 &y_test = arrays[3];

  DatasetContents contents;
  DatasetInfo& info = contents.info;
  ImageShape train_shape, test_shape;
  contents.train_images = images_nchw(x_train, options.layout, train_shape);
  contents.test_images = images_nchw(x_test, options.layout, test_shape);
  if (train_shape.channels != test_shape.channels || train_shape.height != test_shape.height ||
      train_shape.width != test_shape.width)
    throw DataError(x_test.where + ": images are " + test_shape.text() + " but " + x_train.where +
                    " has " + train_shape.text() + " (C x H x W)");
  contents.train_labels = labels_of(y_train, x_train.shape[0], x_train.where);
  contents.test_labels = labels_of(y_test, x_test.shape[0], x_test.where);
  info.channels = train_shape.channels;
  info.height = train_shape.height;
  info.width = train_shape.width;

  if (options.num_classes > 0) {
    info.num_classes = options.num_classes;
  } else {
    int64_t largest = -1;
    for (const std::vector<int64_t>* labels : {&contents.train_labels, &contents.test_labels})
      for (int64_t label : *labels) largest = std::max(largest, label);
    if (largest < 0) throw DataError(path + ": no labels in y_train or y_test, so no classes");
    if (largest >= kMaxDerivedClasses)
      throw DataError(path + ": the largest label is " + std::to_string(largest) +
                      ", which would make over " + std::to_string(kMaxDerivedClasses) +
                      " classes; pass --num-classes if that is meant");
    info.num_classes = largest + 1;
  }
  check_labels(y_train.where, contents.train_labels, info.num_classes);
  check_labels(y_test.where, contents.test_labels, info.num_classes);
  for (int64_t k = 0; k < info.num_classes; ++k) info.class_names.push_back(std::to_string(k));
  info.source = "npz file " + path + " (" +
                (options.layout == ImageLayout::kNhwc ? "nhwc" : "nchw") + ")";
  keep_first(contents.train_images, contents.train_labels, info.sample_bytes(), options.max_train);
  keep_first(contents.test_images, contents.test_labels, info.sample_bytes(), options.max_test);
  return contents;
}

}  // namespace hpc_train
