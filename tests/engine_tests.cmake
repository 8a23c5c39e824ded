# Tests of the LibTorch parts: communicator, flat storage, optimizer, data-parallel equivalence,
# and the hpc_train executable end to end.
hpc_train_add_test(NAME test_comm SOURCES test_comm.cpp RANKS 1 2 3
                   LIBS hpc_train_engine)
# Note [Naming a lost peer]: which ranks answer on the network when a collective stalls.
hpc_train_add_test(NAME test_peer_probe SOURCES test_peer_probe.cpp RANKS 1 3 TIMEOUT 60)
# Placement: the decision over injected reports (GPUs per task, shared GPUs, two nodes, ranks
# without GPUs), and its agreement over MPI at 1 and 3 ranks.
hpc_train_add_test(NAME test_placement SOURCES test_placement.cpp RANKS 1 3
                   LIBS hpc_train_engine TIMEOUT 60)
# Note [Open MPI's default core binding]: the rule, and mpirun's default binding undone (one rank)
# or kept (two ranks on two cores: their share); then in hpc_train, against a binding chosen.
hpc_train_add_test(NAME test_cpu_binding SOURCES test_cpu_binding.cpp RANKS 1 2 TIMEOUT 60)
hpc_train_add_script_test(NAME test_cpu_binding_run SCRIPT test_cpu_binding.sh TIMEOUT 300)
set_tests_properties(test_cpu_binding_run PROPERTIES SKIP_RETURN_CODE 77)
hpc_train_add_test(NAME test_optimizer SOURCES test_optimizer.cpp test_flat_parameters.cpp
                   test_run_options.cpp test_graphed_step.cpp
                   RANKS 1 LIBS hpc_train_engine)
hpc_train_add_test(NAME test_equivalence SOURCES test_equivalence.cpp RANKS 2 3 TIMEOUT 300
                   LIBS hpc_train_engine hpc_train_test_support)

add_executable(edit_dataset support/edit_dataset.cpp)
target_link_libraries(edit_dataset PRIVATE HDF5::HDF5 MPI::MPI_C)
hpc_train_add_script_test(NAME test_errors SCRIPT test_errors.sh TIMEOUT 420)
set_property(TEST test_errors APPEND PROPERTY ENVIRONMENT "EDIT_DATASET=$<TARGET_FILE:edit_dataset>")
hpc_train_add_script_test(NAME test_end_to_end SCRIPT test_end_to_end.sh TIMEOUT 600)
# --version against what this configure step found (an independent source for each version).
hpc_train_add_script_test(NAME test_version SCRIPT test_version.sh TIMEOUT 180)
set_property(TEST test_version APPEND PROPERTY ENVIRONMENT
  "EXPECT_TORCH_VERSION=${Torch_VERSION}" "EXPECT_BOOST_VERSION=${Boost_VERSION_STRING}"
  "EXPECT_HDF5_VERSION=${HDF5_VERSION}" "EXPECT_HDF5_PARALLEL=${HDF5_IS_PARALLEL}"
  "EXPECT_BUILD_TYPE=${CMAKE_BUILD_TYPE}"
  "EXPECT_GPU_BUILD=${HPC_TRAIN_GPU_BUILD}")

hpc_train_add_test(NAME test_buckets SOURCES test_buckets.cpp RANKS 1)
hpc_train_add_test(NAME test_zero SOURCES test_zero.cpp RANKS 1 2 3 TIMEOUT 300
                   LIBS hpc_train_engine hpc_train_test_support)
hpc_train_add_script_test(NAME test_deepspeed_run SCRIPT test_deepspeed_run.sh TIMEOUT 300)
# Note [Gradient precision]: --grad-accum-dtype fp32 and --comm-dtype fp32 in bf16 and fp16,
# measured against the fp32 run, at 1 and 3 ranks.
hpc_train_add_test(NAME test_gradient_precision SOURCES test_gradient_precision.cpp RANKS 1 3
                   TIMEOUT 300 LIBS hpc_train_engine hpc_train_test_support)

# Our kernels' per-thread work run on the CPU against LibTorch: the fused pooling's (Note [Fused
# pooling]) and the cross-entropy's (Note [Fused cross-entropy]); the GPU build's
# test_fused_kernels runs the kernels. (The input kernel's is in test_device_input.)
hpc_train_add_test(NAME test_kernel_items
                   SOURCES test_fused_pooling_items.cpp test_cross_entropy_items.cpp RANKS 1
                   LIBS hpc_train_engine)

# The fused batch-norm kernels themselves, compiled for the host and run on the CPU under
# support/cuda_emulation.h, against the GPU test's reference: where the CUDA toolkit's headers
# are (their fp16 and bf16 types and vector types; no GPU, no CUDA library).
find_path(HPC_TRAIN_CUDA_HEADERS cuda_bf16.h HINTS ${CUDAToolkit_INCLUDE_DIRS} ENV CUDA_HOME
          PATHS /usr/local/cuda PATH_SUFFIXES include)
