// edit_dataset: changes a dataset file in place with the plain HDF5 API, bypassing every check
// of the project's own writer, to test how hpc_train reacts to a bad file.
//   edit_dataset label FILE.h5 train|test INDEX VALUE   one label
//   edit_dataset floats FILE.h5 NAME VALUE...           a float attribute of the root group
//                                                       (e.g. std 0, mean nan)
//   edit_dataset image-shape FILE.h5 C H W              the attributes channels, height, width
//       and both splits' images, as chunked datasets of N x C x H x W that are never written:
//       HDF5 stores no data for them, so a small file declares samples of any size
//   edit_dataset damage-image FILE.h5 train|test INDEX  the split's images rewritten with
//       Fletcher-32 checksums per chunk, then one byte of the chunk that holds sample INDEX
//       flipped: the file opens, and reading that chunk fails
#include <hdf5.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

bool set_label(hid_t file, const std::string& split, hsize_t index, long long value) {
  const std::string name = "/" + split + "/labels";
  const hid_t dataset = H5Dopen2(file, name.c_str(), H5P_DEFAULT);
  if (dataset < 0) return false;
  const hid_t space = H5Dget_space(dataset);
  const hsize_t one = 1;
  H5Sselect_hyperslab(space, H5S_SELECT_SET, &index, nullptr, &one, nullptr);
  const hid_t memory = H5Screate_simple(1, &one, nullptr);
  const herr_t status = H5Dwrite(dataset, H5T_NATIVE_LLONG, memory, space, H5P_DEFAULT, &value);
  H5Sclose(memory);
  H5Sclose(space);
  H5Dclose(dataset);
  return status >= 0;
}

bool set_floats(hid_t file, const char* name, const std::vector<float>& values) {
  if (H5Aexists(file, name) > 0 && H5Adelete(file, name) < 0) return false;
  const hsize_t count = values.size();
  const hid_t space = H5Screate_simple(1, &count, nullptr);
  const hid_t attribute = H5Acreate2(file, name, H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT);
  const herr_t status =
      attribute < 0 ? -1 : H5Awrite(attribute, H5T_NATIVE_FLOAT, values.data());
  if (attribute >= 0) H5Aclose(attribute);
  H5Sclose(space);
  return status >= 0;
}

bool set_integer(hid_t file, const char* name, long long value) {
  if (H5Aexists(file, name) > 0 && H5Adelete(file, name) < 0) return false;
  const hid_t space = H5Screate(H5S_SCALAR);
  const hid_t attribute = H5Acreate2(file, name, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT);
  const herr_t status = attribute < 0 ? -1 : H5Awrite(attribute, H5T_NATIVE_LLONG, &value);
  if (attribute >= 0) H5Aclose(attribute);
  H5Sclose(space);
  return status >= 0;
}

// /SPLIT/images becomes an unwritten chunked dataset of N x C x H x W (N as before).
bool set_image_shape(hid_t file, const std::string& split, hsize_t c, hsize_t h, hsize_t w) {
  const std::string name = "/" + split + "/images";
  const hid_t old = H5Dopen2(file, name.c_str(), H5P_DEFAULT);
  if (old < 0) return false;
  const hid_t old_space = H5Dget_space(old);
  hsize_t dims[4] = {};
  H5Sget_simple_extent_dims(old_space, dims, nullptr);
  H5Sclose(old_space);
  H5Dclose(old);
  if (H5Ldelete(file, name.c_str(), H5P_DEFAULT) < 0) return false;
  dims[1] = c;
  dims[2] = h;
  dims[3] = w;
  const hid_t space = H5Screate_simple(4, dims, nullptr);
  const hsize_t chunk[4] = {1, 1, 1, w};
  const hid_t layout = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_chunk(layout, 4, chunk);
  const hid_t dataset =
      H5Dcreate2(file, name.c_str(), H5T_STD_U8LE, space, H5P_DEFAULT, layout, H5P_DEFAULT);
  H5Pclose(layout);
  H5Sclose(space);
  if (dataset < 0) return false;
  H5Dclose(dataset);
  return true;
}

