// A restricted reader of Python pickles, for exactly what the CIFAR-10 "python version"
// (cifar-10-batches-py) holds: dicts of bytes/str keys, lists of ints and strings, and numpy
// arrays. Protocol 2 as Python 2's cPickle wrote the published files, and protocols 3-5 as
// Python 3's pickle.dump writes them. Nothing is executed: the only globals recognised are
// numpy's array reconstruction (numpy.core.multiarray._reconstruct, numpy.ndarray, numpy.dtype,
// numpy.core.numeric._frombuffer; numpy._core.* for numpy 2) and _codecs.encode (how Python 3
// pickles bytes at protocol 2); any other global or opcode is a DataError naming it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

namespace hpc_train {

// One value of a pickle. Containers refer to their items by pointer into the owning Pickle,
// so that a value shared through the memo (or put inside itself) is one value, freed once.
struct PickleValue {
  enum class Kind { kNone, kBool, kInt, kBytes, kText, kList, kTuple, kDict, kGlobal, kDtype, kArray };
  Kind kind = Kind::kNone;
  int64_t integer = 0;  // kBool, kInt
  // kBytes: the bytes; kText: UTF-8; kGlobal: "module.name"; kDtype: its name ("u1", "<i8").
  std::string bytes;
  // kList, kTuple: the items; kDict: key, value, key, value, ...
  std::vector<const PickleValue*> items;
  // kArray: numpy array, C order (a Fortran-ordered one is refused).
  std::vector<int64_t> shape;
  std::string dtype;       // numpy's dtype name, e.g. "u1"
  std::string array_data;  // the raw values

  bool is_string() const { return kind == Kind::kBytes || kind == Kind::kText; }
  // A dict's value under the bytes or str key `key`; nullptr when absent.
  const PickleValue* find(const std::string& key) const;
};

const char* pickle_kind_name(PickleValue::Kind kind);

// A parsed pickle: its values and the one STOP returned.
struct Pickle {
  std::deque<PickleValue> values;
  const PickleValue* root = nullptr;
};

// Parses `size` bytes of a pickle. Throws DataError prefixed with `where` (the file) for an
// opcode or global outside the set above (naming it and its byte offset), a truncated pickle,
// malformed arguments (a REDUCE of the wrong arguments, an array whose data does not fill its
// shape), and nesting or counts beyond what such a file holds.
Pickle parse_pickle(const std::string& where, const uint8_t* data, size_t size);

}  // namespace hpc_train
