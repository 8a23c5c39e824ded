#include "hdf5_recipe.h"

#include <hdf5.h>
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <utility>
#include <vector>

namespace hpc_train::fuzz {

namespace {

constexpr size_t kMaxOps = 256;
constexpr uint64_t kMaxDataBytes = 1 << 20;        // per dataset or attribute
constexpr uint64_t kMaxFileDataBytes = 4 << 20;    // per file
constexpr hsize_t kChunkSide = 16;
constexpr int kMaxRank = 4;

// Note [HDF5 recipes]: the types a value can have, by type code.
enum TypeCode : uint8_t {
  kU8,
  kI8,
  kU16,
  kI16,
  kU32,
  kI32,
  kU64,
  kI64,
  kI64Be,
  kF32,
  kF32Be,
  kF64,
  kFixedString,
  kVlenString,
  kOpaque,
  kCrc32,  // an unsigned 32-bit integer: the CRC-32 of the data of the dataset at the op's path
  // A signed little-endian integer of 16 bytes (precision 64): wider than any the readers take,
  // as a damaged datatype message can claim (labels of gigabytes each made H5Dread allocate
  // that much per label). Last, so that the codes before it keep their seeds' meaning.
  kWideInteger,
  kTypeCount
};

enum OpCode : uint8_t { kGroup, kDataset, kAttribute, kSoftLink, kOpCount };
enum SpaceClass : uint8_t { kSimple, kScalar, kNull };

// An HDF5 identifier that closes itself with H5Idec_ref (any kind of object).
class Id {
 public:
  explicit Id(hid_t id = H5I_INVALID_HID) : id_(id) {}
  ~Id() {
    if (id_ >= 0) H5Idec_ref(id_);
  }
  Id(const Id&) = delete;
  Id& operator=(const Id&) = delete;
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }

 private:
  hid_t id_;
};

// --- Building a file from a recipe -------------------------------------------------------

class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), left_(size) {}

  bool u8(uint8_t& value) { return take(&value, 1); }
  bool u16(uint16_t& value) {
    uint8_t bytes[2];
    if (!take(bytes, 2)) return false;
    value = static_cast<uint16_t>(bytes[0] | bytes[1] << 8);
    return true;
  }
  bool u64(uint64_t& value) {
    uint8_t bytes[8];
    if (!take(bytes, 8)) return false;
    value = 0;
    for (int i = 7; i >= 0; --i) value = value << 8 | bytes[i];
    return true;
  }
  bool str(std::string& value) {
    uint8_t length = 0;
    return u8(length) && chars(value, length);
  }
  bool str16(std::string& value) {
    uint16_t length = 0;
    return u16(length) && chars(value, length);
  }

 private:
  bool take(uint8_t* out, size_t n) {
    if (left_ < n) return false;
    std::copy_n(data_, n, out);
    data_ += n;
    left_ -= n;
    return true;
  }
  bool chars(std::string& value, size_t n) {
    if (left_ < n) return false;
    value.assign(reinterpret_cast<const char*>(data_), n);
    data_ += n;
    left_ -= n;
    return true;
  }

  const uint8_t* data_;
  size_t left_;
};

struct Value {
  uint8_t type = kU8;
  uint8_t string_size = 1;
  uint8_t space = kSimple;
  std::vector<hsize_t> dims;
  std::string bytes;
};

bool read_value(Reader& in, Value& value) {
  uint8_t space_byte = 0;
  if (!in.u8(value.type)) return false;
  value.type %= kTypeCount;
  if (value.type == kFixedString && !in.u8(value.string_size)) return false;
  if (!in.u8(space_byte)) return false;
  value.space = static_cast<uint8_t>((space_byte >> 6) % 3);
  const int rank = value.space == kSimple ? (space_byte & 7) % (kMaxRank + 1) : 0;
  value.dims.resize(static_cast<size_t>(rank));
  for (hsize_t& dimension : value.dims) {
    uint64_t d = 0;
    if (!in.u64(d)) return false;
    dimension = d;
  }
  return in.str16(value.bytes);
}

