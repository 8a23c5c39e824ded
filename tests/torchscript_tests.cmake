# Models brought by the user: TorchScript files (--model FILE.pt) and initial weights
# (--init-weights FILE.safetensors).
# The zip reader under the TorchScript checks (torch-free, so hpc_train_core only).
hpc_train_add_test(NAME test_torchscript_file SOURCES test_torchscript_file.cpp RANKS 1
  LIBS hpc_train_core TIMEOUT 60)
# --init-weights: matching by name and shape, strict and partial loads, dtype conversion.
hpc_train_add_test(NAME test_initial_weights SOURCES test_initial_weights.cpp RANKS 1
  LIBS hpc_train_engine TIMEOUT 60)
# Modules scripted by Debian's python3-torch, trained, resumed and refused end to end
# (tests/test_torchscript.sh says what); initial weights from PyTorch state_dicts.
hpc_train_add_script_test(NAME test_torchscript SCRIPT test_torchscript.sh TIMEOUT 600)
# A module with a parameter that no gradient reaches is refused before training, naming it, at 1
# and 3 ranks, within the timeout (Note [Unused parameters] in src/model/scripted_model.cpp).
hpc_train_add_script_test(NAME test_torchscript_unused SCRIPT test_torchscript_unused.sh
  TIMEOUT 300)
# A scripted resnet18 trains with graph replays, in fp32, bf16 and fp16, and starts where the
# built-in one does from the same --init-weights (ctest -L gpu on the GPU machine; its Python's
# torch scripts the module).
if(HPC_TRAIN_GPU_BUILD)
  hpc_train_add_script_test(NAME test_torchscript_gpu SCRIPT test_torchscript_gpu.sh TIMEOUT 600
                            LABELS gpu)
endif()
# The training recipes (SGD + Nesterov, schedules) against PyTorch's own optimizers and
# schedulers on a scripted model, and their state across a resume (tests/test_recipes.sh).
hpc_train_add_script_test(NAME test_recipes SCRIPT test_recipes.sh TIMEOUT 600)
