# The data part: epoch plan, converters, dataset file and loader, and the hpc_train_data tool.
# The dataset file test runs at 1, 2 and 3 ranks: it opens files collectively over MPI-IO (where
# HDF5 is parallel) and reads from the loader thread while the main thread communicates.
hpc_train_add_test(NAME test_epoch_plan SOURCES test_epoch_plan.cpp RANKS 1 LABELS data
  TIMEOUT 60)
hpc_train_add_test(NAME test_converters SOURCES test_converters.cpp RANKS 1 LABELS data
  TIMEOUT 60)
hpc_train_add_test(NAME test_dataset_file SOURCES test_dataset_file.cpp RANKS 1 2 3 LABELS data
  TIMEOUT 60)
hpc_train_add_script_test(NAME test_data_tool SCRIPT test_data_tool.sh LABELS data TIMEOUT 60)
# inspect on a dataset file damaged in fixed places (truncated, superblock, signatures, datatype
# sizes, bit flips of a fixed seed): exit 1 to 3 naming the file, never a signal or a hang.
hpc_train_add_script_test(NAME test_inspect_damaged SCRIPT test_inspect_damaged.sh LABELS data
  TIMEOUT 300)
# The reader threads that put a batch's reads in flight together (Note [Reads in flight]).
hpc_train_add_test(NAME test_reader_threads SOURCES test_reader_threads.cpp RANKS 1 LABELS data
  TIMEOUT 60)
# The HDF5 attribute reader and writers that dataset files and checkpoints share
# (src/io/hdf5_attributes.h: private, so this test alone sees src/).
hpc_train_add_test(NAME test_hdf5_attributes SOURCES test_hdf5_attributes.cpp RANKS 1
  LABELS data TIMEOUT 60)
target_include_directories(test_hdf5_attributes PRIVATE ${PROJECT_SOURCE_DIR}/src)
# convert npz and convert cifar10-python against files written by numpy and Python's pickle
# (tests/support/source_datasets.py): a python3 that imports numpy and h5py (Debian:
# python3-numpy python3-h5py), the first on the PATH, else Debian's own, which a python3 earlier
# on the PATH (pyenv, a virtual environment) may hide.
set(HPC_TRAIN_NUMPY_PYTHON "" CACHE FILEPATH "Python with numpy and h5py (tests)")
if(NOT HPC_TRAIN_NUMPY_PYTHON)
  foreach(candidate python3 /usr/bin/python3)
    execute_process(COMMAND ${candidate} -c "import numpy, h5py" RESULT_VARIABLE imports
                    OUTPUT_QUIET ERROR_QUIET)
    if(imports EQUAL 0)
      set(HPC_TRAIN_NUMPY_PYTHON ${candidate} CACHE FILEPATH "Python with numpy and h5py (tests)"
          FORCE)
      break()
    endif()
  endforeach()
endif()
hpc_train_add_script_test(NAME test_convert_sources SCRIPT test_convert_sources.sh LABELS data
  TIMEOUT 180)
if(HPC_TRAIN_NUMPY_PYTHON)
  set_property(TEST test_convert_sources APPEND PROPERTY ENVIRONMENT
    "HPC_TRAIN_NUMPY_PYTHON=${HPC_TRAIN_NUMPY_PYTHON}")
endif()

# convert imagefolder against image trees that PIL writes (tests/support/image_folder.py), at 1
# and 3 ranks, then 2 training steps on the file; in a build without libjpeg/libpng, the refusal.
hpc_train_add_script_test(NAME test_convert_imagefolder SCRIPT test_convert_imagefolder.sh
  LABELS data TIMEOUT 300)
set_property(TEST test_convert_imagefolder APPEND PROPERTY ENVIRONMENT
  "HPC_TRAIN_IMAGE_DECODING=${HPC_TRAIN_IMAGE_DECODING}")
if(HPC_TRAIN_NUMPY_PYTHON)
  set_property(TEST test_convert_imagefolder APPEND PROPERTY ENVIRONMENT
    "HPC_TRAIN_NUMPY_PYTHON=${HPC_TRAIN_NUMPY_PYTHON}")
endif()
# Sharded datasets (data/dataset_shards.h): shards read back as their file through an index and a
# pattern, at 1, 2 and 3 ranks and both kinds of file access; the index format; wrong sets.
hpc_train_add_test(NAME test_dataset_shards SOURCES test_dataset_shards.cpp RANKS 1 2 3
  LIBS hpc_train_test_support LABELS data TIMEOUT 60)
# The read-once sample store (data/sample_store.h): the exchange plan routed by hand; at 1, 2 and
# 3 ranks its micro-batches equal the file's (a file and its shards, a resumed epoch, a partial
# last batch), and a share over its limit stops every rank.
hpc_train_add_test(NAME test_sample_store SOURCES test_sample_store.cpp RANKS 1 2 3
  LIBS hpc_train_engine hpc_train_test_support LABELS data TIMEOUT 120)
# Training on shards is training on their file: hpc_train_data shard and inspect; weights and
# losses of the file, a pattern and an index equal at 1, 2 and 3 ranks, resident data on and off,
# resume over shards; wrong sets end every rank with exit 3; shard's memory bounded by a block
# (tests/test_shards_training.sh).
hpc_train_add_script_test(NAME test_shards_training SCRIPT test_shards_training.sh LABELS data
  TIMEOUT 600)
# --data-store memory trains on what --data-store file trains on: weights, losses and sample
# traces equal at 1, 2 and 3 ranks (grad accumulation, partial last batches, shards, --drop-last,
# the INI file), a resume mid-epoch; a share over its limit and bad options end with exit 2.
hpc_train_add_script_test(NAME test_data_store SCRIPT test_data_store.sh LABELS data TIMEOUT 600)
