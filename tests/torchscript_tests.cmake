# Models brought by the user: TorchScript files (--model FILE.pt) and initial weights
# (--init-weights FILE.safetensors).
# The zip reader under the TorchScript checks (torch-free, so hpc_train_core only).
hpc_train_add_test(NAME test_torchscript_file SOURCES test_torchscript_file.cpp RANKS 1
  LIBS hpc_train_core TIMEOUT 60)
