# Finds every dependency once, with a message that says what to install when one is missing.
# Debian/Ubuntu package names are given; on a cluster, `module load` the equivalent and CMake
# finds it through CMAKE_PREFIX_PATH.

function(hpc_train_require found what hint)
  if(NOT ${found})
    message(FATAL_ERROR "hpc_train needs ${what}. ${hint}")
  endif()
endfunction()

find_package(MPI COMPONENTS C CXX)
hpc_train_require(MPI_CXX_FOUND "MPI (C and C++)"
  "Install libopenmpi-dev and openmpi-bin, or load your site's MPI module.")

# Parallel HDF5 where there is one (collective file access over MPI-IO); serial HDF5 works too.
set(HDF5_PREFER_PARALLEL ON)
find_package(HDF5 COMPONENTS C)
hpc_train_require(HDF5_FOUND "HDF5 (C library)"
  "Install libhdf5-openmpi-dev (parallel) or libhdf5-dev (serial), or set HDF5_ROOT.")
include(${CMAKE_CURRENT_LIST_DIR}/HpcTrainHdf5Target.cmake)

find_package(Boost 1.71 COMPONENTS program_options)
hpc_train_require(Boost_FOUND "Boost.ProgramOptions >= 1.71"
  "Install libboost-program-options-dev, or set Boost_DIR / BOOST_ROOT.")

find_package(nlohmann_json 3.9)
hpc_train_require(nlohmann_json_FOUND "nlohmann-json >= 3.9 (header only)"
  "Install nlohmann-json3-dev, or set nlohmann_json_DIR.")

find_package(ZLIB)
hpc_train_require(ZLIB_FOUND "zlib (reads .gz IDX files)" "Install zlib1g-dev.")

find_package(Torch QUIET)
hpc_train_require(Torch_FOUND "LibTorch"
  "Install libtorch-dev (CPU), or point Torch_DIR at a LibTorch with CUDA, e.g. the Python wheel's: python3 -c 'import torch; print(torch.utils.cmake_prefix_path)'.")

find_package(Threads REQUIRED)

# Optional: libjpeg(-turbo) and libpng decode the images of `convert imagefolder`. Without either
# the build still succeeds and that converter says what is missing (image_decode_none.cpp).
find_package(JPEG QUIET)
find_package(PNG QUIET)
if(JPEG_FOUND AND PNG_FOUND)
  set(HPC_TRAIN_IMAGE_DECODING ON)
  message(STATUS "hpc_train: convert imagefolder decodes with ${JPEG_LIBRARIES} and ${PNG_LIBRARIES}")
else()
  set(HPC_TRAIN_IMAGE_DECODING OFF)
  message(STATUS "hpc_train: no libjpeg/libpng headers (libjpeg62-turbo-dev, libpng-dev): "
    "convert imagefolder is left out of this build")
endif()
