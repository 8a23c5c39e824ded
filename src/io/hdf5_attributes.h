// HDF5 attributes (private): the one reader and the writers of the attributes of dataset files
// and checkpoints, and the fixed-length strings that checkpoints store. Every function here makes
// HDF5 calls: the caller holds h5::Lock (Note [HDF5 lock]).
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <string>
#include <vector>

#include "io/hdf5_util.h"

namespace hpc_train::h5 {

// "8-bit unsigned integer", "32-bit float", "string", ... for messages about a stored type.
std::string describe_type(hid_t type);

// elements x element_bytes, refused (DataError naming `what`) when it cannot fit in a file of
// `file_bytes` bytes: a corrupt shape, which must not size an allocation.
size_t checked_bytes(uint64_t elements, size_t element_bytes, uint64_t file_bytes,
                     const std::string& what);

// --- Reading -------------------------------------------------------------------------------

// Reads the attributes of one object (a group or a dataset), each checked for its class and
// count before it is read, and for its size against the file's before anything is allocated for
// its values (a corrupt dataspace can claim 2^61 strings). Failures are DataErrors:
//   "<context>missing attribute 'x' on <object>"
//   "<context>attribute 'x' of <object> is not one integer" (and so on for each reader)
// `context` starts every message: "data.h5: ", or "" where the caller puts the file's name in
// front. `object` is the object's HDF5 path ("/training"), or "" for the root group of a file
// that keeps all its attributes there (a dataset file); its messages then say "on the root
// group" and name the attribute alone.
class AttributeReader {
 public:
  AttributeReader(hid_t object, std::string object_name, std::string context,
                  uint64_t file_bytes);

  bool has(const char* name) const;
  // One integer of any width and sign.
  int64_t integer(const char* name) const;
  // One integer that fits in an int.
  int small_integer(const char* name) const;
  // One float of any width.
  double real(const char* name) const;
  // Numbers (integers or floats), any count, as floats.
  std::vector<float> floats(const char* name) const;
  // Variable-length (what h5py writes for str) or fixed-length strings, scalar or 1-D.
  std::vector<std::string> strings(const char* name) const;
  // One fixed-length string as write_fixed_string_attribute stores it ("" for a null
  // dataspace); nothing else.
  std::string fixed_string(const char* name) const;

 private:
  struct Opened {
    Attribute attribute;
    Type type;
    Dataspace space;
    hssize_t points = 0;
  };

  Opened open(const char* name) const;
  // Refuses an attribute whose values could not fit in the file.
  void check_size(const Opened& opened, const char* name) const;
  // "<context>attribute 'x'", and " of <object>" when the object has a name.
  std::string subject(const char* name) const;

  hid_t object_;
  std::string object_name_;
  std::string context_;
  uint64_t file_bytes_;
};

// The buffer for one fixed-length string (an attribute's or a dataset's) as fixed_string_type and
// fixed_string_space store it: "" for a null dataspace, else the type's size in bytes. Throws a
// DataError naming `what` for any other type or shape.
std::string fixed_string_buffer(hid_t type, hid_t space, const std::string& what,
                                uint64_t file_bytes);

// --- Writing -------------------------------------------------------------------------------

// A scalar 64-bit little-endian signed integer.
void write_integer_attribute(hid_t object, const char* name, int64_t value);
// A scalar 64-bit little-endian float.
void write_double_attribute(hid_t object, const char* name, double value);
// A 1-D array of 32-bit little-endian floats.
void write_floats_attribute(hid_t object, const char* name, const std::vector<float>& values);
// Variable-length UTF-8 strings, as h5py writes a str (`scalar`, one value) or a list of str
// (1-D), so that h5py reads them back as str. See data/README.md.
void write_variable_strings_attribute(hid_t object, const char* name,
                                      const std::vector<std::string>& values, bool scalar);
// One fixed-length UTF-8 string of exactly its bytes (fixed_string_type, fixed_string_space).
void write_fixed_string_attribute(hid_t object, const char* name, const std::string& value);

// A fixed-length string type of exactly `bytes` bytes (at least 1: HDF5 has no empty strings;
// an empty value gets a null dataspace instead).
Type fixed_string_type(size_t bytes);
// Scalar, or null for the empty string.
Dataspace fixed_string_space(const std::string& value);

}  // namespace hpc_train::h5