// The split's images again, chunked by 16 samples with a Fletcher-32 checksum per chunk; then
// one byte in the middle of the chunk that holds sample `index` flipped, in the file itself.
bool damage_image(const char* path, const std::string& split, hsize_t index) {
  const hid_t file = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
  if (file < 0) return false;
  const std::string name = "/" + split + "/images";
  const hid_t old = H5Dopen2(file, name.c_str(), H5P_DEFAULT);
  if (old < 0) return false;
  const hid_t space = H5Dget_space(old);
  hsize_t dims[4] = {};
  H5Sget_simple_extent_dims(space, dims, nullptr);
  std::vector<unsigned char> images(dims[0] * dims[1] * dims[2] * dims[3]);
  H5Dread(old, H5T_NATIVE_UCHAR, H5S_ALL, H5S_ALL, H5P_DEFAULT, images.data());
  H5Dclose(old);
  H5Ldelete(file, name.c_str(), H5P_DEFAULT);
  const hsize_t chunk[4] = {16, dims[1], dims[2], dims[3]};
  const hid_t layout = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_chunk(layout, 4, chunk);
  H5Pset_fletcher32(layout);
  const hid_t dataset =
      H5Dcreate2(file, name.c_str(), H5T_STD_U8LE, space, H5P_DEFAULT, layout, H5P_DEFAULT);
  H5Pclose(layout);
  H5Sclose(space);
  if (dataset < 0) return false;
  H5Dwrite(dataset, H5T_NATIVE_UCHAR, H5S_ALL, H5S_ALL, H5P_DEFAULT, images.data());
  const hsize_t offset[4] = {index / 16 * 16, 0, 0, 0};
  haddr_t address = HADDR_UNDEF;
  hsize_t bytes = 0;
  const herr_t found = H5Dget_chunk_info_by_coord(dataset, offset, nullptr, &address, &bytes);
  H5Dclose(dataset);
  H5Fclose(file);
  if (found < 0 || address == HADDR_UNDEF || bytes == 0) return false;
  std::FILE* raw = std::fopen(path, "r+b");
  if (!raw) return false;
  const long at = static_cast<long>(address + bytes / 2);
  const bool flipped = std::fseek(raw, at, SEEK_SET) == 0 && [&] {
    const int byte = std::fgetc(raw);
    return byte != EOF && std::fseek(raw, at, SEEK_SET) == 0 && std::fputc(byte ^ 0x40, raw) != EOF;
  }();
  return std::fclose(raw) == 0 && flipped;
}

int usage() {
  std::fprintf(stderr,
               "usage: edit_dataset label FILE.h5 train|test INDEX VALUE\n"
               "       edit_dataset floats FILE.h5 NAME VALUE...\n"
               "       edit_dataset image-shape FILE.h5 C H W\n"
               "       edit_dataset damage-image FILE.h5 train|test INDEX\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) return usage();
  const std::string command = argv[1];
  if (command == "damage-image") {
    if (argc != 5) return usage();
    return damage_image(argv[2], argv[3], std::strtoull(argv[4], nullptr, 10)) ? 0 : 1;
  }
  const hid_t file = H5Fopen(argv[2], H5F_ACC_RDWR, H5P_DEFAULT);
  if (file < 0) return 1;
  bool ok = false;
  if (command == "label" && argc == 6) {
    ok = set_label(file, argv[3], std::strtoull(argv[4], nullptr, 10),
                   std::strtoll(argv[5], nullptr, 10));
  } else if (command == "floats" && argc >= 4) {
    std::vector<float> values;
    for (int i = 4; i < argc; ++i) values.push_back(std::strtof(argv[i], nullptr));
    ok = set_floats(file, argv[3], values);
  } else if (command == "image-shape" && argc == 6) {
    const long long c = std::strtoll(argv[3], nullptr, 10);
    const long long h = std::strtoll(argv[4], nullptr, 10);
    const long long w = std::strtoll(argv[5], nullptr, 10);
    ok = set_integer(file, "channels", c) && set_integer(file, "height", h) &&
         set_integer(file, "width", w) &&
         set_floats(file, "mean", std::vector<float>(static_cast<size_t>(c), 0.5f)) &&
         set_floats(file, "std", std::vector<float>(static_cast<size_t>(c), 0.25f)) &&
         set_image_shape(file, "train", c, h, w) && set_image_shape(file, "test", c, h, w);
  } else {
    H5Fclose(file);
    return usage();
  }
  H5Fclose(file);
  return ok ? 0 : 1;
}
