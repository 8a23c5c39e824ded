#include "hpc_train/io/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>
#include <tuple>

#include "hpc_train/io/atomic_file.h"
#include "hpc_train/io/byte_order.h"
#include "hpc_train/io/file_descriptor.h"
#include "hpc_train/error.h"

namespace hpc_train {

namespace {

using json = nlohmann::json;

// The reference implementation refuses longer headers; so do we, so that a corrupt length does
// not make us allocate gigabytes before finding out.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr int kMaxJsonDepth = 128;  // arrays and objects inside each other in the header
constexpr size_t kLengthFieldBytes = 8;
constexpr size_t kHeaderAlignmentBytes = 8;
const char* const kMetadataKey = "__metadata__";

struct DtypeSize {
  const char* name;
  size_t bytes;
};

// Every dtype of the format with a whole number of bytes per element.
constexpr DtypeSize kDtypes[] = {
    {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1},
    {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
    {"U32", 4},  {"F32", 4}, {"I64", 8}, {"U64", 8},     {"F64", 8},
};

std::string known_dtypes() {
  std::string text;
  for (const auto& dtype : kDtypes) text += (text.empty() ? "" : ", ") + std::string(dtype.name);
  return text;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

std::string system_error() { return std::strerror(errno); }

// product(shape) x element size, or false when it does not fit in 64 bits.
bool shape_bytes(const std::vector<int64_t>& shape, size_t element_bytes, uint64_t& bytes) {
  uint64_t total = element_bytes;
  for (const int64_t dimension : shape) {
    const auto d = static_cast<uint64_t>(dimension);
    if (d != 0 && total > std::numeric_limits<uint64_t>::max() / d) return false;
    total *= d;
  }
  bytes = total;
  return true;
}

// True when `text` survives nlohmann's UTF-8 check (it throws on invalid UTF-8 when dumping).
bool is_valid_utf8(const std::string& text) {
  try {
    (void)json(text).dump();
    return true;
  } catch (const json::type_error&) {
    return false;
  }
}

// --- writing ---

void check_entries(const std::string& path, const std::vector<SafetensorsEntry>& tensors,
                   const std::map<std::string, std::string>& metadata) {
  std::set<std::string> names;
  for (const auto& tensor : tensors) {
    const std::string where = path + ": tensor \"" + tensor.name + "\": ";
    if (tensor.name == kMetadataKey)
      throw Error(where + "the name " + kMetadataKey + " is reserved for the file's metadata");
    if (!names.insert(tensor.name).second) throw Error(where + "the name is given twice");
    if (!is_valid_utf8(tensor.name)) throw Error(where + "the name is not valid UTF-8");
    const size_t element_bytes = safetensors_dtype_bytes(tensor.dtype);
    if (element_bytes == 0)
      throw Error(where + "unknown dtype \"" + tensor.dtype + "\"; known: " + known_dtypes());
    for (const int64_t dimension : tensor.shape) {
      if (dimension < 0)
        throw Error(where + "shape " + shape_text(tensor.shape) + " has a negative dimension");
    }
    uint64_t expected_bytes = 0;
    if (!shape_bytes(tensor.shape, element_bytes, expected_bytes))
      throw Error(where + "shape " + shape_text(tensor.shape) + " is too large");
    if (expected_bytes != tensor.bytes) {
      throw Error(where + "shape " + shape_text(tensor.shape) + " of " + tensor.dtype + " needs " +
                  std::to_string(expected_bytes) + " bytes, the data has " +
                  std::to_string(tensor.bytes));
    }
    if (tensor.bytes > 0 && tensor.data == nullptr) throw Error(where + "the data pointer is null");
  }
  for (const auto& [key, value] : metadata) {
    if (!is_valid_utf8(key) || !is_valid_utf8(value))
      throw Error(path + ": metadata \"" + key + "\": the key or the value is not valid UTF-8");
  }
}

// --- reading ---

void read_at(int fd, uint64_t offset, void* data, size_t bytes, const std::string& path) {
  auto* cursor = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t got = ::pread(fd, cursor, bytes, static_cast<off_t>(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      throw DataError(path + ": cannot read: " + system_error());
    }
    if (got == 0) throw DataError(path + ": the file ended early (truncated while being read?)");
    cursor += got;
    offset += static_cast<uint64_t>(got);
    bytes -= static_cast<size_t>(got);
  }
}

int open_for_reading(const std::string& path, uint64_t& file_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw DataError(path + ": cannot open: " + system_error());
  struct stat status {};
  if (::fstat(fd, &status) != 0) {
    const std::string reason = system_error();
    ::close(fd);
    throw DataError(path + ": cannot stat: " + reason);
  }
  if (!S_ISREG(status.st_mode)) {
    ::close(fd);
    throw DataError(path + ": not a regular file");
  }
  file_bytes = static_cast<uint64_t>(status.st_size);
  return fd;
}

// The JSON, with a top-level key given twice reported: nlohmann keeps the last one silently,
// and two tensors of one name would leave bytes that belong to neither.
json parse_header_json(const std::string& path, const std::string& text) {
  std::set<std::string> top_level_keys;
  std::string duplicate;
  const auto on_event = [&](int depth, json::parse_event_t event, json& parsed) {
    // The messages quote a wrong entry with dump(), which recurses: 100,000 nested brackets
    // overflowed the stack (found while fuzzing, fuzz/fuzz_safetensors.cpp). The reference
    // implementation's JSON reader (serde_json) stops at 128 levels too; a header needs 3.
    if ((event == json::parse_event_t::object_start ||
         event == json::parse_event_t::array_start) && depth >= kMaxJsonDepth)
      throw DataError(path + ": the header nests arrays and objects more than " +
                      std::to_string(kMaxJsonDepth) + " levels deep: not a safetensors file");
    if (event == json::parse_event_t::key && depth == 1 && duplicate.empty()) {
      const std::string key = parsed.get<std::string>();
      if (!top_level_keys.insert(key).second) duplicate = key;
    }
    return true;
  };
  json header;
  try {
    header = json::parse(text, on_event);
  } catch (const json::parse_error& error) {
    throw DataError(path + ": the header is not valid JSON (" + error.what() +
                    "): not a safetensors file, or a corrupt one");
  } catch (const json::out_of_range& error) {
    // What nlohmann throws for a number beyond a double's range (1e400).
    throw DataError(path + ": the header is not valid JSON (" + error.what() +
                    "): not a safetensors file, or a corrupt one");
  }
  if (!header.is_object())
    throw DataError(path + ": the header is not a JSON object: not a safetensors file");
  if (!duplicate.empty()) throw DataError(path + ": the header names \"" + duplicate + "\" twice");
  return header;
}

uint64_t unsigned_field(const json& value, const std::string& where, const char* what) {
  if (!value.is_number_unsigned())
    throw DataError(where + what + " must hold non-negative integers, found " + value.dump());
  return value.get<uint64_t>();
}

SafetensorsTensorInfo parse_tensor_info(const std::string& path, const std::string& name,
                                        const json& entry) {
  const std::string where = path + ": tensor \"" + name + "\": ";
  if (!entry.is_object()) throw DataError(where + "expected an object, found " + entry.dump());
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    if (!entry.contains(field)) throw DataError(where + "no \"" + field + "\"");
  }
  SafetensorsTensorInfo info;
  info.name = name;

  const json& dtype = entry.at("dtype");
  if (!dtype.is_string() || safetensors_dtype_bytes(dtype.get<std::string>()) == 0)
    throw DataError(where + "unknown dtype " + dtype.dump() + "; known: " + known_dtypes());
  info.dtype = dtype.get<std::string>();

  const json& shape = entry.at("shape");
  if (!shape.is_array()) throw DataError(where + "shape must be an array, found " + shape.dump());
  for (const json& dimension : shape) {
    const uint64_t d = unsigned_field(dimension, where, "shape");
    if (d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      throw DataError(where + "shape " + shape.dump() + " is too large");
    info.shape.push_back(static_cast<int64_t>(d));
  }

  const json& offsets = entry.at("data_offsets");
  if (!offsets.is_array() || offsets.size() != 2)
    throw DataError(where + "data_offsets must be [begin, end], found " + offsets.dump());
  info.begin = unsigned_field(offsets[0], where, "data_offsets");
  info.end = unsigned_field(offsets[1], where, "data_offsets");
  if (info.end < info.begin)
    throw DataError(where + "data_offsets " + offsets.dump() + " end before they begin");

  uint64_t expected_bytes = 0;
  if (!shape_bytes(info.shape, safetensors_dtype_bytes(info.dtype), expected_bytes))
    throw DataError(where + "shape " + shape.dump() + " is too large");
  if (expected_bytes != info.bytes()) {
    throw DataError(where + "shape " + shape.dump() + " of " + info.dtype + " needs " +
                    std::to_string(expected_bytes) + " bytes, data_offsets " + offsets.dump() +
                    " hold " + std::to_string(info.bytes()));
  }
  return info;
}

std::map<std::string, std::string> parse_metadata(const std::string& path, const json& entry) {
  if (!entry.is_object())
    throw DataError(path + ": " + kMetadataKey + " must be an object, found " + entry.dump());
  std::map<std::string, std::string> metadata;
  for (const auto& [key, value] : entry.items()) {
    if (!value.is_string()) {
      throw DataError(path + ": " + kMetadataKey + " \"" + key +
                      "\": values must be strings, found " + value.dump());
    }
    metadata[key] = value.get<std::string>();
  }
  return metadata;
}

}  // namespace

size_t safetensors_dtype_bytes(const std::string& dtype) {
  for (const auto& known : kDtypes) {
    if (dtype == known.name) return known.bytes;
  }
  return 0;
}

const SafetensorsTensorInfo* SafetensorsHeader::find(const std::string& name) const {
  for (const auto& tensor : tensors) {
    if (tensor.name == name) return &tensor;
  }
  return nullptr;
}

void write_safetensors(const std::string& path, const std::vector<SafetensorsEntry>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  check_entries(path, tensors, metadata);

  // Larger elements first (stable), so that each tensor's offset is a multiple of its element
  // size: the data start is a multiple of 8 (the padded header), and a run of elements of size s
  // keeps the offset a multiple of every smaller power of two.
  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return safetensors_dtype_bytes(tensors[a].dtype) > safetensors_dtype_bytes(tensors[b].dtype);
  });

  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  uint64_t offset = 0;
  for (const size_t index : order) {
    const SafetensorsEntry& tensor = tensors[index];
    header[tensor.name] = {{"dtype", tensor.dtype},
                           {"shape", tensor.shape},
                           {"data_offsets", {offset, offset + tensor.bytes}}};
    offset += tensor.bytes;
  }
  std::string header_text = header.dump();
  header_text.append(
      (kHeaderAlignmentBytes - header_text.size() % kHeaderAlignmentBytes) % kHeaderAlignmentBytes,
      ' ');
  const auto header_bytes = static_cast<uint64_t>(header_text.size());
  std::string length_field;
  append_little_endian(length_field, header_bytes);

