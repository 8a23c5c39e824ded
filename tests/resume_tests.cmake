# Checkpoints and resume with the real binary: exact continuation, preemption by a signal, and
# other world sizes (tests/test_resume.sh); bad checkpoints given to --resume (test_errors.sh).
hpc_train_add_script_test(NAME test_resume SCRIPT test_resume.sh TIMEOUT 600)
