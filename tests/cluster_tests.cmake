# The cluster environment, with the real software: a one-node Slurm cluster (munged, slurmctld,
# slurmd from Debian's slurm-wlm and munge) that the CTest fixture `slurm` starts before the
# tests that need it and stops after them, and the modulefiles under Debian's Lmod. Where Slurm
# or Lmod is not installed these tests are skipped (exit 77); run.sh installs both.
#
# A test that needs the cluster: FIXTURES_REQUIRED slurm, and ${HPC_TRAIN_SLURM_TEST_ENV} in its
# ENVIRONMENT; it then does `source "$HPC_TRAIN_SLURM_DIR/env.sh"` (SLURM_CONF) before sbatch.
set(HPC_TRAIN_SLURM_DIR ${CMAKE_CURRENT_BINARY_DIR}/slurm)
set(HPC_TRAIN_SLURM_TEST_ENV HPC_TRAIN_SLURM_DIR=${HPC_TRAIN_SLURM_DIR})

add_test(NAME slurm_start COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/slurm/slurm_cluster.sh start)
add_test(NAME slurm_stop COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/slurm/slurm_cluster.sh stop)
set_tests_properties(slurm_start PROPERTIES FIXTURES_SETUP slurm TIMEOUT 90
  SKIP_RETURN_CODE 77 LABELS slurm ENVIRONMENT "${HPC_TRAIN_SLURM_TEST_ENV}")
set_tests_properties(slurm_stop PROPERTIES FIXTURES_CLEANUP slurm TIMEOUT 90
  LABELS slurm ENVIRONMENT "${HPC_TRAIN_SLURM_TEST_ENV}")

# jobscripts/train_cpu.sbatch, unchanged, through sbatch --wait: 3 ranks, 600 samples, 1 epoch.
hpc_train_add_script_test(NAME test_slurm_cpu_job SCRIPT slurm/test_slurm_cpu_job.sh
  TIMEOUT 300 LABELS slurm)
set_property(TEST test_slurm_cpu_job APPEND PROPERTY ENVIRONMENT "${HPC_TRAIN_SLURM_TEST_ENV}")
set_tests_properties(test_slurm_cpu_job PROPERTIES FIXTURES_REQUIRED slurm SKIP_RETURN_CODE 77)

# jobscripts/train_lr_sweep.sbatch, unchanged, as a job array of 2 tasks (--array=0-1), 2 steps each.
hpc_train_add_script_test(NAME test_slurm_lr_sweep SCRIPT slurm/test_slurm_lr_sweep.sh
  TIMEOUT 300 LABELS slurm)
set_property(TEST test_slurm_lr_sweep APPEND PROPERTY ENVIRONMENT "${HPC_TRAIN_SLURM_TEST_ENV}")
set_tests_properties(test_slurm_lr_sweep PROPERTIES FIXTURES_REQUIRED slurm SKIP_RETURN_CODE 77)

# jobscripts/train_requeue.sbatch, unchanged, with hpc_train: USR1 -> checkpoint, exit 75 ->
# scontrol requeue -> --resume auto -> done, with the weights of an uninterrupted run.
hpc_train_add_script_test(NAME test_slurm_requeue SCRIPT slurm/test_slurm_requeue.sh
  TIMEOUT 300 LABELS slurm)
set_property(TEST test_slurm_requeue APPEND PROPERTY ENVIRONMENT "${HPC_TRAIN_SLURM_TEST_ENV}")
set_tests_properties(test_slurm_requeue PROPERTIES FIXTURES_REQUIRED slurm SKIP_RETURN_CODE 77)

# modules/: Lmod's syntax checks; module load/unload of the Lua and Tcl modulefiles and of the
# copies that `cmake --install` writes (into a prefix under the test's work directory), which
# prepend the MPI/HDF5/CUDA directories this build recorded (cmake/HpcTrainInstall.cmake).
hpc_train_add_script_test(NAME test_lmod_module SCRIPT slurm/test_lmod_module.sh
  TIMEOUT 120 LABELS modules)
string(REPLACE ";" ":" module_bin_dirs "${HPC_TRAIN_MODULE_BIN_DIRS}")
string(REPLACE ";" ":" module_lib_dirs "${HPC_TRAIN_MODULE_LIB_DIRS}")
set_property(TEST test_lmod_module APPEND PROPERTY ENVIRONMENT
  "HPC_TRAIN_BUILD_DIR=${PROJECT_BINARY_DIR};HPC_TRAIN_CMAKE=${CMAKE_COMMAND}"
  "HPC_TRAIN_MODULE_BIN_DIRS=${module_bin_dirs};HPC_TRAIN_MODULE_LIB_DIRS=${module_lib_dirs}")
