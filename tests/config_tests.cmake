# Config: command line, INI file, validation and the INI writer. Pure functions, one rank.
hpc_train_add_test(NAME test_config SOURCES test_config.cpp RANKS 1 LIBS hpc_train_core
                   LABELS config TIMEOUT 60)
# The choices' name tables (config_choices.h).
hpc_train_add_test(NAME test_config_choices SOURCES test_config_choices.cpp RANKS 1
                   LIBS hpc_train_core LABELS config TIMEOUT 60)
# The LR schedule's memory does not grow with the run's length (CPU here; on the GPU, where the
# fused step once kept a table of every step's lr, under the label gpu).
hpc_train_add_script_test(NAME test_long_schedule SCRIPT test_long_schedule.sh TIMEOUT 150)
if(HPC_TRAIN_GPU_BUILD)
  hpc_train_add_script_test(NAME test_long_schedule_gpu SCRIPT test_long_schedule.sh TIMEOUT 150
                            LABELS gpu)
endif()
