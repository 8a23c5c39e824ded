// Inputs of the HDF5 fuzz targets (dataset file, checkpoint): recipes for HDF5 files.
//
// Note [HDF5 recipes]: these targets do not mutate an HDF5 file's bytes. HDF5 1.10 does not
// survive corrupted files: mutated seeds crashed it within a second (a heap overflow in
// H5HG_read while H5Aread converted a variable-length string attribute) and leaked its own
// metadata-cache entries on object headers with a bad checksum, inside the library, where the
// parsers cannot help it and where every run would stop. The input is instead a recipe: a list
// of objects (groups, datasets, attributes, soft links) with their types, shapes, layouts and
// values, which build_hdf5_file makes into a file through the HDF5 API before the parser reads
// it. So HDF5 only reads files that it wrote itself, and every mix of missing, extra, mistyped,
// misshaped and odd-valued objects reaches the parser's own checks.
//
// Recipe (little-endian; it ends at the first incomplete op, after kMaxOps ops at most):
//   op    = code:u8 ...; code % 4 selects
//           0 group      path:str flags:u8        flags bit 0: track link creation order
//           1 dataset    path:str value layout:u8 layout % 3: contiguous, chunked, compact;
//                                                 layout bit 2: deflate (chunked only)
//           2 attribute  path:str name:str value  on the object at path ("/" the root group)
//           3 soft link  path:str target:str
//   str   = length:u8 bytes
//   value = type:u8 [size:u8, fixed strings] space:u8 dims:u64[rank] bytes:str16
//           type % kTypeCount: see TypeCode in hdf5_recipe.cpp (integers, floats of both byte
//           orders, fixed and variable-length strings, opaque, the CRC-32 of a dataset, and a
//           16-byte integer);
//           space >> 6: 0 simple of rank (space & 7) % 5, 1 scalar, 2 null
//   str16 = length:u16 bytes; the element bytes, repeated to fill the shape (variable-length
//           strings: the '\0'-separated strings, repeated). Shapes over kMaxDataBytes stay
//           unwritten (HDF5 gives the fill value when they are read).
//
// Parents of a path are created as needed. An op that HDF5 refuses (a name given twice, a chunk
// larger than a fixed dimension, ...) is left out; the file holds the rest.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace hpc_train::fuzz {

// Writes the file that `recipe` describes to `path` (replacing it).
void build_hdf5_file(const uint8_t* recipe, size_t size, const std::string& path);

// The recipe that rebuilds the HDF5 file at `path` (its groups, datasets, attributes and soft
// links, in creation order where the file tracks it): the seeds of the HDF5 targets are the
// recipes of files written by the project's own writers (make_seeds.cpp). An attribute named
// crc32 on a dataset, whose value is that dataset's CRC-32, becomes a CRC-32 attribute, so that
// it stays right when the fuzzer changes the data.
std::string recipe_of_hdf5_file(const std::string& path);

}  // namespace hpc_train::fuzz