hid_t make_type(const Value& value) {
  switch (value.type) {
    case kU8: return H5Tcopy(H5T_STD_U8LE);
    case kI8: return H5Tcopy(H5T_STD_I8LE);
    case kU16: return H5Tcopy(H5T_STD_U16LE);
    case kI16: return H5Tcopy(H5T_STD_I16LE);
    case kU32: return H5Tcopy(H5T_STD_U32LE);
    case kI32: return H5Tcopy(H5T_STD_I32LE);
    case kU64: return H5Tcopy(H5T_STD_U64LE);
    case kI64: return H5Tcopy(H5T_STD_I64LE);
    case kI64Be: return H5Tcopy(H5T_STD_I64BE);
    case kF32: return H5Tcopy(H5T_IEEE_F32LE);
    case kF32Be: return H5Tcopy(H5T_IEEE_F32BE);
    case kF64: return H5Tcopy(H5T_IEEE_F64LE);
    case kFixedString: {
      const hid_t type = H5Tcopy(H5T_C_S1);
      H5Tset_size(type, std::max<size_t>(1, value.string_size));
      return type;
    }
    case kVlenString: {
      const hid_t type = H5Tcopy(H5T_C_S1);
      H5Tset_size(type, H5T_VARIABLE);
      H5Tset_cset(type, H5T_CSET_UTF8);  // as h5py writes str
      return type;
    }
    case kOpaque: return H5Tcreate(H5T_OPAQUE, 4);
    case kWideInteger: {
      const hid_t type = H5Tcopy(H5T_STD_I64LE);
      H5Tset_size(type, 16);
      return type;
    }
    default: return H5Tcopy(H5T_STD_U32LE);  // kCrc32
  }
}

hid_t make_space(const Value& value) {
  if (value.space == kNull) return H5Screate(H5S_NULL);
  if (value.space == kScalar || value.dims.empty()) return H5Screate(H5S_SCALAR);
  return H5Screate_simple(static_cast<int>(value.dims.size()), value.dims.data(), nullptr);
}

// The number of elements, or nothing when it does not fit in 64 bits.
bool element_count(const Value& value, uint64_t& count) {
  count = value.space == kNull ? 0 : 1;
  if (value.space != kSimple) return true;
  for (hsize_t d : value.dims)
    if (__builtin_mul_overflow(count, d, &count)) return false;
  return true;
}

// The bytes to write for `value`: its element bytes repeated over the shape (for variable-length
// strings, pointers to its '\0'-separated strings, repeated), within the file's budget. Empty
// `buffer` and false: nothing to write.
class Data {
 public:
  bool fill(const Value& value, hid_t type, uint64_t& budget) {
    uint64_t count = 0, bytes = 0;
    const size_t element = value.type == kVlenString ? sizeof(char*) : H5Tget_size(type);
    if (!element_count(value, count) || count == 0 ||
        __builtin_mul_overflow(count, element, &bytes) || bytes > kMaxDataBytes || bytes > budget)
      return false;
    budget -= bytes;
    if (value.type == kVlenString) {
      size_t start = 0;
      do {
        const size_t end = std::min(value.bytes.find('\0', start), value.bytes.size());
        strings_.push_back(value.bytes.substr(start, end - start));
        start = end + 1;
      } while (start <= value.bytes.size() && strings_.size() < count);
      for (uint64_t i = 0; i < count; ++i)
        pointers_.push_back(strings_[i % strings_.size()].c_str());
      return true;
    }
    buffer_.resize(bytes);
    for (uint64_t i = 0; i < bytes && !value.bytes.empty(); ++i)
      buffer_[i] = static_cast<char>(value.bytes[i % value.bytes.size()]);
    return true;
  }
  const void* get() const {
    return pointers_.empty() ? static_cast<const void*>(buffer_.data()) : pointers_.data();
  }
  // What the checkpoint's crc32 attributes cover: the data's bytes as stored.
  const std::string& bytes() const { return buffer_; }

 private:
  std::string buffer_;
  std::vector<std::string> strings_;
  std::vector<const char*> pointers_;
};

