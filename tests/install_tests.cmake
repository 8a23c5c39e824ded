# Installation and packaging: `cmake --install` into a prefix of the test's own and the installed
# programs from an empty environment; the Spack recipe against the find_package calls.

# Installs (jobs scripts, configs, Lmod and Tcl modulefiles), then runs the installed programs
# through env -i: --version, a 256-sample conversion and 2 training steps under mpirun -np 1.
hpc_train_add_script_test(NAME test_install SCRIPT test_install.sh TIMEOUT 180 LABELS install)
set_property(TEST test_install APPEND PROPERTY ENVIRONMENT
  "HPC_TRAIN_BUILD_DIR=${PROJECT_BINARY_DIR};HPC_TRAIN_CMAKE=${CMAKE_COMMAND}")

# packaging/spack/hpc-train/package.py: parses (Python's ast; Spack is not needed), and its
# depends_on list matches the find_package calls of CMakeLists.txt and cmake/*.cmake.
find_program(HPC_TRAIN_PYTHON3 python3)
if(HPC_TRAIN_PYTHON3)
  add_test(NAME test_spack_recipe
    COMMAND ${HPC_TRAIN_PYTHON3} ${CMAKE_CURRENT_SOURCE_DIR}/test_spack_recipe.py
            ${PROJECT_SOURCE_DIR})
  set_tests_properties(test_spack_recipe PROPERTIES TIMEOUT 30 LABELS packaging)
endif()