  // Note [Atomic file write].
  AtomicFile file(path);
  file.append(length_field.data(), length_field.size());
  file.append(header_text.data(), header_text.size());
  for (const size_t index : order) file.append(tensors[index].data, tensors[index].bytes);
  file.commit();
}

SafetensorsHeader read_safetensors_header(const std::string& path) {
  SafetensorsHeader result;
  const FileDescriptor file(open_for_reading(path, result.file_bytes));

  if (result.file_bytes < kLengthFieldBytes) {
    throw DataError(path + ": " + std::to_string(result.file_bytes) +
                    " bytes, too short for a safetensors file (truncated?)");
  }
  uint8_t length_field[kLengthFieldBytes];
  read_at(file.get(), 0, length_field, sizeof(length_field), path);
  const uint64_t header_bytes = load_little_endian<uint64_t>(length_field);
  if (header_bytes > kMaxHeaderBytes) {
    throw DataError(path + ": header length " + std::to_string(header_bytes) +
                    " is over the format's limit of " + std::to_string(kMaxHeaderBytes) +
                    " bytes: not a safetensors file, or a corrupt one");
  }
  if (header_bytes > result.file_bytes - kLengthFieldBytes) {
    throw DataError(path + ": header length " + std::to_string(header_bytes) +
                    " runs past the end of the file (" + std::to_string(result.file_bytes) +
                    " bytes): truncated, or not a safetensors file");
  }
  result.data_start = kLengthFieldBytes + header_bytes;

  std::string text(header_bytes, '\0');
  read_at(file.get(), kLengthFieldBytes, text.data(), text.size(), path);
  const json header = parse_header_json(path, text);

  for (const auto& [name, entry] : header.items()) {
    if (name == kMetadataKey)
      result.metadata = parse_metadata(path, entry);
    else
      result.tensors.push_back(parse_tensor_info(path, name, entry));
  }

  // The data must be covered exactly: in offset order, each tensor begins where the previous one
  // ended, and the last ends at the end of the file.
  std::sort(result.tensors.begin(), result.tensors.end(),
            [](const SafetensorsTensorInfo& a, const SafetensorsTensorInfo& b) {
              return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
            });
  uint64_t covered = 0;
  for (const auto& tensor : result.tensors) {
    if (tensor.begin != covered) {
      const std::string problem =
          tensor.begin < covered
              ? "overlap another tensor's data"
              : "leave a gap after byte " + std::to_string(covered) + " of the data";
      throw DataError(path + ": tensor \"" + tensor.name + "\": data_offsets [" +
                      std::to_string(tensor.begin) + ", " + std::to_string(tensor.end) + "] " +
                      problem);
    }
    covered = tensor.end;
  }
  const uint64_t data_bytes = result.file_bytes - result.data_start;
  if (covered > data_bytes) {
    throw DataError(path + ": the tensors need " + std::to_string(covered) +
                    " data bytes, the file has " + std::to_string(data_bytes) + ": truncated");
  }
  if (covered < data_bytes) {
    throw DataError(path + ": " + std::to_string(data_bytes - covered) +
                    " bytes after the last tensor's data belong to no tensor");
  }
  return result;
}

std::vector<uint8_t> read_safetensors_tensor(const std::string& path,
                                             const SafetensorsHeader& header,
                                             const std::string& name) {
  const SafetensorsTensorInfo* tensor = header.find(name);
  if (tensor == nullptr) throw DataError(path + ": no tensor \"" + name + "\"");
  uint64_t file_bytes = 0;
  const FileDescriptor file(open_for_reading(path, file_bytes));
  if (file_bytes != header.file_bytes)
    throw DataError(path + ": the file changed size since its header was read");
  std::vector<uint8_t> bytes(tensor->bytes());
  read_at(file.get(), header.data_start + tensor->begin, bytes.data(), bytes.size(), path);
  return bytes;
}

}  // namespace hpc_train
