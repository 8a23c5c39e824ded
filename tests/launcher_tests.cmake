# hpc_train_submit (src/tools/hpc_train_submit, copied into the build tree): the Slurm batch
# script it writes, run with stand-ins for mpirun, module, scontrol and sbatch; DeepSpeed
# hostfiles; a real run from a hostfile; a real submission to the test cluster.
set(HPC_TRAIN_SUBMIT_ENV HPC_TRAIN_SUBMIT=${PROJECT_BINARY_DIR}/hpc_train_submit)

hpc_train_add_script_test(NAME test_submit_script SCRIPT test_submit_script.sh TIMEOUT 60
  LABELS launcher)
hpc_train_add_script_test(NAME test_submit_hostfile SCRIPT test_submit_hostfile.sh TIMEOUT 60
  LABELS launcher)
# 3 ranks from "localhost slots=3", the real hpc_train, 600 samples, one epoch.
hpc_train_add_script_test(NAME test_submit_hostfile_run SCRIPT test_submit_hostfile_run.sh
  TIMEOUT 300 LABELS launcher)
# hpc_train_submit --cpu --nodes 1 --ntasks-per-node 3 through the test cluster's sbatch.
hpc_train_add_script_test(NAME test_slurm_submit SCRIPT slurm/test_slurm_submit.sh
  TIMEOUT 300 LABELS launcher slurm)
set_property(TEST test_slurm_submit APPEND PROPERTY ENVIRONMENT "${HPC_TRAIN_SLURM_TEST_ENV}")
set_tests_properties(test_slurm_submit PROPERTIES FIXTURES_REQUIRED slurm SKIP_RETURN_CODE 77)

foreach(test IN ITEMS test_submit_script test_submit_hostfile test_submit_hostfile_run
                      test_slurm_submit)
  set_property(TEST ${test} APPEND PROPERTY ENVIRONMENT "${HPC_TRAIN_SUBMIT_ENV}")
endforeach()
