#include "io/hdf5_attributes.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "hpc_train/error.h"

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
  Type memory_type(H5_CHECK(H5Tcopy(H5T_C_S1)));
  H5_CHECK(H5Tset_cset(memory_type.get(), H5Tget_cset(a.type.get())));
  if (H5_CHECK(H5Tis_variable_str(a.type.get())) > 0) {
    H5_CHECK(H5Tset_size(memory_type.get(), H5T_VARIABLE));
    std::vector<char*> pointers(count, nullptr);
    H5_CHECK(H5Aread(a.attribute.get(), memory_type.get(), pointers.data()));
    for (char* pointer : pointers) {
      values.emplace_back(pointer ? pointer : "");
      H5free_memory(pointer);  // HDF5 allocated it; free it with HDF5's allocator
    }
  } else {
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
