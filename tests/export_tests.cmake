# Weights export: the safetensors writer and reader (torch-free, so hpc_train_core only).
hpc_train_add_test(NAME test_safetensors SOURCES test_safetensors.cpp RANKS 1 LIBS hpc_train_core
  TIMEOUT 60)
