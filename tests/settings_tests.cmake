# Settings beyond the command line: the DeepSpeed ds_config.json importer, the fp16 loss scaler
# and the learning-rate schedules. Pure functions, one rank, no LibTorch.
hpc_train_add_test(NAME test_deepspeed_config SOURCES test_deepspeed_config.cpp RANKS 1
                   LIBS hpc_train_core TIMEOUT 60 LABELS config)
# The importer's tests read the example files in configs/ (the origin's ds_config at 1-3 ranks).
target_compile_definitions(test_deepspeed_config PRIVATE
  HPC_TRAIN_CONFIGS_DIR="${PROJECT_SOURCE_DIR}/configs")
hpc_train_add_test(NAME test_loss_scaler SOURCES test_loss_scaler.cpp RANKS 1
                   LIBS hpc_train_core TIMEOUT 60 LABELS config)
hpc_train_add_test(NAME test_lr_schedule SOURCES test_lr_schedule.cpp RANKS 1
                   LIBS hpc_train_core TIMEOUT 60 LABELS config)
