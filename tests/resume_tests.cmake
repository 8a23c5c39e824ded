# Checkpoints and resume with the real binary: exact continuation, preemption by a signal, and
# other world sizes (tests/test_resume.sh); bad checkpoints given to --resume (test_errors.sh).
hpc_train_add_script_test(NAME test_resume SCRIPT test_resume.sh TIMEOUT 600)
# BatchNorm buffers agree before a checkpoint (resnet18, 3 ranks, collective write).
hpc_train_add_script_test(NAME test_resume_batchnorm SCRIPT test_resume_batchnorm.sh TIMEOUT 600)
# Resume at another world size x micro-batch x accumulation continues the same samples.
hpc_train_add_script_test(NAME test_resume_reshape SCRIPT test_resume_reshape.sh TIMEOUT 300)
# Note [Scaler on resume], end to end: fp16 needs the GPU (ctest -L gpu on the GPU machine).
if(HPC_TRAIN_GPU_BUILD)
  hpc_train_add_script_test(NAME test_resume_scaler_gpu SCRIPT test_resume_scaler.sh TIMEOUT 300
                            LABELS gpu)
endif()
