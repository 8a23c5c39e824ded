# Fuzzing (label fuzz): every parser of bytes from outside has a libFuzzer target in fuzz/ (IDX and
# CIFAR-10 converters, dataset file, checkpoint, safetensors header, DeepSpeed JSON, INI config,
# the zip of a TorchScript file, numpy .npz files, the CIFAR-10 python pickles, the JPEG/PNG
# decoder of convert imagefolder, the shard index),
# built by clang with AddressSanitizer and UndefinedBehaviorSanitizer as a project of its own.
# fuzz_build configures and builds it into build/fuzz (a fixture, so `ctest -L fuzz` or `-R
# fuzz_idx` builds first); then each target runs as its own test, a fixed count of inputs, over
# its committed seed corpus (fuzz/corpus/<target>/, read only; new inputs go to
# build/fuzz/work/<target>/corpus). A crash, a sanitizer report, a leak, an allocation over
# 128 MiB, an input that takes over 25 s or an exception other than hpc_train::Error
# (fuzz/fuzz_support.h, Note [What a finding is]) fails the test; libFuzzer saves the input as
# build/fuzz/work/<target>/crash-* (or leak-*, oom-*, timeout-*). To rerun one input or fuzz longer
# by hand, see docs/install.md, "Tests and fuzzing".
# A fixed seed and a fixed number of executions per target: the same inputs every run, so that a
# CI failure repeats on any machine and a green run is not a lucky draw (a time limit with a fixed
# seed still ran a different count of inputs on a faster machine, and CI found there what the
# slower one had not reached). Each count is about a minute on 2 cores; HPC_TRAIN_FUZZ_SECONDS
# only caps a slow machine. Fuzz longer, or with other seeds, by hand (docs/install.md).
set(HPC_TRAIN_FUZZ_SEED 1 CACHE STRING "libFuzzer -seed of the fuzz tests")
set(HPC_TRAIN_FUZZ_SECONDS 300 CACHE STRING "At most this long each fuzz target runs, seconds")
set(HPC_TRAIN_FUZZ_RUNS_idx 250000)
set(HPC_TRAIN_FUZZ_RUNS_cifar10 135000)
set(HPC_TRAIN_FUZZ_RUNS_dataset_file 84000)
set(HPC_TRAIN_FUZZ_RUNS_checkpoint 87000)
set(HPC_TRAIN_FUZZ_RUNS_safetensors 196000)
set(HPC_TRAIN_FUZZ_RUNS_deepspeed_config 140000)
set(HPC_TRAIN_FUZZ_RUNS_config_ini 59000)
set(HPC_TRAIN_FUZZ_RUNS_torchscript_file 40000)
set(HPC_TRAIN_FUZZ_RUNS_npz 200000)
set(HPC_TRAIN_FUZZ_RUNS_cifar10_python 25000)
set(HPC_TRAIN_FUZZ_RUNS_shard_index 900000)
set(HPC_TRAIN_FUZZ_RUNS_image_decode 150000)
set(HPC_TRAIN_FUZZ_TARGETS idx cifar10 dataset_file checkpoint safetensors deepspeed_config
    config_ini torchscript_file npz cifar10_python shard_index)
# The JPEG/PNG decoder of convert imagefolder exists only where CMake found libjpeg and libpng.
if(HPC_TRAIN_IMAGE_DECODING)
  list(APPEND HPC_TRAIN_FUZZ_TARGETS image_decode)
endif()

find_program(HPC_TRAIN_FUZZ_CXX NAMES clang++ clang++-19 clang++-18 clang++-17 clang++-16
             clang++-15 clang++-14)
if(NOT HPC_TRAIN_FUZZ_CXX)
  # Not a failure: a machine without clang (the GPU machine) still runs every other test.
  # run.sh installs clang, so CI always fuzzes.
  add_test(NAME fuzz_unavailable COMMAND ${CMAKE_COMMAND} -E echo
    "The fuzz targets need clang with libFuzzer: apt-get install clang libclang-rt-dev")
  set_tests_properties(fuzz_unavailable PROPERTIES LABELS fuzz SKIP_REGULAR_EXPRESSION "need clang")
  return()
endif()
string(REGEX REPLACE "clang\\+\\+([^/]*)$" "clang\\1" HPC_TRAIN_FUZZ_CC "${HPC_TRAIN_FUZZ_CXX}")

set(fuzz_binary_dir ${CMAKE_BINARY_DIR}/fuzz)
add_test(NAME fuzz_build COMMAND ${CMAKE_COMMAND}
  -DSOURCE_DIR=${PROJECT_SOURCE_DIR}/fuzz
  -DBINARY_DIR=${fuzz_binary_dir}
  -DCXX=${HPC_TRAIN_FUZZ_CXX}
  -DCC=${HPC_TRAIN_FUZZ_CC}
  -DLAUNCHER=${HPC_TRAIN_CCACHE}
  "-DCORE_SOURCES=$<JOIN:$<TARGET_PROPERTY:hpc_train_core,SOURCES>,|>"
  "-DTARGETS=$<JOIN:${HPC_TRAIN_FUZZ_TARGETS},|>"
  -P ${PROJECT_SOURCE_DIR}/fuzz/build.cmake)
# Configuring and building 20-odd instrumented files: about 45 s on 2 cores without ccache.
set_tests_properties(fuzz_build PROPERTIES TIMEOUT 600 LABELS fuzz FIXTURES_SETUP fuzzers)

foreach(target IN LISTS HPC_TRAIN_FUZZ_TARGETS)
  set(work ${fuzz_binary_dir}/work/${target})
  add_test(NAME fuzz_${target} COMMAND ${fuzz_binary_dir}/fuzz_${target}
    -seed=${HPC_TRAIN_FUZZ_SEED} -runs=${HPC_TRAIN_FUZZ_RUNS_${target}}
    -max_total_time=${HPC_TRAIN_FUZZ_SECONDS} -timeout=25 -rss_limit_mb=2048
    -malloc_limit_mb=128 -print_final_stats=1 -artifact_prefix=${work}/
    ${work}/corpus ${PROJECT_SOURCE_DIR}/fuzz/corpus/${target})
  math(EXPR timeout "${HPC_TRAIN_FUZZ_SECONDS} + 90")
  # TMPDIR: the targets' scratch files (fuzz_support.h) stay inside the build tree.
  set_tests_properties(fuzz_${target} PROPERTIES TIMEOUT ${timeout} LABELS fuzz
    FIXTURES_REQUIRED fuzzers WORKING_DIRECTORY ${work}
    ENVIRONMENT "TMPDIR=${work};UBSAN_OPTIONS=print_stacktrace=1")
endforeach()
