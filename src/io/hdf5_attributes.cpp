#include "io/hdf5_attributes.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <utility>

#include "hpc_train/error.h"
#include "hpc_train/io/byte_order.h"
#include "hpc_train/io/file_descriptor.h"

namespace hpc_train::h5 {

std::string describe_type(hid_t type) {
  const std::string bits = std::to_string(8 * H5Tget_size(type)) + "-bit ";
  switch (H5Tget_class(type)) {
    case H5T_INTEGER:
      return bits + (H5Tget_sign(type) == H5T_SGN_NONE ? "unsigned integer" : "signed integer");
    case H5T_FLOAT:
      return bits + "float";
    case H5T_STRING:
      return "string";
    default:
      return "non-numeric type";
  }
}

size_t checked_bytes(uint64_t elements, size_t element_bytes, uint64_t file_bytes,
                     const std::string& what) {
  if (elements > file_bytes / element_bytes)
    throw DataError(what + " claims " + std::to_string(elements) + " elements of " +
                    std::to_string(element_bytes) + " bytes, more than the file's " +
                    std::to_string(file_bytes) + " bytes");
  return static_cast<size_t>(elements * element_bytes);
}

// --- Reading -------------------------------------------------------------------------------

namespace {

// Note [Variable-length strings read here]: a variable-length string attribute (what h5py writes
// for str: a dataset file's class_names and source) holds one descriptor per string: its length
// and the global heap object that holds its bytes; HDF5 1.10's H5Aread trusts both. One flipped
// bit of a file made it segfault in H5HG_read (an object index past the heap's) or allocate and
// clear gigabytes for minutes (a length with a high bit set): no error to report. So H5Aread
// converts the strings into an opaque type of ours whose conversion keeps the descriptors'
// bytes as the file has them, and the strings are read here from the file's global heap
// collections, every address, index and size checked against the collection and the file.
constexpr char kDescriptorTag[] = "hpc_train: a variable-length string's descriptor";
// HDF5 makes a collection 4 KiB, or as large as one object that needs more: a corrupt size above
// this is refused rather than read.
constexpr uint64_t kMaxHeapCollectionBytes = uint64_t{64} << 20;

// H5Aread's conversion from a variable-length string in the file to a descriptor: none, the
// bytes stay (the sizes are equal, so HDF5 converts in place). Refuses every other pair, so that
// it applies to the descriptor type alone.
herr_t keep_descriptors(hid_t source, hid_t destination, H5T_cdata_t* cdata, size_t, size_t,
                        size_t, void*, void*, hid_t) {
  if (cdata->command != H5T_CONV_INIT) return 0;  // H5T_CONV_CONV: in place; H5T_CONV_FREE
  cdata->need_bkg = H5T_BKG_NO;
  if (H5Tis_variable_str(source) <= 0 || H5Tget_class(destination) != H5T_OPAQUE) return -1;
  char* tag = H5Tget_tag(destination);
  const bool ours = tag != nullptr && std::strcmp(tag, kDescriptorTag) == 0;
  H5free_memory(tag);
  return ours && H5Tget_size(source) == H5Tget_size(destination) ? 0 : -1;
}

// A descriptor in a file whose addresses take `address_bytes`: length (4 bytes), the heap
// collection's address, the object's index (4 bytes), little-endian.
Type descriptor_type(size_t address_bytes) {
  Type type(H5_CHECK(H5Tcreate(H5T_OPAQUE, 4 + address_bytes + 4)));
  H5_CHECK(H5Tset_tag(type.get(), kDescriptorTag));
  static std::once_flag registered;  // the caller holds the HDF5 lock
  std::call_once(registered, [&] {
    Type variable_string(H5_CHECK(H5Tcopy(H5T_C_S1)));
    H5_CHECK(H5Tset_size(variable_string.get(), H5T_VARIABLE));
    H5_CHECK(H5Tregister(H5T_PERS_SOFT, "hpc_train descriptors", variable_string.get(),
                         type.get(), keep_descriptors));
  });
  return type;
}

// The objects of a file's global heap collections, read with pread and checked against the
// file's size on disk (HDF5's file format: a collection is "GCOL", version 1, 3 reserved bytes,
// its size; then objects of an index (2 bytes), a reference count (2), 4 reserved bytes, a size
// and the data, padded to 8 bytes; index 0 is the free space, which ends the list).
class GlobalHeap {
 public:
  GlobalHeap(hid_t object, std::string what) : what_(std::move(what)) {
    const ssize_t name_bytes = H5_CHECK(H5Fget_name(object, nullptr, 0));
    std::string path(static_cast<size_t>(name_bytes), '\0');
    H5_CHECK(H5Fget_name(object, path.data(), path.size() + 1));
    File file(H5_CHECK(H5Iget_file_id(object)));
    unsigned intent = 0;
    H5_CHECK(H5Fget_intent(file.get(), &intent));
    // A file open for writing may hold its heap in HDF5's cache only.
    if (intent & H5F_ACC_RDWR) H5_CHECK(H5Fflush(file.get(), H5F_SCOPE_LOCAL));
    PropertyList creation(H5_CHECK(H5Fget_create_plist(file.get())));
    hsize_t user_block = 0;
    H5_CHECK(H5Pget_sizes(creation.get(), &address_bytes_, &length_bytes_));
    H5_CHECK(H5Pget_userblock(creation.get(), &user_block));
    base_ = user_block;  // addresses count from the superblock, which follows the user block
    fd_ = FileDescriptor(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    struct stat status {};
    if (fd_.get() < 0 || ::fstat(fd_.get(), &status) != 0)
      throw DataError(what_ + ": cannot open " + path + " to read its strings: " +
                      std::strerror(errno));
    file_bytes_ = static_cast<uint64_t>(status.st_size);
  }

  size_t address_bytes() const { return address_bytes_; }

  // The string that `descriptor` (descriptor_type's bytes) names.
  std::string string(const uint8_t* descriptor, size_t number) {
    const uint64_t length = load_little_endian(descriptor, 4);
    const uint64_t address = load_little_endian(descriptor + 4, address_bytes_);
    const uint64_t index = load_little_endian(descriptor + 4 + address_bytes_, 4);
    if (length == 0) return "";  // HDF5 stores "" (and a null string) without a heap object
    const std::string which = what_ + ": string " + std::to_string(number) + " (" +
                              std::to_string(length) + " bytes, heap object " +
                              std::to_string(index) + " at " + std::to_string(address) + ")";
    const Collection& collection = read_collection(address, which);
    const auto object = collection.objects.find(index);
    if (object == collection.objects.end())
      throw DataError(which + ": the collection holds no such object (a corrupt file)");
    if (object->second.second != length)
      throw DataError(which + ": the object holds " + std::to_string(object->second.second) +
                      " bytes (a corrupt file)");
    return collection.bytes.substr(object->second.first, length);
  }

 private:
  struct Collection {
    std::string bytes;
    std::map<uint64_t, std::pair<size_t, uint64_t>> objects;  // index: (offset, size)
  };

  void read_at(uint64_t offset, void* into, size_t bytes, const std::string& which) const {
    if (::pread(fd_.get(), into, bytes, static_cast<off_t>(offset)) != static_cast<ssize_t>(bytes))
      throw DataError(which + ": cannot read " + std::to_string(bytes) + " bytes at " +
                      std::to_string(offset));
  }

  const Collection& read_collection(uint64_t address, const std::string& which) {
    const auto known = collections_.find(address);
    if (known != collections_.end()) return known->second;
    const uint64_t header_bytes = 8 + length_bytes_;
    if (address > file_bytes_ || base_ > file_bytes_ - address ||
        header_bytes > file_bytes_ - address - base_)
      throw DataError(which + ": the heap lies past the file's " + std::to_string(file_bytes_) +
                      " bytes (a corrupt file)");
    const uint64_t offset = base_ + address;
    uint8_t header[8 + sizeof(uint64_t)];
    read_at(offset, header, static_cast<size_t>(header_bytes), which);
    const uint64_t size = load_little_endian(header + 8, length_bytes_);
    if (std::memcmp(header, "GCOL", 4) != 0 || header[4] != 1 || size < header_bytes ||
        size > kMaxHeapCollectionBytes || size > file_bytes_ - offset)
      throw DataError(which + ": no global heap collection there (a corrupt file)");
    Collection collection;
    collection.bytes.resize(static_cast<size_t>(size));
    read_at(offset, collection.bytes.data(), collection.bytes.size(), which);
    const auto* bytes = reinterpret_cast<const uint8_t*>(collection.bytes.data());
    const uint64_t object_header_bytes = 8 + length_bytes_;
    for (uint64_t at = header_bytes; object_header_bytes <= size - at;) {
      const uint64_t index = load_little_endian(bytes + at, 2);
      const uint64_t object_bytes = load_little_endian(bytes + at + 8, length_bytes_);
      if (index == 0) break;  // the free space
      const uint64_t data = at + object_header_bytes;
      if (object_bytes > size - data)
        throw DataError(which + ": heap object " + std::to_string(index) + " of " +
                        std::to_string(object_bytes) + " bytes overruns its collection of " +
                        std::to_string(size) + " (a corrupt file)");
      collection.objects[index] = {static_cast<size_t>(data), object_bytes};
      const uint64_t padded = (object_bytes + 7) / 8 * 8;
      if (padded > size - data) break;  // the last object, unpadded at the end
      at = data + padded;
    }
    return collections_.emplace(address, std::move(collection)).first->second;
  }

  std::string what_;
  uint64_t file_bytes_ = 0;
  size_t address_bytes_ = 0;
  size_t length_bytes_ = 0;
  uint64_t base_ = 0;
  FileDescriptor fd_;
  std::map<uint64_t, Collection> collections_;
};

}  // namespace

AttributeReader::AttributeReader(hid_t object, std::string object_name, std::string context,
                                 uint64_t file_bytes)
    : object_(object),
      object_name_(std::move(object_name)),
      context_(std::move(context)),
      file_bytes_(file_bytes) {}

bool AttributeReader::has(const char* name) const {
  return H5_CHECK(H5Aexists(object_, name)) > 0;
}

int64_t AttributeReader::integer(const char* name) const {
  const Opened a = open(name);
  if (H5Tget_class(a.type.get()) != H5T_INTEGER || a.points != 1)
    throw DataError(subject(name) + " is not one integer");
  int64_t value = 0;
  H5_CHECK(H5Aread(a.attribute.get(), H5T_NATIVE_INT64, &value));
  return value;
}

int AttributeReader::small_integer(const char* name) const {
  const int64_t value = integer(name);
  if (value < std::numeric_limits<int>::min() || value > std::numeric_limits<int>::max())
    throw DataError(subject(name) + " = " + std::to_string(value) + " is out of range");
  return static_cast<int>(value);
}

double AttributeReader::real(const char* name) const {
  const Opened a = open(name);
  if (H5Tget_class(a.type.get()) != H5T_FLOAT || a.points != 1)
    throw DataError(subject(name) + " is not one float");
  double value = 0;
  H5_CHECK(H5Aread(a.attribute.get(), H5T_NATIVE_DOUBLE, &value));
  return value;
}

std::vector<float> AttributeReader::floats(const char* name) const {
  const Opened a = open(name);
  check_size(a, name);
  const H5T_class_t type_class = H5Tget_class(a.type.get());
  if (type_class != H5T_FLOAT && type_class != H5T_INTEGER)
    throw DataError(subject(name) + " must be numbers, not " + describe_type(a.type.get()));
  std::vector<float> values(static_cast<size_t>(a.points));
  H5_CHECK(H5Aread(a.attribute.get(), H5T_NATIVE_FLOAT, values.data()));
  return values;
}

std::vector<std::string> AttributeReader::strings(const char* name) const {
  const Opened a = open(name);
  check_size(a, name);
  if (H5Tget_class(a.type.get()) != H5T_STRING)
    throw DataError(subject(name) + " must be strings, not " + describe_type(a.type.get()));
  const size_t count = static_cast<size_t>(a.points);
  std::vector<std::string> values;
  if (H5_CHECK(H5Tis_variable_str(a.type.get())) > 0) {  // Note [Variable-length strings read here]
    GlobalHeap heap(object_, subject(name));
    const Type descriptor = descriptor_type(heap.address_bytes());
    const size_t descriptor_bytes = H5Tget_size(descriptor.get());
    std::vector<uint8_t> descriptors(count * descriptor_bytes);  // count: check_size's
    H5_CHECK(H5Aread(a.attribute.get(), descriptor.get(), descriptors.data()));
    for (size_t i = 0; i < count; ++i)
      values.push_back(heap.string(descriptors.data() + i * descriptor_bytes, i));
  } else {
    Type memory_type(H5_CHECK(H5Tcopy(H5T_C_S1)));
    H5_CHECK(H5Tset_cset(memory_type.get(), H5Tget_cset(a.type.get())));
    const size_t width = H5Tget_size(a.type.get());
    H5_CHECK(H5Tset_size(memory_type.get(), width));
    H5_CHECK(H5Tset_strpad(memory_type.get(), H5T_STR_NULLPAD));
    std::vector<char> buffer(count * width);
    H5_CHECK(H5Aread(a.attribute.get(), memory_type.get(), buffer.data()));
    for (size_t i = 0; i < count; ++i) {
      const char* begin = buffer.data() + i * width;
      values.emplace_back(begin, std::find(begin, begin + width, '\0'));
    }
  }
  return values;
}

std::string AttributeReader::fixed_string(const char* name) const {
  const Opened a = open(name);
  std::string value = fixed_string_buffer(a.type.get(), a.space.get(), subject(name), file_bytes_);
  if (!value.empty()) H5_CHECK(H5Aread(a.attribute.get(), a.type.get(), value.data()));
  return value;
}

AttributeReader::Opened AttributeReader::open(const char* name) const {
  if (!has(name))
    throw DataError(context_ + "missing attribute '" + name + "' on " +
                    (object_name_.empty() ? std::string("the root group") : object_name_));
  Opened a;
  a.attribute = Attribute(H5_CHECK(H5Aopen(object_, name, H5P_DEFAULT)));
  a.type = Type(H5_CHECK(H5Aget_type(a.attribute.get())));
  a.space = Dataspace(H5_CHECK(H5Aget_space(a.attribute.get())));
  a.points = H5_CHECK(H5Sget_simple_extent_npoints(a.space.get()));
  return a;
}

void AttributeReader::check_size(const Opened& a, const char* name) const {
  // An attribute's values are stored in the file, but HDF5's own size check can wrap: it wrote
  // class_names of 2^61 + 3 strings, which the readers tried to allocate (found by
  // fuzz/fuzz_dataset_file.cpp).
  const size_t value_bytes = std::max<size_t>(1, H5Tget_size(a.type.get()));
  if (static_cast<uint64_t>(a.points) > file_bytes_ / value_bytes)
    throw DataError(subject(name) + " claims " + std::to_string(a.points) + " values of " +
                    std::to_string(value_bytes) + " bytes, more than the file holds");
}

std::string AttributeReader::subject(const char* name) const {
  return context_ + "attribute '" + name + "'" +
         (object_name_.empty() ? std::string() : " of " + object_name_);
}

std::string fixed_string_buffer(hid_t type, hid_t space, const std::string& what,
                                uint64_t file_bytes) {
  if (H5Tget_class(type) != H5T_STRING || H5_CHECK(H5Tis_variable_str(type)) > 0)
    throw DataError(what + " is not a fixed-length string");
  const H5S_class_t space_class = H5Sget_simple_extent_type(space);
  if (space_class == H5S_NULL) return "";
  if (space_class != H5S_SCALAR) throw DataError(what + " is not a single string");
  return std::string(checked_bytes(H5Tget_size(type), 1, file_bytes, what), '\0');
}

// --- Writing -------------------------------------------------------------------------------

namespace {

void write_scalar_attribute(hid_t object, const char* name, hid_t file_type, hid_t memory_type,
                            const void* value) {
  Dataspace space(H5_CHECK(H5Screate(H5S_SCALAR)));
  Attribute attribute(
      H5_CHECK(H5Acreate2(object, name, file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT)));
  H5_CHECK(H5Awrite(attribute.get(), memory_type, value));
}

}  // namespace

void write_integer_attribute(hid_t object, const char* name, int64_t value) {
  write_scalar_attribute(object, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &value);
}

void write_double_attribute(hid_t object, const char* name, double value) {
  write_scalar_attribute(object, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &value);
}

void write_floats_attribute(hid_t object, const char* name, const std::vector<float>& values) {
  const hsize_t count = values.size();
  Dataspace space(H5_CHECK(H5Screate_simple(1, &count, nullptr)));
  Attribute attribute(H5_CHECK(
      H5Acreate2(object, name, H5T_IEEE_F32LE, space.get(), H5P_DEFAULT, H5P_DEFAULT)));
  H5_CHECK(H5Awrite(attribute.get(), H5T_NATIVE_FLOAT, values.data()));
}

void write_variable_strings_attribute(hid_t object, const char* name,
                                      const std::vector<std::string>& values, bool scalar) {
  Type type(H5_CHECK(H5Tcopy(H5T_C_S1)));
  H5_CHECK(H5Tset_size(type.get(), H5T_VARIABLE));
  H5_CHECK(H5Tset_cset(type.get(), H5T_CSET_UTF8));
  const hsize_t count = values.size();
  Dataspace space(H5_CHECK(scalar ? H5Screate(H5S_SCALAR) : H5Screate_simple(1, &count, nullptr)));
  Attribute attribute(
      H5_CHECK(H5Acreate2(object, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT)));
  std::vector<const char*> pointers;
  for (const std::string& value : values) pointers.push_back(value.c_str());
  H5_CHECK(H5Awrite(attribute.get(), type.get(), pointers.data()));
}

void write_fixed_string_attribute(hid_t object, const char* name, const std::string& value) {
  const Type type = fixed_string_type(value.size());
  const Dataspace space = fixed_string_space(value);
  Attribute attribute(
      H5_CHECK(H5Acreate2(object, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT)));
  if (!value.empty()) H5_CHECK(H5Awrite(attribute.get(), type.get(), value.data()));
}

Type fixed_string_type(size_t bytes) {
  Type type(H5_CHECK(H5Tcopy(H5T_C_S1)));
  H5_CHECK(H5Tset_size(type.get(), std::max<size_t>(bytes, 1)));
  H5_CHECK(H5Tset_strpad(type.get(), H5T_STR_NULLPAD));
  H5_CHECK(H5Tset_cset(type.get(), H5T_CSET_UTF8));
  return type;
}

Dataspace fixed_string_space(const std::string& value) {
  return Dataspace(H5_CHECK(H5Screate(value.empty() ? H5S_NULL : H5S_SCALAR)));
}

}  // namespace hpc_train::h5
