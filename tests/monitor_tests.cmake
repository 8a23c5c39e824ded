# GPU monitoring, MFU and FLOP counts; the communication watchdog's stalls (collectives, and on
# the GPU graph replays). The GPU halves of test_gpu_monitor.cpp and test_comm.cpp
# (HPC_TRAIN_TEST_ON_GPU) run only in the GPU build, on one rank with one GPU, under the label gpu.
hpc_train_add_test(NAME test_gpu_monitor SOURCES test_gpu_monitor.cpp RANKS 1 3
                   LIBS hpc_train_engine)

# Each case stalls for the 2 s timeout, then MPI_Abort ends the job.
hpc_train_add_script_test(NAME test_comm_timeout SCRIPT test_comm_timeout.sh TIMEOUT 90)
set_property(TEST test_comm_timeout APPEND PROPERTY ENVIRONMENT "TEST_COMM=$<TARGET_FILE:test_comm>")

if(HPC_TRAIN_GPU_BUILD)
  hpc_train_add_test(NAME test_gpu_monitor_gpu SOURCES test_gpu_monitor.cpp RANKS 1
                     LIBS hpc_train_engine LABELS gpu)
  target_compile_definitions(test_gpu_monitor_gpu PRIVATE HPC_TRAIN_TEST_ON_GPU=1)
  hpc_train_add_test(NAME test_comm_gpu SOURCES test_comm.cpp RANKS 1
                     LIBS hpc_train_engine LABELS gpu)
  target_compile_definitions(test_comm_gpu PRIVATE HPC_TRAIN_TEST_ON_GPU=1)
  target_include_directories(test_comm_gpu PRIVATE ${PROJECT_SOURCE_DIR}/src)  # comm_backend.h
  hpc_train_add_script_test(NAME test_comm_timeout_gpu SCRIPT test_comm_timeout.sh TIMEOUT 90
                            LABELS gpu)
  set_property(TEST test_comm_timeout_gpu APPEND PROPERTY ENVIRONMENT
               "TEST_COMM=$<TARGET_FILE:test_comm_gpu>;COMM_TIMEOUT_BACKEND=nccl")
  # hpc_train with CUDA-graph replays: healthy replays never fire; a replay held up on the GPU
  # (the test-only fault switch HPC_TRAIN_TEST_STALL_REPLAY_RANK) ends the job, naming it.
  hpc_train_add_script_test(NAME test_graph_replay_timeout SCRIPT test_graph_replay_timeout.sh
                            TIMEOUT 300 LABELS gpu)
endif()

# The monitors' writers (TensorBoard event files, DeepSpeed's CSV layout) on known bytes.
hpc_train_add_test(NAME test_tensorboard_events SOURCES test_tensorboard_events.cpp RANKS 1
                   LIBS hpc_train_core TIMEOUT 60)
# A real run's TensorBoard and CSV monitor files against metrics.jsonl, read by an independent
# reader (Python with python3-protobuf; skipped where that is missing), and DeepSpeed's monitor
# blocks.
hpc_train_add_script_test(NAME test_tensorboard_run SCRIPT test_tensorboard_run.sh TIMEOUT 400)
set_tests_properties(test_tensorboard_run PROPERTIES SKIP_RETURN_CODE 77)

# Note [ETA]'s arithmetic (pure functions); test_end_to_end checks a real run's lines.
hpc_train_add_test(NAME test_eta SOURCES test_eta.cpp RANKS 1 LIBS hpc_train_engine TIMEOUT 60)

# hpc_train_report on a real short CPU run (tests/test_report.sh); skipped where no python3 has
# matplotlib and PIL (run.sh installs python3-matplotlib python3-pil).
hpc_train_add_script_test(NAME test_report SCRIPT test_report.sh TIMEOUT 400)
set_tests_properties(test_report PROPERTIES SKIP_RETURN_CODE 77)
set_property(TEST test_report APPEND PROPERTY ENVIRONMENT
             "HPC_TRAIN_REPORT=${PROJECT_BINARY_DIR}/hpc_train_report")

# The /proc/self/io counters behind the storage read figures (parsing, unknown, JSON);
# test_end_to_end checks a real run's figures.
hpc_train_add_test(NAME test_storage_io SOURCES test_storage_io.cpp RANKS 1 LIBS hpc_train_core
                   TIMEOUT 60)
