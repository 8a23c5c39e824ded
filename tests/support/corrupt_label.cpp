// corrupt_label FILE.h5 SPLIT INDEX VALUE: overwrites one label in place, bypassing every
// check of the project's own writer, to test how training reacts to a bad file.
#include <hdf5.h>

#include <cstdio>
#include <cstdlib>
#include <string>

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: corrupt_label FILE.h5 train|test INDEX VALUE\n");
    return 2;
  }
  const hid_t file = H5Fopen(argv[1], H5F_ACC_RDWR, H5P_DEFAULT);
  if (file < 0) return 1;
  const std::string name = std::string("/") + argv[2] + "/labels";
  const hid_t dataset = H5Dopen2(file, name.c_str(), H5P_DEFAULT);
  const hid_t space = H5Dget_space(dataset);
  const hsize_t index = std::strtoull(argv[3], nullptr, 10);
  const hsize_t one = 1;
  H5Sselect_hyperslab(space, H5S_SELECT_SET, &index, nullptr, &one, nullptr);
  const hid_t memory = H5Screate_simple(1, &one, nullptr);
  const long long value = std::strtoll(argv[4], nullptr, 10);
  const herr_t status = H5Dwrite(dataset, H5T_NATIVE_LLONG, memory, space, H5P_DEFAULT, &value);
  H5Sclose(memory);
  H5Sclose(space);
  H5Dclose(dataset);
  H5Fclose(file);
  return status < 0 ? 1 : 0;
}
