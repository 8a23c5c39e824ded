# Models brought by the user: TorchScript files (--model FILE.pt) and initial weights
# (--init-weights FILE.safetensors).
# The zip reader under the TorchScript checks (torch-free, so hpc_train_core only).
hpc_train_add_test(NAME test_torchscript_file SOURCES test_torchscript_file.cpp RANKS 1
  LIBS hpc_train_core TIMEOUT 60)
# --init-weights: matching by name and shape, strict and partial loads, dtype conversion.
hpc_train_add_test(NAME test_initial_weights SOURCES test_initial_weights.cpp RANKS 1
  LIBS hpc_train_engine TIMEOUT 60)