class Builder {
 public:
  explicit Builder(const std::string& path)
      : file_(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT)),
        links_(H5Pcreate(H5P_LINK_CREATE)) {
    if (!file_.valid()) {
      std::fprintf(stderr, "fuzz: cannot create %s\n", path.c_str());
      std::abort();
    }
    H5Pset_create_intermediate_group(links_.get(), 1);
  }

  void run(Reader& in) {
    for (size_t n = 0; n < kMaxOps; ++n) {
      uint8_t code = 0;
      if (!in.u8(code) || !op(static_cast<OpCode>(code % kOpCount), in)) return;
    }
  }

  ~Builder() { H5Fflush(file_.get(), H5F_SCOPE_GLOBAL); }

 private:
  bool op(OpCode code, Reader& in) {
    std::string path, name;
    Value value;
    uint8_t flags = 0;
    switch (code) {
      case kGroup: {
        if (!in.str(path) || !in.u8(flags)) return false;
        Id creation(H5Pcreate(H5P_GROUP_CREATE));
        if (flags & 1)
          H5Pset_link_creation_order(creation.get(),
                                     H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED);
        Id group(H5Gcreate2(file_.get(), path.c_str(), links_.get(), creation.get(), H5P_DEFAULT));
        return true;
      }
      case kDataset: {
        if (!in.str(path) || !read_value(in, value) || !in.u8(flags)) return false;
        dataset(path, value, flags);
        return true;
      }
      case kAttribute: {
        if (!in.str(path) || !in.str(name) || !read_value(in, value)) return false;
        attribute(path, name, value);
        return true;
      }
      default: {
        if (!in.str(path) || !in.str(name)) return false;
        H5Lcreate_soft(name.c_str(), file_.get(), path.c_str(), links_.get(), H5P_DEFAULT);
        return true;
      }
    }
  }

  void dataset(const std::string& path, const Value& value, uint8_t flags) {
    Id type(make_type(value));
    Id space(make_space(value));
    Id creation(H5Pcreate(H5P_DATASET_CREATE));
    const bool positive = value.space == kSimple && !value.dims.empty() &&
                          std::find(value.dims.begin(), value.dims.end(), 0) == value.dims.end();
    if (flags % 3 == 1 && positive) {
      std::vector<hsize_t> chunk;
      for (hsize_t d : value.dims) chunk.push_back(std::min(d, kChunkSide));
      H5Pset_chunk(creation.get(), static_cast<int>(chunk.size()), chunk.data());
      if (flags & 4) H5Pset_deflate(creation.get(), 1);
    } else if (flags % 3 == 2) {
      H5Pset_layout(creation.get(), H5D_COMPACT);
    }
    Id dataset(H5Dcreate2(file_.get(), path.c_str(), type.get(), space.get(), links_.get(),
                          creation.get(), H5P_DEFAULT));
    if (!dataset.valid()) return;
    Data data;
    if (data.fill(value, type.get(), budget_))
      H5Dwrite(dataset.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, data.get());
    dataset_bytes_[path] = data.bytes();
  }

  void attribute(const std::string& path, const std::string& name, Value value) {
    if (value.type == kCrc32) {
      const std::string& covered = dataset_bytes_[path];
      const uLong crc = crc32(crc32(0L, Z_NULL, 0),
                              reinterpret_cast<const Bytef*>(covered.data()),
                              static_cast<uInt>(covered.size()));
      value.bytes.clear();
      for (int i = 0; i < 4; ++i) value.bytes += static_cast<char>(crc >> (8 * i));
    }
    Id type(make_type(value));
    // HDF5 1.10 sizes an attribute's stored data as elements x element size in 64 bits,
    // wrapping, and its object-header code then memsets that size: a product that wraps to
    // more than 2^63 is a negative size there (an ASan report inside HDF5, not in our reader).
    // Attributes whose wrapped size is beyond kMaxDataBytes are not made; the wrap to a small
    // size, which found the count check of DatasetFile's attribute reader, still is.
    uint64_t count = 0;
    const uint64_t stored_element = value.type == kVlenString ? 16 : H5Tget_size(type.get());
    if (!element_count(value, count) || count * stored_element > kMaxDataBytes) return;
    Id space(make_space(value));
    Id attribute(H5Acreate_by_name(file_.get(), path.c_str(), name.c_str(), type.get(),
                                   space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    if (!attribute.valid()) return;
    Data data;
    if (data.fill(value, type.get(), budget_)) H5Awrite(attribute.get(), type.get(), data.get());
  }

  Id file_;
  Id links_;
  uint64_t budget_ = kMaxFileDataBytes;
  std::map<std::string, std::string> dataset_bytes_;  // for kCrc32
};

// --- The recipe of a file ----------------------------------------------------------------

class Writer {
 public:
  void u8(uint8_t value) { out_ += static_cast<char>(value); }
  void u16(uint16_t value) {
    u8(static_cast<uint8_t>(value));
    u8(static_cast<uint8_t>(value >> 8));
  }
  void u64(uint64_t value) {
    for (int i = 0; i < 8; ++i) u8(static_cast<uint8_t>(value >> (8 * i)));
  }
  void str(const std::string& value) {
    const size_t n = std::min<size_t>(value.size(), 255);
    u8(static_cast<uint8_t>(n));
    out_ += value.substr(0, n);
  }
  void str16(const std::string& value) {
    const size_t n = std::min<size_t>(value.size(), 65535);
    u16(static_cast<uint16_t>(n));
    out_ += value.substr(0, n);
  }
  const std::string& text() const { return out_; }

 private:
  std::string out_;
};

uint8_t type_code(hid_t type, uint8_t& string_size) {
  const size_t size = H5Tget_size(type);
  const bool big_endian = H5Tget_order(type) == H5T_ORDER_BE;
  switch (H5Tget_class(type)) {
    case H5T_INTEGER: {
      const bool sign = H5Tget_sign(type) == H5T_SGN_2;
      if (size == 1) return sign ? kI8 : kU8;
      if (size == 2) return sign ? kI16 : kU16;
      if (size == 4) return sign ? kI32 : kU32;
      if (size > 8) return kWideInteger;
      return sign ? (big_endian ? kI64Be : kI64) : kU64;
    }
    case H5T_FLOAT:
      if (size == 4) return big_endian ? kF32Be : kF32;
      return kF64;
    case H5T_STRING:
      if (H5Tis_variable_str(type) > 0) return kVlenString;
      string_size = static_cast<uint8_t>(std::min<size_t>(size, 255));
      return kFixedString;
    default:
      return kOpaque;
  }
}

// A value's type, shape and bytes; `read` reads the data with the given memory type.
template <class Read>
void write_value(Writer& out, hid_t type, hid_t space, Read&& read, std::string* data_bytes) {
  uint8_t string_size = 1;
  const uint8_t code = type_code(type, string_size);
  out.u8(code);
  if (code == kFixedString) out.u8(string_size);
  const H5S_class_t space_class = H5Sget_simple_extent_type(space);
  const int rank = H5Sget_simple_extent_ndims(space);
  std::vector<hsize_t> dims(static_cast<size_t>(std::max(rank, 0)));
  H5Sget_simple_extent_dims(space, dims.data(), nullptr);
  if (space_class == H5S_NULL) {
    out.u8(kNull << 6);
  } else if (space_class == H5S_SCALAR) {
    out.u8(kScalar << 6);
  } else {
    out.u8(static_cast<uint8_t>(kSimple << 6 | rank));
    for (hsize_t d : dims) out.u64(d);
  }
  const hssize_t points = space_class == H5S_NULL ? 0 : H5Sget_simple_extent_npoints(space);
  std::string bytes;
  if (points > 0 && code == kVlenString) {
    Id memory(H5Tcopy(H5T_C_S1));
    H5Tset_size(memory.get(), H5T_VARIABLE);
    H5Tset_cset(memory.get(), H5Tget_cset(type));
    std::vector<char*> strings(static_cast<size_t>(points), nullptr);
    if (read(memory.get(), strings.data()) >= 0) {
      for (size_t i = 0; i < strings.size(); ++i) {
        bytes += (i ? std::string(1, '\0') : "") + (strings[i] ? strings[i] : "");
        H5free_memory(strings[i]);
      }
    }
  } else if (points > 0) {
    bytes.resize(static_cast<size_t>(points) * H5Tget_size(type));
    if (read(type, bytes.data()) < 0) bytes.clear();
  }
  out.str16(bytes);
  if (data_bytes) *data_bytes = bytes;
}

class Walker {
 public:
  explicit Walker(hid_t file) : file_(file) {}

  void walk_group(const std::string& path) {
    attributes(path, nullptr);
    Id group(H5Gopen2(file_, path.c_str(), H5P_DEFAULT));
    Id creation(H5Gget_create_plist(group.get()));
    unsigned order = 0;
    H5Pget_link_creation_order(creation.get(), &order);
    std::vector<std::string> names;
    const H5_index_t index = order & H5P_CRT_ORDER_TRACKED ? H5_INDEX_CRT_ORDER : H5_INDEX_NAME;
    H5Literate(group.get(), index, H5_ITER_INC, nullptr,
               [](hid_t, const char* name, const H5L_info_t*, void* data) -> herr_t {
                 static_cast<std::vector<std::string>*>(data)->push_back(name);
                 return 0;
               },
               &names);
    for (const std::string& name : names) {
      const std::string child = (path == "/" ? "/" : path + "/") + name;
      H5L_info_t link;
      H5Lget_info(file_, child.c_str(), &link, H5P_DEFAULT);
      if (link.type == H5L_TYPE_SOFT) {
        std::string target(link.u.val_size, '\0');
        H5Lget_val(file_, child.c_str(), target.data(), target.size(), H5P_DEFAULT);
        target.resize(target.find('\0') == std::string::npos ? target.size() : target.find('\0'));
        out_.u8(kSoftLink);
        out_.str(child);
        out_.str(target);
        continue;
      }
      H5O_info_t info;
      if (H5Oget_info_by_name(file_, child.c_str(), &info, H5P_DEFAULT) < 0) continue;
      if (info.type == H5O_TYPE_GROUP) {
        Id child_group(H5Gopen2(file_, child.c_str(), H5P_DEFAULT));
        Id child_creation(H5Gget_create_plist(child_group.get()));
        unsigned child_order = 0;
        H5Pget_link_creation_order(child_creation.get(), &child_order);
        out_.u8(kGroup);
        out_.str(child);
        out_.u8(child_order & H5P_CRT_ORDER_TRACKED ? 1 : 0);
        walk_group(child);
      } else if (info.type == H5O_TYPE_DATASET) {
        dataset(child);
      }
    }
  }

  const std::string& recipe() const { return out_.text(); }

 private:
  void dataset(const std::string& path) {
    Id dataset(H5Dopen2(file_, path.c_str(), H5P_DEFAULT));
    Id type(H5Dget_type(dataset.get()));
    Id space(H5Dget_space(dataset.get()));
    Id creation(H5Dget_create_plist(dataset.get()));
    uint8_t layout = 0;
    if (H5Pget_layout(creation.get()) == H5D_CHUNKED)
      layout = static_cast<uint8_t>(1 | (H5Pget_nfilters(creation.get()) > 0 ? 4 : 0));
    else if (H5Pget_layout(creation.get()) == H5D_COMPACT)
      layout = 2;
    out_.u8(kDataset);
    out_.str(path);
    std::string data;
    write_value(
        out_, type.get(), space.get(),
        [&](hid_t memory, void* buffer) {
          return H5Dread(dataset.get(), memory, H5S_ALL, H5S_ALL, H5P_DEFAULT, buffer);
        },
        &data);
    out_.u8(layout);
    attributes(path, &data);
  }

  // The attributes of the object at `path`; `data`: a dataset's bytes, for its crc32.
  void attributes(const std::string& path, const std::string* data) {
    Id object(H5Oopen(file_, path.c_str(), H5P_DEFAULT));
    std::vector<std::string> names;
    H5Aiterate2(object.get(), H5_INDEX_NAME, H5_ITER_INC, nullptr,
                [](hid_t, const char* name, const H5A_info_t*, void* out) -> herr_t {
                  static_cast<std::vector<std::string>*>(out)->push_back(name);
                  return 0;
                },
                &names);
    for (const std::string& name : names) {
      Id attribute(H5Aopen(object.get(), name.c_str(), H5P_DEFAULT));
      Id type(H5Aget_type(attribute.get()));
      Id space(H5Aget_space(attribute.get()));
      out_.u8(kAttribute);
      out_.str(path);
      out_.str(name);
      if (data && name == "crc32" && H5Tget_class(type.get()) == H5T_INTEGER) {
        uint64_t stored = 0;
        H5Aread(attribute.get(), H5T_NATIVE_UINT64, &stored);
        const uLong crc = crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(data->data()),
                                static_cast<uInt>(data->size()));
        if (stored == crc) {
          out_.u8(kCrc32);
          out_.u8(kScalar << 6);
          out_.str16("");
          continue;
        }
      }
      write_value(out_, type.get(), space.get(),
                  [&](hid_t memory, void* buffer) {
                    return H5Aread(attribute.get(), memory, buffer);
                  },
                  nullptr);
    }
  }

  hid_t file_;
  Writer out_;
};

}  // namespace

void build_hdf5_file(const uint8_t* recipe, size_t size, const std::string& path) {
  Reader in(recipe, size);
  Builder(path).run(in);
}

std::string recipe_of_hdf5_file(const std::string& path) {
  Id file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  if (!file.valid()) {
    std::fprintf(stderr, "recipe_of_hdf5_file: cannot open %s\n", path.c_str());
    std::abort();
  }
  Walker walker(file.get());
  walker.walk_group("/");
  return walker.recipe();
}

}  // namespace hpc_train::fuzz
