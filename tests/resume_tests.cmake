# Checkpoints and resume with the real binary: exact continuation, preemption by a signal, and
# other world sizes (tests/test_resume.sh); bad checkpoints given to --resume (test_errors.sh).
hpc_train_add_script_test(NAME test_resume SCRIPT test_resume.sh TIMEOUT 600)
# BatchNorm buffers agree before a checkpoint (resnet18, 3 ranks, collective write).
hpc_train_add_script_test(NAME test_resume_batchnorm SCRIPT test_resume_batchnorm.sh TIMEOUT 600)
# Note [Checkpoint branches]: --resume auto follows a branch resumed by hand; the abandoned
# checkpoints are moved aside, not deleted, and pruning spares the new branch.
hpc_train_add_script_test(NAME test_resume_branch SCRIPT test_resume_branch.sh TIMEOUT 300)
# Resume at another world size x micro-batch x accumulation continues the same samples.
hpc_train_add_script_test(NAME test_resume_reshape SCRIPT test_resume_reshape.sh TIMEOUT 300)
# Note [Scaler on resume], end to end: fp16 needs the GPU (ctest -L gpu on the GPU machine).
if(HPC_TRAIN_GPU_BUILD)
  hpc_train_add_script_test(NAME test_resume_scaler_gpu SCRIPT test_resume_scaler.sh TIMEOUT 300
                            LABELS gpu)
  # Note [Random state in checkpoints]: dropout on the GPU continues its masks across a resume,
  # after eager steps and after graph replays (vgg11_bn).
  hpc_train_add_script_test(NAME test_resume_dropout_gpu SCRIPT test_resume_dropout.sh
                            TIMEOUT 600 LABELS gpu)
endif()
# --checkpoint-every-minutes: checkpoints where rank 0's clock says, every rank following (the
# files complete, the run bitwise unchanged, a mid-epoch one resumable), none but the epoch
# ends' with a longer interval, a negative or NaN interval refused before training.
hpc_train_add_script_test(NAME test_checkpoint_minutes SCRIPT test_checkpoint_minutes.sh
                          TIMEOUT 600)
# A restart at a smaller world size keeps the run directory's one history: the resume record,
# TensorBoard's SessionLog START, hpc_train_report's single history (skipped where no python3
# has google.protobuf and matplotlib).
hpc_train_add_script_test(NAME test_resume_history SCRIPT test_resume_history.sh TIMEOUT 400)
set_tests_properties(test_resume_history PROPERTIES SKIP_RETURN_CODE 77)
set_property(TEST test_resume_history APPEND PROPERTY ENVIRONMENT
             "HPC_TRAIN_REPORT=${PROJECT_BINARY_DIR}/hpc_train_report")
