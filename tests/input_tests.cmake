# Tests of the input on the device (device_input.h): normalisation, augmentation, the two-phase
# staging, static buffers and the resident split. They run on the GPU when LibTorch sees one and
# on the CPU otherwise; in a GPU build, test_device_input_gpu insists on the GPU
# (HPC_TRAIN_TEST_DEVICE=cuda: fails where none is visible) and compares it with the CPU.
hpc_train_add_test(NAME test_device_input SOURCES test_device_input.cpp RANKS 1 TIMEOUT 120
                   LIBS hpc_train_engine hpc_train_test_support)
if(HPC_TRAIN_GPU_BUILD)
  add_test(NAME test_device_input_gpu
    COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 1 $<TARGET_FILE:test_device_input>)
  set_tests_properties(test_device_input_gpu PROPERTIES TIMEOUT 120 LABELS gpu
    ENVIRONMENT "${HPC_TRAIN_TEST_ENV};HPC_TRAIN_TEST_DEVICE=cuda")
endif()