set_tests_properties(test_lmod_module PROPERTIES SKIP_RETURN_CODE 77)

# Several nodes for real: node1..node3 in network and UTS namespaces of their own, joined by veth
# links on a bridge, one slurmd each, slurmctld and munged on `head` (tests/slurm/netns_cluster.sh).
# The fixture `netns_cluster` starts it once for the tests that need it and removes every
# namespace, link and process after them, also when one fails. Skipped (77) where Slurm is not
# installed or namespaces cannot be made (not root).
set(HPC_TRAIN_CLUSTER_DIR ${CMAKE_CURRENT_BINARY_DIR}/netns-cluster)
set(HPC_TRAIN_CLUSTER_TEST_ENV HPC_TRAIN_CLUSTER_DIR=${HPC_TRAIN_CLUSTER_DIR})
add_test(NAME netns_cluster_start
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/slurm/netns_cluster.sh start)
add_test(NAME netns_cluster_stop
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/slurm/netns_cluster.sh stop)
set_tests_properties(netns_cluster_start PROPERTIES FIXTURES_SETUP netns_cluster TIMEOUT 120
  SKIP_RETURN_CODE 77 LABELS cluster ENVIRONMENT "${HPC_TRAIN_CLUSTER_TEST_ENV}")
set_tests_properties(netns_cluster_stop PROPERTIES FIXTURES_CLEANUP netns_cluster TIMEOUT 120
  LABELS cluster ENVIRONMENT "${HPC_TRAIN_CLUSTER_TEST_ENV}")

# hpc_train_add_cluster_test(NAME name SCRIPT file TIMEOUT s): a script test on that cluster.
# One at a time (RESOURCE_LOCK), also under ctest -j: one of them takes a node down.
function(hpc_train_add_cluster_test)
  cmake_parse_arguments(T "" "NAME;SCRIPT;TIMEOUT" "" ${ARGN})
  hpc_train_add_script_test(NAME ${T_NAME} SCRIPT ${T_SCRIPT} TIMEOUT ${T_TIMEOUT} LABELS cluster)
  set_property(TEST ${T_NAME} APPEND PROPERTY ENVIRONMENT "${HPC_TRAIN_CLUSTER_TEST_ENV}")
  set_tests_properties(${T_NAME} PROPERTIES FIXTURES_REQUIRED netns_cluster SKIP_RETURN_CODE 77
                                            RESOURCE_LOCK netns_cluster)
endfunction()

# train_multinode.sbatch on 3 nodes (mpirun, and srun --mpi=pmix), hpc_train_submit --nodes 3,
# mpirun -H node1,node2,node3 and 3 ranks on one node: the same weights bit for bit; bytes
# counted on the links.
hpc_train_add_cluster_test(NAME test_cluster_multinode SCRIPT slurm/test_cluster_multinode.sh
  TIMEOUT 600)
set_property(TEST test_cluster_multinode APPEND PROPERTY ENVIRONMENT
  "HPC_TRAIN_SUBMIT=${PROJECT_BINARY_DIR}/hpc_train_submit")

# train_elastic.sbatch (sbatch --no-kill, hpc_train_elastic) on 3 nodes; node3 killed, then cut
# off, mid-run: each time the job finishes on node1 and node2 from the newest checkpoint.
hpc_train_add_cluster_test(NAME test_cluster_node_loss SCRIPT slurm/test_cluster_node_loss.sh
  TIMEOUT 900)
set_property(TEST test_cluster_node_loss APPEND PROPERTY ENVIRONMENT
  "HPC_TRAIN_ELASTIC=${PROJECT_BINARY_DIR}/hpc_train_elastic")

# hpc_train_elastic without Slurm (--hosts): restarts after a node that mpirun cannot reach, and
# not after a failure of the program's own or below --min-nodes; its usage errors.
hpc_train_add_script_test(NAME test_elastic_supervisor SCRIPT test_elastic_supervisor.sh
  TIMEOUT 180)
set_property(TEST test_elastic_supervisor APPEND PROPERTY ENVIRONMENT
  "HPC_TRAIN_ELASTIC=${PROJECT_BINARY_DIR}/hpc_train_elastic")