if(HPC_TRAIN_CUDA_HEADERS)
  hpc_train_add_test(NAME test_fused_batch_norm_emulated SOURCES test_fused_batch_norm_emulated.cpp
                     RANKS 1 TIMEOUT 300 LIBS hpc_train_engine)
  target_include_directories(test_fused_batch_norm_emulated PRIVATE ${HPC_TRAIN_CUDA_HEADERS})
  # In host code the CUDA headers' __device__ and __forceinline__ are attributes GCC ignores.
  target_compile_options(test_fused_batch_norm_emulated PRIVATE -Wno-attributes)
else()
  message(STATUS "hpc_train: no CUDA headers (cuda_bf16.h), so no test_fused_batch_norm_emulated")
endif()

# The fused optimizer kernels against a float64 reference, fp16 overflow handling and CUDA-graph
# replay, and the fused batch norm's: they need a GPU, so only the GPU build has them (ctest -L gpu).
if(HPC_TRAIN_GPU_BUILD)
  hpc_train_add_test(NAME test_fused_optimizer SOURCES test_fused_optimizer.cpp RANKS 1
                     TIMEOUT 300 LIBS hpc_train_engine LABELS gpu)
  # The fused batch-norm kernels against LibTorch's ops in fp64 (Note [Fused batch norm]).
  hpc_train_add_test(NAME test_fused_batch_norm SOURCES test_fused_batch_norm.cpp RANKS 1
                     TIMEOUT 300 LIBS hpc_train_engine LABELS gpu)
  # The fused pooling and cross-entropy kernels against LibTorch's ops on the GPU.
  hpc_train_add_test(NAME test_fused_kernels
                     SOURCES test_fused_pooling.cpp test_fused_cross_entropy.cpp RANKS 1
                     TIMEOUT 300 LIBS hpc_train_engine LABELS gpu)
  # Note [Failed capture]: a capture that fails half-way through the backward (a test fault)
  # leaves nothing behind; the eager steps that follow end as an eager run does.
  hpc_train_add_script_test(NAME test_capture_failure_gpu SCRIPT test_capture_failure.sh
                            TIMEOUT 300 LABELS gpu)
endif()

# The same equivalence tests on the GPU (ctest -L gpu on the GPU machine): one rank with NCCL,
# three ranks sharing the one GPU through the MPI backend.
if(HPC_TRAIN_GPU_BUILD)
  foreach(case test_zero:1 test_zero:3 test_equivalence:3 test_gradient_precision:1
          test_gradient_precision:3)
    string(REPLACE ":" ";" parts ${case})
    list(GET parts 0 name)
    list(GET parts 1 ranks)
    add_test(NAME ${name}_gpu_np${ranks}
      COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${ranks} --oversubscribe $<TARGET_FILE:${name}>)
    set_tests_properties(${name}_gpu_np${ranks} PROPERTIES TIMEOUT 300 LABELS gpu
      ENVIRONMENT "${HPC_TRAIN_TEST_ENV};HPC_TRAIN_TEST_DEVICE=cuda")
  endforeach()
endif()
# Note [Run length]: the arithmetic alone, then real runs with --grad-accum whose epochs end
# inside an update and whose last update is a partial window.
hpc_train_add_test(NAME test_run_length SOURCES test_run_length.cpp RANKS 1
                   LIBS hpc_train_core TIMEOUT 60)
hpc_train_add_script_test(NAME test_run_length_run SCRIPT test_run_length.sh TIMEOUT 300)
# Note [Ending the job]: one rank failing while the trainer starts ends the job at once.
hpc_train_add_script_test(NAME test_startup_faults SCRIPT test_startup_faults.sh TIMEOUT 300)
# Note [Test hooks]: the test-only environment switches, as their tests set them.
hpc_train_add_test(NAME test_test_hooks SOURCES test_test_hooks.cpp RANKS 1
                   LIBS hpc_train_core TIMEOUT 60)
# Note [Stop agreement]: the stop signal and the checkpoint clock agreed a step late, never waited for.
hpc_train_add_test(NAME test_step_agreement SOURCES test_step_agreement.cpp RANKS 1 3
                   LIBS hpc_train_engine TIMEOUT 60)

# Note [Evaluation sums]: loss, top-1, top-5, per-class accuracy and the confusion matrix against
# references computed with plain loops, at 1 and 3 ranks.
hpc_train_add_test(NAME test_evaluation_sums SOURCES test_evaluation_sums.cpp RANKS 1 3
                   LIBS hpc_train_engine TIMEOUT 120)
# hpc_train evaluate on a trained run's checkpoint at 1 and 3 ranks, its safetensors export and
# the train split; against summary.json, the predictions and torch; its errors; the picture
# of its confusion matrix (hpc_train_report).
hpc_train_add_script_test(NAME test_evaluate SCRIPT test_evaluate.sh TIMEOUT 500)
set_tests_properties(test_evaluate PROPERTIES SKIP_RETURN_CODE 77)
set_property(TEST test_evaluate APPEND PROPERTY ENVIRONMENT
             "HPC_TRAIN_REPORT=${PROJECT_BINARY_DIR}/hpc_train_report")
