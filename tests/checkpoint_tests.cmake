# Checkpoints (torch-free: hpc_train_core and the test support only): the file written
# collectively at 1 and 3 ranks and read back bitwise, every kind of bad file refused with a
# DataError naming it, the newest readable checkpoint found after SIGKILLs at several moments of a
# write, and the weights export of hpc_train_data.
hpc_train_add_test(NAME test_checkpoint SOURCES test_checkpoint.cpp RANKS 1 3
  LIBS hpc_train_core hpc_train_test_support LABELS checkpoint TIMEOUT 60)

# A single-rank program that writes, verifies and makes checkpoints whose contents follow from
# their step (checkpoint_writer.cpp says how), for the script tests.
add_executable(checkpoint_writer support/checkpoint_writer.cpp)
target_link_libraries(checkpoint_writer PRIVATE hpc_train_core)

hpc_train_add_script_test(NAME test_checkpoint_kill SCRIPT test_checkpoint_kill.sh
  LABELS checkpoint TIMEOUT 150)
hpc_train_add_script_test(NAME test_export_tool SCRIPT test_export_tool.sh LABELS checkpoint
  TIMEOUT 60)
foreach(test_name test_checkpoint_kill test_export_tool)
  set_property(TEST ${test_name} APPEND PROPERTY ENVIRONMENT
    "CHECKPOINT_WRITER=$<TARGET_FILE:checkpoint_writer>")
endforeach()

# When a checkpoint is due (Note [Checkpoint clock]): the step and time rules, the reason named,
# the clock restarted at every checkpoint.
hpc_train_add_test(NAME test_checkpoint_cadence SOURCES test_checkpoint_cadence.cpp RANKS 1
  LIBS hpc_train_core LABELS checkpoint TIMEOUT 60)

# A full disk (Note [Checkpoint space] in checkpoint.h, Note [Monitors never end the run] in
# metrics.h): test_disk_full ends files part way with RLIMIT_FSIZE (a monitor's file, a checkpoint
# that HDF5 fails to write); test_disk_full_run fills small tmpfs mounts under the real program,
# monitors and checkpoints (root: skipped where mount is refused).
hpc_train_add_test(NAME test_disk_full SOURCES test_disk_full.cpp RANKS 1
  LIBS hpc_train_core hpc_train_test_support LABELS checkpoint TIMEOUT 60)
hpc_train_add_script_test(NAME test_disk_full_run SCRIPT test_disk_full_run.sh LABELS checkpoint
  TIMEOUT 400)
set_tests_properties(test_disk_full_run PROPERTIES SKIP_RETURN_CODE 77)
