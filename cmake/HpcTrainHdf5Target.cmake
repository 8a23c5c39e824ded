# HDF5's imported target arrived in CMake 3.19; build one from the FindHDF5 module's variables
# otherwise. Included after find_package(HDF5) by the main build (HpcTrainDependencies.cmake) and
# by the fuzz build (fuzz/CMakeLists.txt), which link HDF5::HDF5 alike.
if(NOT TARGET HDF5::HDF5)
  add_library(HDF5::HDF5 INTERFACE IMPORTED)
  set_target_properties(HDF5::HDF5 PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${HDF5_INCLUDE_DIRS}"
    INTERFACE_LINK_LIBRARIES "${HDF5_C_LIBRARIES}"
    INTERFACE_COMPILE_DEFINITIONS "${HDF5_DEFINITIONS}")
endif()
